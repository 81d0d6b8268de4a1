"""One client connection of the router's server: its state, requests, streams, timers.

`Connection` holds what a connection is between requests and how it ends
(counted against the caps, idle and head timers, back-pressure, lingering
closes); `Request` and `Stream` are what a handler sees of one request
and of the streamed answer it opens (a whole answer is a `Whole`, answers.py).
Parsing and answering are server.py's (`FastProtocol`, a `Connection`);
`Listener` is what every connection of one listening socket shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Final, cast
from urllib.parse import unquote, urlsplit

import httptools
from multidict import CIMultiDict

from llmgw.router.http.answers import Whole
from llmgw.router.http.heads import head
from llmgw.runtime.httpserver import Edge, ErrorBody, late_answer
from llmgw.runtime.logs import kv
from llmgw.runtime.peers import Peer

log: Final = logging.getLogger(__name__)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class BodyTooLarge(Exception):
    """The request body is larger than its path takes (`Request.body_limit`)."""


class BodyBroken(Exception):
    """The request body's framing broke (a bad chunk, a short body); the message says how."""


class Request:
    """One request as a handler sees it: method, path, headers (case-insensitive), body."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_error",
        "_more",
        "_waiter",
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
        conn: Connection,
        method: str,
        raw_path: str,
        headers: CIMultiDict[str],
        *,
        keep_alive: bool,
        version: str,
    ) -> None:
        self._conn = conn
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
        """Wait for more of the body (or its end, or a failure), at most `timeout_s`: for
        a reader that counts a body as it arrives (the intake's budget and minimum rate)."""
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

    @property
    def max_body_bytes(self) -> int:
        """The largest body the server takes, as it was started (a restart-only setting:
        the limit of a reloaded file would refuse declared bodies the server admits)."""
        return self._conn.server.max_body_bytes

    def body_limit(self) -> int:
        """`max_body_bytes`, or `max_upload_bytes` on an upload path (asked past the first)."""
        server = self._conn.server
        if self.path in server.upload_paths:
            return server.max_upload_bytes
        return server.max_body_bytes

    @property
    def header_timeout_s(self) -> float:
        """The server's head timeout, as it was started (restart-only, like the limit)."""
        return self._conn.edge.limits.header_timeout_s

    def ended(self) -> bool:
        """Whether the body is all in, over the limit, or broken: `read()` will not wait."""
        return self.complete or self.too_large or self._error is not None

    async def read(self) -> bytes:
        """The whole body.

        `BodyTooLarge` past the limit, `BodyBroken` if its framing broke.
        """
        if not (self.complete or self.too_large or self._error is not None):
            self._conn.resume_for(self)
            waiter = self._waiter = self._conn.loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        if self._error is not None:
            raise BodyBroken(str(self._error))
        if self.too_large:
            limit = self.body_limit()
            raise BodyTooLarge(f"{self.size} bytes and more; at most {limit}")
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
        if self.size > self._conn.server.max_body_bytes and self.size > self.body_limit():
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

    def stream(self, status: int, headers: dict[str, str]) -> Stream:
        """Send the head of a streamed answer now; its body follows with `write`."""
        return Stream(self._conn, self, status, headers)


class Stream:
    """A streamed answer (chunked on HTTP/1.1; on 1.0 the close ends it)."""

    __slots__ = ("_conn", "_eof", "_req", "chunked", "keep_alive", "status")

    def __init__(
        self, conn: Connection, req: Request, status: int, headers: dict[str, str]
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
        conn.send(head(status, None, headers, tail))

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


# What a handler answers: a whole answer, or a stream it has opened (and sent).
Answer = Whole | Stream
Dispatch = Callable[[Request], Awaitable[Answer]]


class Listener:
    """What every connection of one listening socket shares; `shutdown` stops them."""

    def __init__(
        self,
        edge: Edge,
        dispatch: Dispatch,
        *,
        max_body_bytes: int,
        errors: Mapping[str, ErrorBody] | None = None,
        upload_paths: Collection[str] = (),
        max_upload_bytes: int | None = None,
    ) -> None:
        self.edge = edge
        self.dispatch = dispatch
        self.max_body_bytes = max_body_bytes
        # Upload paths take up to max_upload_bytes: a JSON limit raised for audio files
        # would let every JSON route take (and decode) bodies that large.
        self.upload_paths = frozenset(upload_paths)
        self.max_upload_bytes = max(max_body_bytes, max_upload_bytes or 0)
        self.conns: set[Connection] = set()
        # Path → its API's error body where not the edge's (Anthropic's on the Messages
        # paths), also for what the server answers itself there (a bad or late head).
        self.errors: dict[str, ErrorBody] = dict(errors or {})

    def error_for(self, path: str) -> ErrorBody:
        """The error body for an answer the server gives itself to a request for `path`."""
        return self.errors.get(path, self.edge.error)

    async def shutdown(self, grace_s: float) -> None:
        """Close idle connections now; give answers in progress up to `grace_s`, then close all."""
        for c in list(self.conns):
            c.close_when_idle()
        tasks = [c.runner for c in self.conns if c.busy and c.runner is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for c in list(self.conns):
            c.abort()


class Connection(asyncio.Protocol):
    """One client connection: its state, its timers, how it closes (server.py parses
    and answers on it)."""

    def __init__(self, server: Listener) -> None:
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
        self.cur: Request | None = None
        self.in_head = False
        self.queue: deque[Request] = deque()
        # The connection's answers, one after another (`_run`): one task for as long as
        # the connection lasts, not one per request. `busy` while an answer is in
        # progress; between requests the task waits on `idle_waiter`.
        self.runner: asyncio.Task[None] | None = None
        self.busy = False
        self.idle_waiter: asyncio.Future[Request | None] | None = None
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
        self._handling: Request | None = None
        self.draining = False  # the server is stopping: no request after this one
        self.raw_body_left = 0  # an upgrade request's body bytes still to read
        # Between a chunk's size line and its data, or in the trailers after the last:
        # httptools keeps a trailer line until it ends, so these bytes are bounded too.
        self.in_chunk_head = False
        self.chunk_head_bytes = 0

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
        error = self.head_error()
        late = self.edge.late_answer
        if error is not self.edge.error:
            late = late_answer(self.edge.limits, error)
        if self.busy:
            # A pipelined head that stalls behind an answer in progress: after it.
            self.refuse = late
            return
        self.transport.write(late)
        # The rest of its head may still come: read and drop it, or its reset could
        # destroy the 408 before the client reads it.
        self._linger(self.transport)

    def head_error(self) -> ErrorBody:
        """The error body for an answer to the head being read: its path's, as far as
        its request line came (`Listener.errors`), else the edge's."""
        errors = self.server.errors
        if not errors:
            return self.edge.error
        return self.server.error_for(self.url.partition(b"?")[0].decode("latin-1"))

    def resume_for(self, req: Request) -> None:
        """A handler waits for `req`'s body: read on."""
        if self.paused_reading and self.transport is not None:
            self.paused_reading = False
            self.transport.resume_reading()

    def _pause(self) -> None:
        if not self.paused_reading and self.transport is not None:
            self.paused_reading = True
            self.transport.pause_reading()

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close after an answer given before the body was all in (413, 503, 401...).

        Closing with unread bytes makes the kernel reset the connection, which can
        destroy the answer before the client reads it. So: end our side, read and drop
        what still comes for a while (aiohttp's lingering time), then close."""
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
        return False  # the client is done sending: a lingering close need not wait longer
