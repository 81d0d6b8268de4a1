"""An HTTP answer read whole within a deadline and a size bound (the urllib transport's).

urllib's `timeout` bounds each socket operation, not the answer: a server that
sends a byte every few seconds (its head or its body) keeps every read short and
the answer unfinished forever, and an endless chunked body is read into memory
until the machine runs out. Neither is a controller; both are what a squatter on
the port, a broken proxy or a stalled tunnel can send. So:

- `opener(deadline=…)` connects through `_DeadlineSocket`, whose reads each wait
  at most until the deadline (`AnswerDeadline`, a TimeoutError, past it), from the
  status line to the body's last byte;
- `read_body(resp, limit=…)` reads the body in pieces and stops past `limit`
  (`AnswerTooLarge`).

The TCP connect and the TLS handshake are bounded only by urllib's own timeout.
"""

from __future__ import annotations

import functools
import http.client
import io
import socket
import time
import urllib.request
from typing import Any, Protocol


class AnswerDeadline(TimeoutError):
    """The answer was not whole by the deadline, though bytes kept coming."""


class AnswerTooLarge(Exception):
    """The answer's body is larger than the bound."""


class _Readable(Protocol):
    def read(self, amt: int, /) -> bytes: ...


class _DeadlineIO(io.RawIOBase):
    """A socket's read side whose every read waits at most until the deadline."""

    def __init__(self, sock: socket.socket, raw: io.RawIOBase, deadline: float) -> None:
        self._sock = sock
        self._raw = raw
        self._deadline = deadline
        self._timeout_s = sock.gettimeout()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        left_s = self._deadline - time.monotonic()
        if left_s <= 0:
            raise AnswerDeadline
        # Per read: a single recv may not outlast the deadline either.
        self._sock.settimeout(left_s if self._timeout_s is None else min(self._timeout_s, left_s))
        try:
            return self._raw.readinto(buffer)
        except TimeoutError as exc:
            if time.monotonic() >= self._deadline:
                raise AnswerDeadline from exc
            raise  # no byte for urllib's own timeout: the caller says so

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineSocket:
    """The connection's socket, as http.client uses it, with reads that keep a deadline.

    http.client sends through it and reads the answer through `makefile("rb")`;
    everything else goes to the socket itself.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str = "r", *args: object, **kwargs: object) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"only binary reads are bounded, not {mode!r}")
        # A SocketIO holds the socket open until it closes itself, as http.client expects.
        raw = self._sock.makefile("rb", buffering=0)
        return io.BufferedReader(_DeadlineIO(self._sock, raw, self._deadline))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _HTTP(http.client.HTTPConnection):
    def __init__(self, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self._deadline)


class _HTTPS(http.client.HTTPSConnection):
    def __init__(self, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()  # TLS included: the wrapped socket is what gets the deadline
        self.sock = _DeadlineSocket(self.sock, self._deadline)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HTTP, deadline=self._deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        # No context given: HTTPSConnection's default, as urllib's own handler uses.
        return self.do_open(functools.partial(_HTTPS, deadline=self._deadline), req)


def opener(*handlers: urllib.request.BaseHandler, deadline: float) -> urllib.request.OpenerDirector:
    """urllib's opener with `handlers`, whose answers must be whole by `deadline`
    (time.monotonic())."""
    return urllib.request.build_opener(*handlers, _HTTPHandler(deadline), _HTTPSHandler(deadline))


def read_body(resp: _Readable, *, limit: int) -> bytes:
    """The whole body, or AnswerTooLarge as soon as it is past `limit` bytes."""
    body = bytearray()
    while piece := resp.read(1 << 20):
        body += piece
        if len(body) > limit:
            raise AnswerTooLarge
    # read(amt) ends quietly where the connection did; read() would have raised for
    # an answer shorter than its Content-Length, and so must this.
    missing = getattr(resp, "length", None)
    if isinstance(missing, int) and missing > 0:
        raise http.client.IncompleteRead(bytes(body), missing)
    return bytes(body)
