"""llmgw router."""
