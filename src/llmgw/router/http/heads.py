"""The heads of the router's answers: status lines, header lines, Date.

Each piece is formatted once and kept (every standard status's line, whether a
header name is one the server writes itself, the Date of this second): the
server writes thousands of heads a second from a handful of distinct parts.
"""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Final

# Headers the server writes itself; a handler's own are dropped.
_OWN: Final = frozenset({"content-length", "transfer-encoding", "connection", "date"})


class _Date:
    """The Date header's value, formatted once a second."""

    __slots__ = ("line", "second")

    def __init__(self) -> None:
        self.second = -1
        self.line = b""

    def get(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.line = f"Date: {formatdate(now, usegmt=True)}\r\n".encode("ascii")
        return self.line


DATE: Final = _Date()
# Every standard status's line, written once at import: a table, not a cache.
_STATUS: Final[dict[int, bytes]] = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode("latin-1") for s in HTTPStatus
}


def status_line(status: int, reason: str | None) -> bytes:
    """`HTTP/1.1 <status> <reason>` and CRLF; the standard phrase when `reason` is None
    (none for a code HTTP does not define)."""
    if reason is None:
        line = _STATUS.get(status)
        if line is not None:
            return line
        reason = ""
    return f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")


# Header name → whether the server writes it itself (`_OWN`, any case): names come from
# a small set, so one dict hit instead of a lower() and a set lookup per header.
_IS_OWN: Final[dict[str, bool]] = {}


def _is_own(name: str) -> bool:
    """`name` not yet in `_IS_OWN`: looked at, and remembered."""
    if len(_IS_OWN) >= 1024:
        _IS_OWN.clear()
    own = _IS_OWN[name] = name.lower() in _OWN
    return own


def head(status: int, reason: str | None, headers: Any, tail: bytes) -> bytes:
    """Status line, the handler's headers (less those the server owns), Date, `tail`."""
    return b"".join((status_line(status, reason), fields(headers), DATE.get(), tail))


def fields(headers: Any) -> bytes:
    """The handler's headers as lines, less those the server writes itself."""
    # The pieces of every line, joined once: an f-string per line cost more than the
    # join of all of them (mypyc builds each f-string by a generic routine).
    lines: list[str] = []
    if type(headers) is dict:
        # The proxy's answers (a plain dict): compiled, iterated without the generic
        # iterator and tuple unpacking a Mapping takes.
        plain: dict[str, str] = headers
        for name, value in plain.items():
            own = _IS_OWN.get(name)
            if not (_is_own(name) if own is None else own):
                lines += (name, ": ", value, "\r\n")
    else:
        for name, value in headers.items():
            own = _IS_OWN.get(name)
            if not (_is_own(name) if own is None else own):
                lines += (name, ": ", str(value), "\r\n")
    # As aiohttp writes them, and reads them: a header echoed back (x-request-id) goes
    # out as the bytes that came in. One encode for all of them.
    return "".join(lines).encode("utf-8", "surrogateescape")
