"""What every generation handler shares about its client's connection (app.py, batch.py)."""

from __future__ import annotations

from aiohttp import web

JSON = "application/json"
DEAD = "The engine loop failed; this engine is dead and will restart."
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
DISCONNECT_POLL_S = 0.5  # how often a silent request checks that its client is still there


def gone(request: web.Request) -> bool:
    """Whether the client has left."""
    t = request.transport
    return t is None or t.is_closing()
