"""llmgw ctl."""
