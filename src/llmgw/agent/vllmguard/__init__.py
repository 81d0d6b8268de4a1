"""The ASGI guard the agent loads into vLLM (llmgw_vllm_guard.py); GUARD_DIR goes on PYTHONPATH."""

from pathlib import Path

GUARD_DIR = Path(__file__).resolve().parent
GUARD_MIDDLEWARE = "llmgw_vllm_guard.Guard"
