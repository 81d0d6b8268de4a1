"""llmgw controller."""
