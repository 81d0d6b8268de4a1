"""What every handler shares about its client's connection (app.py, batch.py, debug.py):
content types, a gone client, a header's value as text that JSON can carry."""

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


def header_text(value: str) -> str:
    """A request header's value as text any encoder takes. aiohttp keeps the bytes of a
    header that are not UTF-8 as lone surrogates, which JSON cannot encode: kept as they
    came, a `traceparent` of such bytes made every later `/sim/state` a 500, and an
    `x-request-id` one its request a 500. They are written as Python escapes them
    (`\\xff`), the same in every place a header is recorded."""
    if value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
