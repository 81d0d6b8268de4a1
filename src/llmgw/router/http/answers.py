"""The router's whole answers that are not aiohttp's `web.Response`: `Reply`, `Prerendered`."""

from __future__ import annotations


class Reply:
    """A whole answer without aiohttp's `web.Response`: status, body and headers, as
    the router's proxy relays an engine's answer under this server. Building a
    `web.Response` (its header multidict, its content-type parsing) and reading it
    back cost about as much as the rest of writing the answer."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers


class Prerendered:
    """A whole answer whose header lines the handler has written itself: `lines`, each
    ending in CRLF, Content-Type among them, none the server owns (Content-Length,
    Connection, Date, Transfer-Encoding). The router's proxy keeps the lines that do
    not change from one answer to the next (per endpoint and content type), so an
    answer's head is a join, not a pass over a dict of headers (about 5,000
    instructions a request: bench/router_overhead.py --instructions)."""

    __slots__ = ("body", "lines", "status")

    def __init__(self, status: int, body: bytes, lines: bytes) -> None:
        self.status = status
        self.body = body
        self.lines = lines
