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

The bytes of engines' whole answers a router process holds are counted against
one bound (`HeldAnswers`); a large answer handed to the server carries its
charge (`Hold`), which its connection gives back once the transport has let the
bytes go.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from llmgw.router.http.heads import fields

JSON: Final = "application/json"
JSON_UTF8: Final = "application/json; charset=utf-8"
# A held answer larger than this goes to the server with its charge (`Hold`), which
# the client's transport may keep past the handler; a smaller one's is given back as
# the handler returns: the socket's buffer takes it, and a Hold would cost each answer
# an object.
HAND_OVER_BYTES: Final = 64 * 1024
# What a body without a declared type is (RFC 9110 8.3: the recipient may assume it).
OCTETS: Final = b"Content-Type: application/octet-stream\r\n"


class HeldAnswers:
    """The bytes of engines' whole answers one router process holds, and their bound.

    Each answer is held up to max_answer_bytes (request/unbuffered.py); ten at once
    were ten times that, and a client that did not read kept its answer in the
    transport's buffer. So all of them together stay within `limit_bytes`: an answer
    whose next bytes would pass it is relayed as it arrives instead, never refused.
    Bytes are charged as they are read and given back once, by whoever holds them
    last: the attempt that read them (request/attempts.py), the request that kept
    them while it retried elsewhere (an error answer, `Attempts.kept`), or the
    connection that wrote them (`Hold`), once its transport has let them go.
    """

    __slots__ = ("held_bytes", "limit_bytes")

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes  # this process's share of max_held_answer_bytes
        self.held_bytes = 0


class Hold:
    """`n_bytes` of one answer, charged to `answers` until `release` (once: it zeroes)."""

    __slots__ = ("answers", "n_bytes")

    def __init__(self, answers: HeldAnswers, n_bytes: int) -> None:
        self.answers = answers
        self.n_bytes = n_bytes

    def release(self) -> None:
        self.answers.held_bytes -= self.n_bytes
        self.n_bytes = 0


class Whole:
    """A whole answer: `status`, `lines` (the header lines, CRLF-ended), `body`.

    `close`: the connection closes after it (a refusal whose body was not read:
    reading it off would be the very work refused). `hold`: its body's charge to
    the held answers' bound, given back by the connection that writes it (None:
    none, or given back already).
    """

    __slots__ = ("body", "close", "hold", "lines", "status")

    def __init__(
        self,
        status: int,
        body: bytes,
        lines: bytes,
        *,
        close: bool = False,
        hold: Hold | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.lines = lines
        self.close = close
        self.hold = hold

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
        lines = self._without(name) + line
        return Whole(self.status, self.body, lines, close=self.close, hold=self.hold)

    def with_content_type(self, body: bytes, content_type: str) -> Whole:
        """The same answer with another body of another type (an error reshaped)."""
        typed = f"Content-Type: {content_type}\r\n".encode("ascii")
        lines = typed + self._without("content-type")
        return Whole(self.status, body, lines, close=self.close, hold=self.hold)

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
