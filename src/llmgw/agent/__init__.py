"""llmgw agent."""
