"""llmgw simengine."""
