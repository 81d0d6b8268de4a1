"""llmgw: many LLMs on a GPU fleet behind one OpenAI-compatible endpoint.

Programs (router, controller, agent, simengine, ctl) share only `wire` (the
types that cross process boundaries) and `runtime` (serve, clock, logging).
"""

__version__ = "0.1.0"
