"""llmgw up: the whole system on one machine."""
