"""A protocol-level HTTP/1.1 server: httptools (llhttp) parsing, prebuilt answer heads.

The same pattern as the router's upstream client (router/upstream/fast.py), on
the serving side: one `asyncio.Protocol` per connection, no aiohttp
RequestHandler, BaseRequest, StreamWriter, URL dispatcher or middleware chain
per request. The program gives a `Dispatch`: an async function of a
`FastRequest` that answers with an aiohttp `web.Response` (written here in one
`write`) or a `FastStream` it opened itself (an event stream, relayed as it
comes, chunked).

It keeps what `httpserver.EdgeHandler` gives aiohttp's server, with the same
`Edge` (limits, the connection count and the canned answers):

- a request the parser refuses (bad framing, a line over `max_line_bytes`, more
  than `max_headers` headers, smuggling attempts such as Content-Length with
  Transfer-Encoding) is a 400 with the program's JSON error body, one log
  line, and the connection closed;
- a head must arrive within `header_timeout_s` of its first byte (else 408),
  a connection with no request for `idle_timeout_s` is closed, and past
  `max_connections` a new one is answered 503 at once;
- keep-alive and pipelining (requests answered in order, one at a time; reading
  stops at a pipelined head until its turn, and the next answer waits until the
  last has drained), chunked request bodies, `Expect: 100-continue`, HEAD;
- a body larger than `max_body_bytes` makes `read()` raise aiohttp's
  HTTPRequestEntityTooLarge and a broken one RequestPayloadError, as aiohttp's
  request does; a client that disconnects cancels its handler.

What differs: a client that takes none of an answer for `idle_timeout_s` while
more is to be sent is closed (aiohttp waits on it for ever); a request body the
handler did not read closes the connection after the answer (aiohttp reads it
off for up to two seconds); request bodies are never decompressed (the router
does not want them to be); an `Upgrade` header is ignored (the request is served
as HTTP/1.1), CONNECT refused (400).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Final, cast
from urllib.parse import unquote, urlsplit

import httptools
from aiohttp import web
from multidict import CIMultiDict

from llmgw.runtime.httpserver import Edge, _one_line, _without_echo
from llmgw.runtime.logs import kv
from llmgw.runtime.peers import Peer

log: Final = logging.getLogger(__name__)

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


_date: Final = _Date()
_STATUS: Final[dict[int, bytes]] = {}


# Status → its standard phrase ("" for a code HTTPStatus does not know).
_PHRASES: Final[dict[int, str]] = {}


def _phrase(status: int) -> str:
    """The status's standard phrase, looked up once per status (HTTPStatus(status) is an
    enum lookup by value: too slow for every answer)."""
    phrase = _PHRASES.get(status)
    if phrase is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        _PHRASES[status] = phrase
    return phrase


def _status_line(status: int, reason: str | None) -> bytes:
    if reason is None:
        line = _STATUS.get(status)
        if line is None:
            line = _STATUS[status] = f"HTTP/1.1 {status} {_phrase(status)}\r\n".encode("latin-1")
        return line
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


def _head(status: int, reason: str | None, headers: Any, tail: bytes) -> bytes:
    """Status line, the handler's headers (less those the server owns), Date, `tail`."""
    return b"".join((_status_line(status, reason), _fields(headers), _date.get(), tail))


def _fields(headers: Any) -> bytes:
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


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _HeadError(Exception):
    """A head the server refuses before parsing further (its message is the 400's)."""


class FastRequest:
    """What a handler sees of one request: aiohttp's request attributes the handlers use.

    `headers` is a case-insensitive multidict (multidict's, as aiohttp's);
    `read()` waits for the whole body.
    """

    __slots__ = (
        "_chunks",
        "_conn",
        "_error",
        "_more",
        "_waiter",
        "app",
        "complete",
        "content_length",
        "expect",
        "headers",
        "keep_alive",
        "match_info",
        "method",
        "path",
        "peer",
        "raw_path",
        "remote",
        "size",
        "too_large",
        "version",
    )

    def __init__(
        self,
        conn: FastProtocol,
        method: str,
        raw_path: str,
        headers: CIMultiDict[str],
        keep_alive: bool,
        version: str,
    ) -> None:
        self._conn = conn
        self.app = conn.server.app
        self.method = method
        self.raw_path = raw_path
        if not raw_path.startswith("/"):
            # The absolute form (`POST http://host/v1/...`), or `*`.
            raw_path = urlsplit(raw_path).path or raw_path
        path = raw_path.partition("?")[0]
        self.path = unquote(path) if "%" in path else path
        self.headers = headers
        self.keep_alive = keep_alive
        self.version = version
        self.remote = conn.remote
        # The client address's tally (runtime/peers.py), shared by its connections.
        self.peer = conn.peer
        self.match_info: dict[str, str] = {}
        cl = headers.get("Content-Length")
        # The parser has checked it is one plain number.
        self.content_length = None if cl is None else int(cl)
        self.expect = headers.get("Expect")
        self.complete = False
        self.too_large = False
        self.size = 0
        self._chunks: list[bytes] = []
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        # `wait_more`'s: set by the next body bytes, not only by the body's end.
        self._more: asyncio.Future[None] | None = None

    async def wait_more(self, *, timeout_s: float) -> None:
        """Wait for more of the body (or its end, or a failure), at most `timeout_s`.

        For a reader that counts a body as it arrives (the router's intake: a budget
        charged by bytes in, a minimum rate) instead of waiting for all of it.
        """
        if self.complete or self.too_large or self._error is not None:
            return
        self._conn.resume_for(self)
        more = self._more = self._conn.loop.create_future()
        timer = self._conn.loop.call_later(timeout_s, _settle, more)
        try:
            await more
        finally:
            timer.cancel()
            self._more = None

    def ended(self) -> bool:
        """Whether the body is all in, over the limit, or broken: `read()` will not wait."""
        return self.complete or self.too_large or self._error is not None

    async def read(self) -> bytes:
        """The whole body.

        HTTPRequestEntityTooLarge past the limit, RequestPayloadError if its framing broke.
        """
        if not (self.complete or self.too_large or self._error is not None):
            self._conn.resume_for(self)
            waiter = self._waiter = self._conn.loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        if self._error is not None:
            raise web.RequestPayloadError(str(self._error))
        if self.too_large:
            limit = self._conn.server.max_body_bytes
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=self.size)
        chunks = self._chunks
        if len(chunks) == 1:
            return chunks[0]
        body = b"".join(chunks)
        self._chunks = [body]
        return body

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self._more is not None:
            _settle(self._more)

    def _feed(self, data: bytes) -> None:
        if self.too_large:
            return
        self.size += len(data)
        if self.size > self._conn.server.max_body_bytes:
            self.too_large = True
            self._chunks.clear()
            self._wake()
            return
        self._chunks.append(data)
        if self._more is not None:
            _settle(self._more)

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        self._wake()

    def stream(self, status: int, headers: dict[str, str]) -> FastStream:
        """Send the head of a streamed answer now; its body follows with `write`."""
        return FastStream(self._conn, self, status, headers)


class FastStream:
    """A streamed answer (chunked on HTTP/1.1; on 1.0 the close ends it)."""

    __slots__ = ("_conn", "_eof", "_req", "chunked", "keep_alive", "status")

    def __init__(
        self, conn: FastProtocol, req: FastRequest, status: int, headers: dict[str, str]
    ) -> None:
        self._conn = conn
        self._req = req
        self.status = status
        self.chunked = req.version == "1.1"
        self.keep_alive = self.chunked and req.keep_alive
        self._eof = False
        if self.chunked:
            tail = b"Transfer-Encoding: chunked\r\n"
            tail += b"\r\n" if self.keep_alive else b"Connection: close\r\n\r\n"
        else:
            tail = b"Connection: close\r\n\r\n"
        conn.started = True
        conn.send(_head(status, None, headers, tail))

    async def write(self, data: bytes) -> None:
        conn = self._conn
        transport = conn.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if not data:
            return
        # One bytes object, one write: an event is small, a copy is cheaper than a writev.
        transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)
        if conn.paused_writing:
            await conn.drain()

    async def write_eof(self) -> None:
        if self._eof:
            return
        self._eof = True
        conn = self._conn
        if conn.transport is None or conn.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if self.chunked:
            conn.transport.write(b"0\r\n\r\n")


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


Answer = web.StreamResponse | FastStream | Reply | Prerendered
Dispatch = Callable[[FastRequest], Awaitable[Answer]]


class FastServer:
    """What every connection of one listening socket shares; `shutdown` stops them."""

    def __init__(
        self, edge: Edge, dispatch: Dispatch, app: web.Application, max_body_bytes: int
    ) -> None:
        self.edge = edge
        self.dispatch = dispatch
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.conns: set[FastProtocol] = set()

    def protocol(self) -> FastProtocol:
        return FastProtocol(self)

    async def shutdown(self, grace_s: float) -> None:
        """Close idle connections now; give answers in progress up to `grace_s`, then close all."""
        for c in list(self.conns):
            c.close_when_idle()
        tasks = [c.runner for c in self.conns if c.busy and c.runner is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for c in list(self.conns):
            c.abort()


class FastProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: FastServer) -> None:
        self.server = server
        self.edge = server.edge
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self.peer: Peer | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.counted = False
        self.refused_lingering = False  # refused past a cap, reading and dropping
        # Lingering (`_linger`): when the client last sent, and when it ends at most.
        self.linger_last = 0.0
        self.linger_end = 0.0
        # The request being parsed (head or body), and those waiting their turn.
        self.cur: FastRequest | None = None
        self.in_head = False
        self.queue: deque[FastRequest] = deque()
        # The connection's answers, one after another (`_run`): one task for as long as
        # the connection lasts, not one per request. `busy` while an answer is in
        # progress; between requests the task waits on `idle_waiter`.
        self.runner: asyncio.Task[None] | None = None
        self.busy = False
        self.idle_waiter: asyncio.Future[FastRequest | None] | None = None
        self.started = False  # the answer in progress has written its head
        self.url = b""
        self.fields: list[tuple[str, str]] = []
        self.head_bytes = 0
        lim = server.edge.limits
        self.max_head_bytes = lim.max_line_bytes * (lim.max_headers + 2)
        # Read for every header line: kept here as plain ints (the limits object is
        # not compiled, and each of its attributes was a generic lookup per line).
        self.max_line_bytes = lim.max_line_bytes
        self.max_headers = lim.max_headers
        self.head_timer: asyncio.TimerHandle | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        # When the connection last became idle (`_arm_idle`).
        self.idle_since = 0.0
        self.linger_timer: asyncio.TimerHandle | None = None
        self.closing = False  # answer what is in progress, read nothing more
        self.refuse: bytes | None = None  # a 400 to send once the answer in progress is out
        self.paused_reading = False
        self.paused_writing = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self._handling: FastRequest | None = None
        self.draining = False  # the server is stopping: no request after this one
        self.raw_body_left = 0  # an upgrade request's body bytes still to read
        # Between a chunk's size line and its data, or in the trailers after the last:
        # httptools keeps a trailer line until it ends, so these bytes are bounded too.
        self.in_chunk_head = False
        self.chunk_head_bytes = 0

    # -- the connection -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        edge = self.edge
        # uvloop's transports are not asyncio.Transport subclasses: cast, not isinstance.
        tcp = cast(asyncio.Transport, transport)
        got = transport.get_extra_info("peername")
        self.remote = got[0] if isinstance(got, tuple) else None
        full = edge.open >= edge.max_connections
        peer = None if full else edge.peers.enter(self.remote)
        if peer is None:
            self._refuse_connection(tcp, full)
            return
        edge.open += 1
        self.counted = True
        self.peer = peer
        self.transport = tcp
        self.server.conns.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm_idle()

    def _refuse_connection(self, tcp: asyncio.Transport, full: bool) -> None:
        """Past the server's cap (`full`) or the address's share: a 503, then close.

        Closed at once, with the client's request unread, the kernel would reset the
        connection, and a reset can destroy the 503 before the client reads it. So,
        while few such connections are open: end our side, read and drop what comes
        for `linger_s` (the client's close ends it sooner), then close.
        """
        edge = self.edge
        edge.refused_total += 1
        log.warning(
            kv(
                "refused connection",
                server=edge.name,
                status=503,
                peer=self.remote,
                open=edge.open,
                max_connections=edge.max_connections if full else edge.peers.max_conns_each,
                why="server full" if full else "client address at its share",
            )
        )
        self.closing = True
        tcp.write(edge.full_answer if full else edge.share_answer)
        if edge.refused_lingering >= edge.max_refused_lingering or not tcp.can_write_eof():
            tcp.close()
            return
        edge.refused_lingering += 1
        self.refused_lingering = True
        self.transport = tcp
        tcp.write_eof()
        self.linger_timer = self.loop.call_later(edge.linger_s, tcp.close)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.counted:
            self.counted = False
            self.edge.open -= 1
            if self.peer is not None:
                self.edge.peers.leave(self.peer)
        if self.refused_lingering:
            self.refused_lingering = False
            self.edge.refused_lingering -= 1
        self.server.conns.discard(self)
        self.transport = None
        self.closing = True
        self._cancel_timers()
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_exception(ConnectionResetError("the client went away"))
        if self.busy and self.runner is not None and not self.runner.done():
            # A client that went away cancels its handler (and so the engine's work).
            self.runner.cancel()
        self._end_runner()
        for req in (self.cur, *self.queue):
            if req is not None:
                req._fail(ConnectionResetError("the client closed the connection"))

    def pause_writing(self) -> None:
        self.paused_writing = True

    def resume_writing(self) -> None:
        self.paused_writing = False
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    async def drain(self) -> None:
        if not self.paused_writing or self.transport is None:
            return
        self.drain_waiter = self.loop.create_future()
        # A client that takes none of its answer for idle_timeout_s would hold the
        # connection, and the engine's stream behind it, for as long as it likes.
        timer = self.loop.call_later(self.edge.limits.idle_timeout_s, self._stalled)
        try:
            await self.drain_waiter
        finally:
            timer.cancel()
            self.drain_waiter = None

    def _stalled(self) -> None:
        log.warning(
            kv(
                "closed connection",
                server=self.edge.name,
                peer=self.remote,
                why="the client read none of its answer within idle_timeout_s",
            )
        )
        self.abort()

    def send(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close_when_idle(self) -> None:
        """Stopping: close now if idle, else once the answer in progress is out."""
        self.draining = True
        if not self.busy:
            if self.transport is not None:
                self.transport.close()
            self._end_runner()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        if not self.busy:
            self._end_runner()

    def _end_runner(self) -> None:
        """The runner, waiting for a next request, has none to wait for: it ends."""
        waiter = self.idle_waiter
        if waiter is not None:
            self.idle_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _cancel_timers(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if self.linger_timer is not None:
            self.linger_timer.cancel()
            self.linger_timer = None

    def _arm_idle(self) -> None:
        """The connection is idle from now: closed if no request begins within
        `idle_timeout_s`. One timer per connection, not one per request: a timer
        already set is not moved, it looks again when it fires."""
        self.idle_since = self.loop.time()
        if self.idle_timer is None:
            self.idle_timer = self.loop.call_later(
                self.edge.limits.idle_timeout_s, self._idle_expired
            )

    def _idle_expired(self) -> None:
        self.idle_timer = None
        if self.transport is None:
            return
        if self.in_head or self.busy or self.cur is not None or self.queue:
            return  # a request in progress: its end arms the bound again
        left = self.idle_since + self.edge.limits.idle_timeout_s - self.loop.time()
        if left > 0:
            self.idle_timer = self.loop.call_later(left, self._idle_expired)
            return
        self.transport.close()

    def _head_late(self) -> None:
        self.head_timer = None
        if not self.in_head or self.transport is None:
            return
        if self.paused_reading:
            # Its bytes wait in the socket because this side stopped reading (requests
            # ahead of it are being answered): not the client's delay. Look again later.
            self.head_timer = self.loop.call_later(
                self.edge.limits.header_timeout_s, self._head_late
            )
            return
        log.warning(
            kv(
                "refused request",
                server=self.edge.name,
                status=408,
                peer=self.remote,
                why="head not complete within header_timeout_s",
            )
        )
        self.closing = True
        if self.busy:
            # A pipelined head that stalls behind an answer in progress: after it.
            self.refuse = self.edge.late_answer
            return
        self.transport.write(self.edge.late_answer)
        # The rest of its head may still come: read and drop it, or its reset could
        # destroy the 408 before the client reads it.
        self._linger(self.transport)

    # -- reading --------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        while data:
            data = self._received(data)

    def _received(self, data: bytes) -> bytes:
        """Parse `data`; what follows an upgrade request is returned, for a fresh parser.

        In a loop, not by recursion: a read can hold thousands of such requests.
        """
        if self.closing:
            # Answered and closing: what still comes is read and dropped (`_linger`).
            self.linger_last = self.loop.time()
            return b""
        if self.raw_body_left:
            data = self._raw_body(data)
            if not data:
                return b""
        if self.in_head:
            # httptools keeps a header line until it ends: bound the head as a whole.
            self.head_bytes += len(data)
            if self.head_bytes > self.max_head_bytes:
                self._refuse_head("the request head is too large")
                return b""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._parse_failed(exc)
            return b""
        except httptools.HttpParserUpgrade as exc:
            # `Upgrade: h2c` and the like (curl --http2 sends it): served as plain
            # HTTP/1.1, the upgrade ignored, as aiohttp and nginx do. llhttp stops
            # after that message; a fresh parser takes the bytes after it.
            self.parser = httptools.HttpRequestParser(self)
            return data[int(exc.args[0]) :]
        if self.in_chunk_head:
            # Counted once parsed: these bytes may be all one read, head and body with them.
            self.chunk_head_bytes += len(data)
            if self.chunk_head_bytes > self.max_head_bytes:
                why = "a chunk header or the trailers are too large"
                self._parse_failed(httptools.HttpParserError(why))
                return b""
        if self.in_head and self.head_timer is None:
            self.head_timer = self.loop.call_later(
                self.edge.limits.header_timeout_s, self._head_late
            )
        return b""

    def _raw_body(self, data: bytes) -> bytes:
        """Feed an upgrade request's body by its length; what follows it is returned."""
        n = self.raw_body_left
        part, rest = data[:n], data[n:]
        self.raw_body_left -= len(part)
        if self.cur is not None:
            self.cur._feed(part)
        if not self.raw_body_left:
            self.on_message_complete()
        return rest

    def resume_for(self, req: FastRequest) -> None:
        """A handler waits for `req`'s body: read on."""
        if self.paused_reading and self.transport is not None:
            self.paused_reading = False
            self.transport.resume_reading()

    def _pause(self) -> None:
        if not self.paused_reading and self.transport is not None:
            self.paused_reading = True
            self.transport.pause_reading()

    def on_message_begin(self) -> None:
        self.in_head = True
        self.url = b""
        self.fields = []

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.max_line_bytes:
            limit = self.max_line_bytes
            raise _HeadError(f"the request line is longer than {limit} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) + 2 > self.max_line_bytes:
            raise _HeadError(f"a header line is longer than {self.max_line_bytes} bytes")
        if len(self.fields) >= self.max_headers:
            raise _HeadError(f"more than {self.max_headers} headers")
        try:
            # ASCII (nearly every header) decodes the same either way; compiled, this
            # decode is a direct call, the one with an error handler a codec lookup.
            field = (name.decode("ascii"), value.decode("ascii"))
        except UnicodeDecodeError:
            field = (
                name.decode("utf-8", "surrogateescape"),
                value.decode("utf-8", "surrogateescape"),
            )
        self.fields.append(field)

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.head_bytes = 0
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        p = self.parser
        # Each of the parser's getters is a Python-level call: one of each.
        method = p.get_method()
        if method == b"CONNECT":
            raise _HeadError("CONNECT is not supported")
        upgrade = p.should_upgrade()
        req = FastRequest(
            self,
            method.decode("ascii"),
            self.url.decode("latin-1"),
            # Not wrapped in a read-only CIMultiDictProxy, as aiohttp's are: nothing
            # writes to a request's headers, and the wrapper cost a call per request.
            CIMultiDict(self.fields),
            p.should_keep_alive(),
            p.get_http_version(),
        )
        if upgrade and req.content_length:
            # httptools skips the body of an upgrade request (its bytes come after the
            # upgrade point): read it here, by its length.
            self.raw_body_left = req.content_length
        elif upgrade and "Transfer-Encoding" in req.headers:
            # llhttp takes a request's Transfer-Encoding only with chunked last (any
            # case, any of several headers): whatever its spelling, the body is chunked.
            raise _HeadError("a body with an Upgrade header needs a Content-Length")
        self.cur = req
        self.queue.append(req)
        if not self.busy:
            self._next()
        else:
            # Pipelined behind an answer in progress: its body stays in the socket
            # (not held here, uncounted by the program's body budget) until its turn.
            self._pause()

    def on_chunk_header(self) -> None:
        self.in_chunk_head = True
        self.chunk_head_bytes = 0

    def on_chunk_complete(self) -> None:
        self.in_chunk_head = False

    def on_body(self, body: bytes) -> None:
        self.in_chunk_head = False
        self.chunk_head_bytes = 0
        if self.cur is not None:
            self.cur._feed(body)

    def on_message_complete(self) -> None:
        if self.raw_body_left:
            return  # an upgrade request's body is still to come (on_headers_complete)
        req = self.cur
        self.cur = None
        if req is None:
            return
        req.complete = True
        req._wake()
        if req is not self._handling:
            # Pipelined behind an answer in progress: read no further until its turn.
            self._pause()

    def _parse_failed(self, exc: httptools.HttpParserError) -> None:
        cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else None
        why = str(cause) if isinstance(cause, _HeadError) else _without_echo(str(exc))
        self.closing = True
        self._cancel_timers()
        cur = self.cur
        if cur is not None and not self.in_head and cur is self._handling:
            # Broken framing in the body of the request being handled: its read() fails.
            cur._fail(exc)
            return
        self._refuse_head(why)

    def _refuse_head(self, why: str) -> None:
        """A 400 for a request that cannot be parsed, then close (after any answer in progress)."""
        self.closing = True
        self._cancel_timers()
        if self.cur is not None and self.queue and self.queue[-1] is self.cur:
            # A pipelined request whose body broke: it will never be complete.
            self.queue.pop()
        self.cur = None
        log.warning(
            kv("refused request", server=self.edge.name, status=400, peer=self.remote, why=why)
        )
        text = _one_line(f"Bad HTTP request: {why}")
        body = self.edge.error(400, text)
        answer = _head(
            400,
            None,
            {"Content-Type": "application/json"},
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("ascii"),
        )
        if not self.busy:
            if self.transport is not None:
                self.transport.write(answer + body)
                self._linger(self.transport)
        else:
            self.refuse = answer + body

    # -- answering ------------------------------------------------------------

    def _next(self) -> None:
        """Answer the first request queued (none is in progress): the runner waiting
        for it takes it, or a runner starts."""
        req = self._begin()
        waiter = self.idle_waiter
        if waiter is not None and not waiter.done():
            self.idle_waiter = None
            waiter.set_result(req)
        else:
            self.runner = self.loop.create_task(self._run(req))

    def _begin(self) -> FastRequest:
        req = self.queue.popleft()
        self._handling = req
        self.started = False
        self.busy = True
        return req

    async def _run(self, first: FastRequest) -> None:
        """Answer the connection's requests in turn until it closes.

        One task per connection, waiting between requests: a task per request cost
        more (asyncio registers each task in a WeakSet, in Python, and unregisters it
        when it is freed; the figure is in bench/RESULTS.md).
        """
        req: FastRequest | None = first
        while req is not None:
            keep = False
            try:
                # The handler's coroutine awaited here, not in a coroutine per request
                # around it: compiled, each level of coroutine costs a generator and
                # its environment per request, and a pass each time the request resumes.
                if req.expect is None or self._expected(req):
                    try:
                        resp = await self.server.dispatch(req)
                    except (asyncio.CancelledError, ConnectionError):
                        raise
                    except Exception as exc:
                        log.error(
                            kv("handler failed", server=self.edge.name, path=req.path),
                            exc_info=exc,
                        )
                        self._handler_failed(req)
                    else:
                        keep = self._answered(req, resp)
                if keep and self.paused_writing:
                    # A client that does not read its answers: the next (pipelined or
                    # not) waits until this one has drained, so what the transport holds
                    # stays near its high-water mark instead of one answer per request.
                    await self.drain()
            except (asyncio.CancelledError, ConnectionError):
                keep = False
            except Exception as exc:
                # Writing the answer failed (a handler's header that cannot be encoded...).
                log.error(kv("answer failed", server=self.edge.name, path=req.path), exc_info=exc)
                keep = False
            if not self._finished(req, keep):
                return
            if self.queue:
                req = self._begin()
                continue
            waiter: asyncio.Future[FastRequest | None] = self.loop.create_future()
            self.idle_waiter = waiter
            try:
                req = await waiter
            except asyncio.CancelledError:
                return

    def _expected(self, req: FastRequest) -> bool:
        """A request with an Expect header: whether the handler is to answer it (a 100
        Continue sent if the body is still to come), or it was refused (417, closing)."""
        expect = req.expect
        assert expect is not None
        if req.version == "1.1" and expect.lower() == "100-continue":
            if not req.complete:
                self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            return True
        msg = f"Unknown Expect: {expect}"
        refusal = web.Response(
            status=417, body=self.edge.error(417, msg), content_type="application/json"
        )
        self._write(req, refusal, close=True)
        return False

    def _handler_failed(self, req: FastRequest) -> None:
        """The handler raised: a 500 closing the connection, unless an answer had begun
        (then the connection is only closed)."""
        if self.started:
            return
        msg = "The server had an error while processing your request."
        resp = web.Response(
            status=500, body=self.edge.error(500, msg), content_type="application/json"
        )
        self._write(req, resp, close=True)

    def _answered(self, req: FastRequest, resp: Answer) -> bool:
        """Write the handler's answer (a stream is already written); whether the
        connection may carry another request."""
        if type(resp) is Prerendered:
            close = not req.keep_alive or not req.complete or self.draining
            self._send_lines(req, resp.status, None, resp.lines, resp.body, close)
            return not close
        if isinstance(resp, FastStream):
            return resp.keep_alive and resp._eof
        if isinstance(resp, Reply):
            close = not req.keep_alive or not req.complete or self.draining
            self._send_whole(req, resp.status, None, resp.headers, resp.body, close)
            return not close
        if not isinstance(resp, web.Response):
            raise TypeError(f"a handler answered {type(resp).__name__}, not a web.Response")
        close = not req.keep_alive or resp.keep_alive is False or not req.complete or self.draining
        self._write(req, resp, close=close)
        return not close

    def _write(self, req: FastRequest, resp: web.Response, *, close: bool) -> None:
        body = resp.body
        if not isinstance(body, bytes | bytearray):
            body = b"" if body is None else bytes(cast(Any, body)._value)
        self._send_whole(req, resp.status, _reason(resp), resp.headers, body, close)

    def _send_whole(
        self,
        req: FastRequest,
        status: int,
        reason: str | None,
        headers: Mapping[str, str],
        body: bytes | bytearray,
        close: bool,
    ) -> None:
        lines = _fields(headers)
        if "Content-Type" not in headers:
            lines += b"Content-Type: application/octet-stream\r\n"
        self._send_lines(req, status, reason, lines, body, close)

    def _send_lines(
        self,
        req: FastRequest,
        status: int,
        reason: str | None,
        lines: bytes,
        body: bytes | bytearray,
        close: bool,
    ) -> None:
        """A whole answer whose header lines are written (a `Prerendered`'s as they
        are): status line, the lines, Date, Content-Length, Connection, the body."""
        if close:
            end = b"\r\nConnection: close\r\n\r\n"
        elif req.version == "1.0":
            end = b"\r\nConnection: keep-alive\r\n\r\n"
        else:
            end = b"\r\n\r\n"
        head = b"".join(
            (
                _status_line(status, reason),
                lines,
                _date.get(),
                b"Content-Length: ",
                str(len(body)).encode("ascii"),
                end,
            )
        )
        self.started = True
        if req.method == "HEAD":
            self.send(head)
        else:
            self.send(head + body)

    def _finished(self, req: FastRequest, keep: bool) -> bool:
        """`req` is answered; whether the connection goes on to another request."""
        self.busy = False
        self._handling = None
        transport = self.transport
        if transport is None:
            return False
        if not keep or self.draining or (self.closing and not self.queue):
            if keep and self.refuse is not None:
                # The refused (or late) head came after every request answered: its turn.
                transport.write(self.refuse)
            self.refuse = None
            self.closing = True
            if req.complete:
                transport.close()
            else:
                self._linger(transport)
            return False
        if self.queue:
            # Read on only once the pipelined requests already in are answered: each
            # read can bring a buffer full of heads, and the queue would grow by that
            # much per answer. The runner takes the next.
            return True
        if self.paused_reading:
            self.paused_reading = False
            transport.resume_reading()
        if self.cur is None and not self.in_head:
            # A head begun behind the answer is bounded by its own timer (408), not this.
            self._arm_idle()
        return True

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close after an answer given before the body was all in (413, 503, 401...).

        Closing with unread bytes makes the kernel reset the connection, and a
        reset can destroy the answer before the client reads it (a client still
        sending its body reads nothing at all). So: end our side, read and drop
        what still comes for a while (aiohttp's lingering time), then close.
        """
        if self.paused_reading:
            self.paused_reading = False
            transport.resume_reading()
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        now = self.loop.time()
        self.linger_last = now
        self.linger_end = now + self.edge.linger_max_s
        self.linger_timer = self.loop.call_later(self.edge.linger_s, self._linger_check)

    def _linger_check(self) -> None:
        """Close once the client has sent nothing for `linger_s`, or `linger_max_s` after
        the answer: a client trickling its body reads the answer once it stops."""
        self.linger_timer = None
        transport = self.transport
        if transport is None:
            return
        now = self.loop.time()
        quiet_at = self.linger_last + self.edge.linger_s
        if now < quiet_at and now < self.linger_end:
            self.linger_timer = self.loop.call_later(
                min(quiet_at, self.linger_end) - now, self._linger_check
            )
            return
        transport.close()

    def eof_received(self) -> bool:
        # The client is done sending; a lingering close need not wait any longer.
        return False


def _reason(resp: web.Response) -> str | None:
    """The response's reason when it is not the status's standard phrase (the cached
    status line is used then)."""
    phrase = _phrase(resp.status)
    reason = resp.reason
    return None if phrase and reason == phrase else reason
