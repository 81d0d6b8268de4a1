"""The router's whole answer, `Whole`: a status, its header lines, a body.

Every answer a handler gives the server is a `Whole` or a stream it opened
(`Stream`, connection.py). A `Whole` holds its headers already written as
lines (each ending in CRLF, Content-Type among them, none the server owns:
Content-Length, Connection, Date, Transfer-Encoding), so the server writes its
head as one join. Two ways to make one:

- `whole(status, body, headers)` from a mapping of headers (the router's own
  answers: errors, health, metrics, a relayed answer with debug headers);
- `Whole(status, body, lines)` from lines the caller keeps: the proxy's relayed
  answer, whose lines do not change from one answer to the next (per endpoint
  and content type), so its head is a join, not a pass over a dict.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from llmgw.router.http.heads import fields

JSON: Final = "application/json"
JSON_UTF8: Final = "application/json; charset=utf-8"
# What a body without a declared type is (RFC 9110 8.3: the recipient may assume it).
OCTETS: Final = b"Content-Type: application/octet-stream\r\n"


class Whole:
    """A whole answer: `status`, `lines` (the header lines, CRLF-ended), `body`.

    `close`: the connection closes after it (a refusal whose body was not read:
    reading it off would be the very work refused).
    """

    __slots__ = ("body", "close", "lines", "status")

    def __init__(self, status: int, body: bytes, lines: bytes, *, close: bool = False) -> None:
        self.status = status
        self.body = body
        self.lines = lines
        self.close = close

    def header(self, name: str) -> str | None:
        """The value of header `name` (any case), None when absent: for readers off
        the request path (tests, logs); the server writes `lines` as they are."""
        want = name.lower()
        for line in self.lines.decode("utf-8", "surrogateescape").split("\r\n"):
            key, sep, value = line.partition(": ")
            if sep and key.lower() == want:
                return value
        return None

    def with_header(self, name: str, value: str) -> Whole:
        """The same answer with header `name` set to `value` (any line of that name
        replaced): the request id of a refusal."""
        line = f"{name}: {value}\r\n".encode("utf-8", "surrogateescape")
        return Whole(self.status, self.body, self._without(name) + line, close=self.close)

    def with_content_type(self, body: bytes, content_type: str) -> Whole:
        """The same answer with another body of another type (an error reshaped)."""
        typed = f"Content-Type: {content_type}\r\n".encode("ascii")
        return Whole(self.status, body, typed + self._without("content-type"), close=self.close)

    def _without(self, name: str) -> bytes:
        """The lines less those of header `name` (any case)."""
        prefix = name.lower().encode("ascii") + b":"
        kept = [
            line
            for line in self.lines.split(b"\r\n")
            if line and not line.lower().startswith(prefix)
        ]
        return b"".join(line + b"\r\n" for line in kept)


def whole(
    status: int,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    *,
    content_type: str | None = None,
) -> Whole:
    """A whole answer from a mapping of headers; `content_type` adds (or replaces) its
    Content-Type, and without one either way the body is application/octet-stream."""
    lines = b"" if headers is None else fields(headers)
    if content_type is not None:
        if headers is not None and _typed(headers):
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
            lines = fields(headers)
        lines += f"Content-Type: {content_type}\r\n".encode("ascii")
    elif headers is None or not _typed(headers):
        lines += OCTETS
    return Whole(status, body, lines)


def json_whole(obj: Any, *, status: int = 200) -> Whole:
    """`obj` as a JSON answer, written as the standard library writes it (as aiohttp's
    `json_response` did, its charset named)."""
    return whole(status, json.dumps(obj).encode("utf-8"), content_type=JSON_UTF8)


def _typed(headers: Mapping[str, str]) -> bool:
    return any(name.lower() == "content-type" for name in headers)
