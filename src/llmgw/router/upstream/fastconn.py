"""One keep-alive connection to an engine and the exchange it carries (fast.py's parts).

`Conn` is an asyncio protocol: it writes a request, feeds the bytes that come back
to llhttp (`httptools`), Content-Length and chunked alike, and reports to the
exchange's `FastResponse`, which hands body bytes over as they arrive, never held
for more (an SSE event is relayed the moment its bytes are in). `Pool` keeps a
target's idle connections; `Watch` holds the deadlines of every exchange in flight
on one timer.

Connection rules, each preventing a failure seen in proxies:
- TCP_NODELAY on every connection: Nagle plus delayed ACKs holds a small SSE
  event up to 40 ms on a reused connection.
- An idle connection is dropped after `KEEPALIVE_S` (4 s), below uvicorn's 5 s,
  so we rarely send on a socket the engine is closing.
- A connection that had an error, was cut by its deadline, or still had body
  bytes unread is closed, never pooled: the next request must not read the
  tail of someone else's response.
- Cancelling a wait (the client went away) or `close()` on an unfinished
  response aborts the connection: that is how the engine learns to stop.
- Interim 1xx heads are passed over (`Conn._interim`); a status outside 100 to
  599 and a head past `MAX_HEAD_BYTES` are the engine's failure.

Errors leave as the router's own (`errors`): nothing before the head arrived →
`UpstreamConnectError` (retryable), the deadline or the idle bound →
`UpstreamTimeout`, a body cut short or unparsable → `UpstreamBroken`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator, Mapping
from typing import Final, cast

import httptools

from llmgw.router.errors import UpstreamBroken, UpstreamConnectError, UpstreamTimeout
from llmgw.router.upstream.base import JSON, ReplyHead

# Body bytes buffered past this pause the engine's socket until the proxy has
# written them on: a slow client must not make the router hold a whole answer.
HIGH_WATER_BYTES: Final = 256 * 1024
# Bodies up to this are appended to the head and sent in one write (one syscall).
COALESCE_BYTES: Final = 64 * 1024
# An engine's head (interim ones included) past this is the engine's failure. llhttp
# sets no bound, and httptools joins a header value's pieces by concatenation: a head
# of tens of MiB held the router's one core for seconds, and kept it all in memory.
MAX_HEAD_BYTES: Final = 64 * 1024
_NEVER: Final = float("inf")


class Headers(Mapping[str, str]):
    """Response headers as received: case-insensitive lookup, decoded only when asked."""

    __slots__ = ("_raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        got = _first(self._raw, key.lower().encode("latin-1"))
        return default if got is None else got

    def __getitem__(self, key: str) -> str:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return (k.decode("latin-1") for k, _ in self._raw)

    def __len__(self) -> int:
        return len(self._raw)


def _first(raw: list[tuple[bytes, bytes]], want: bytes) -> str | None:
    """The value of the first line named `want` (lower case), any case, as received."""
    n = len(want)
    for k, v in raw:
        if len(k) == n and k.lower() == want:
            return v.decode("utf-8", "surrogateescape")
    return None


class FastResponse(ReplyHead):
    """One exchange: the head once `FastUpstream.post` returns, the body through `chunk()`.

    Its connection reports to it through `on_head`, `on_body`, `on_end` and
    `on_error`; nothing else writes its fields.
    """

    __slots__ = ("_buf", "_buffered", "_conn", "_done", "_raw", "_waiter", "error")

    def __init__(self, conn: Conn, endpoint_id: str) -> None:
        self.endpoint_id = endpoint_id
        # 0 until the head is in; `post` returns only after that.
        self.status = 0
        self._content_type = None
        self._conn: Conn | None = conn  # None once finished, failed or closed
        self._raw: list[tuple[bytes, bytes]] = _NO_HEADERS
        self._buf: list[bytes] = []
        self._buffered = 0
        self._done = False  # the whole body arrived
        # Why the exchange failed; None while it has not (set by `on_error` only).
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def headers(self) -> Headers:
        return Headers(self._raw)

    @property
    def content_type(self) -> str:
        """ReplyHead's, read off the raw header lines: no `Headers` object and no
        generic `get` (their cost per answer is in bench/RESULTS.md)."""
        ct = self._content_type
        if ct is None:
            ct = self._content_type = _first(self._raw, b"content-type") or JSON
        return ct

    def head_waiter(self) -> asyncio.Future[None] | None:
        """A future done when the head or an error arrives; None when one already has."""
        conn = self._conn
        if self.status or self.error is not None or conn is None:
            return None
        waiter = self._waiter = conn.loop.create_future()
        return waiter

    async def read(self) -> bytes:
        """The whole body."""
        if self._done and not self.error:
            return self._take()
        parts = []
        while chunk := await self.chunk():
            parts.append(chunk)
        return b"".join(parts)

    async def chunk(self) -> bytes:
        """Whatever body bytes have arrived (waiting for at least one); b"" at the end."""
        while True:
            if self._buf:
                return self._take()
            if self.error is not None:
                raise self.error
            if self._done:
                return b""
            conn = self._conn
            if conn is None:
                raise UpstreamBroken(self.endpoint_id, "response closed")
            waiter = self._waiter = conn.loop.create_future()
            # Cancelled here (the client left): the proxy's `finally` calls close().
            await waiter

    def body_in(self, limit: int) -> bytes | None:
        # As `read`'s first line: the usual whole answer came in with its head.
        if self._done and self.error is None and self._buffered <= limit:
            return self._take()
        return None

    def close(self) -> None:
        """Drop the connection if the exchange is unfinished; a no-op once it ended."""
        conn = self._conn
        if conn is not None:
            conn.fail(UpstreamBroken(self.endpoint_id, "response closed"))

    def release(self) -> None:
        # A method of its own, not `release = close`: compiled (compiled.py), a class
        # attribute naming a method is looked up by name and fails.
        self.close()

    # -- reports from the connection ---------------------------------------------

    def on_head(self, status: int, raw: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self._raw = raw
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._buf.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER_BYTES and self._conn is not None:
            self._conn.transport.pause_reading()
        self._wake()

    def on_end(self) -> bool:
        """The whole body arrived; whether its connection's reading is paused for it."""
        self._done = True
        self._detach()
        return self._buffered > HIGH_WATER_BYTES

    def on_error(self, exc: BaseException) -> None:
        """The exchange failed; the connection is gone."""
        self.error = exc
        self._detach()

    def _take(self) -> bytes:
        buf = self._buf
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        if self._buffered > HIGH_WATER_BYTES and self._conn is not None:
            self._conn.transport.resume_reading()
        self._buffered = 0
        return data

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _detach(self) -> None:
        self._conn = None
        self._wake()


# Shared by every response whose head has not come: replaced, never appended to.
_NO_HEADERS: Final[list[tuple[bytes, bytes]]] = []


class Pool:
    """Idle keep-alive connections to one (scheme, host, port), most recent last."""

    __slots__ = ("idle", "keepalive_s")

    def __init__(self, keepalive_s: float) -> None:
        self.keepalive_s = keepalive_s
        self.idle: list[Conn] = []

    def take(self, now: float) -> Conn | None:
        idle = self.idle
        while idle:
            conn = idle.pop()
            # Closing but not yet lost: the engine's FIN came in this very loop turn.
            if now - conn.idle_since < self.keepalive_s and not conn.transport.is_closing():
                return conn
            conn.transport.close()
        return None

    def put(self, conn: Conn, now: float) -> None:
        conn.idle_since = now
        self.idle.append(conn)

    def discard(self, conn: Conn) -> None:
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    def expire(self, now: float) -> int:
        """Close connections idle for `keepalive_s` or longer; how many were closed."""
        keep: list[Conn] = []
        gone = 0
        for conn in self.idle:
            if now - conn.idle_since < self.keepalive_s and not conn.lost:
                keep.append(conn)
            else:
                conn.transport.close()
                gone += 1
        self.idle[:] = keep
        return gone


class Watch:
    """The deadlines and idle bounds of every exchange in flight, on one timer.

    A timer per request (`call_at`, its handle and its cancel) was a measurable
    share of a request's CPU (bench/RESULTS.md, "Figures once quoted in the
    router's source"). Here a request joins a set and leaves it; the one timer is
    armed for the earliest time any exchange may be due, and when it fires every
    exchange in flight is looked at (`Conn.check`): the late ones fail, the rest
    say when to look again. Deadlines grow with the time a request was sent, so a
    new request rarely moves the timer, and it fires about once per bound.
    """

    __slots__ = ("busy", "loop", "timer", "when")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.busy: set[Conn] = set()
        self.timer: asyncio.TimerHandle | None = None
        self.when = _NEVER

    def watch(self, conn: Conn, due: float) -> None:
        self.busy.add(conn)
        if due < self.when:
            self._arm(due)

    def _arm(self, due: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.when = due
        self.timer = self.loop.call_at(due, self.fire)

    def fire(self) -> None:
        self.timer = None
        self.when = _NEVER
        now = self.loop.time()
        nxt = _NEVER
        # A copy: a late exchange leaves the set as it fails.
        for conn in list(self.busy):
            due = conn.check(now)
            if due < nxt:
                nxt = due
        if nxt < self.when:
            self._arm(nxt)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.when = _NEVER


class Conn(asyncio.Protocol):
    """One TCP connection to an engine; carries at most one exchange at a time.

    The exchange's clock (deadline, idle bound; the timer is the client's `Watch`)
    and its parse state (header lines so far, whether the body runs to the
    connection's end) live here; what the proxy reads lives in the `FastResponse`.
    """

    transport: asyncio.Transport

    def __init__(self, pool: Pool, loop: asyncio.AbstractEventLoop, watch: Watch) -> None:
        self.pool = pool
        self.loop = loop
        self.watch = watch
        self.parser = httptools.HttpResponseParser(self)
        self.resp: FastResponse | None = None
        self.idle_since = 0.0
        self.lost = False
        # The kernel gave up on the peer (TCP user timeout: fast.tune): its host is
        # silent, so a fresh connection to it would only wait out the connect timeout.
        self.peer_silent = False
        # The exchange in progress (set by `send`).
        self.raw: list[tuple[bytes, bytes]] = []
        self.got_bytes = False
        # Bytes of the exchange's head (with any interim ones) so far, counted only
        # while it is incomplete.
        self.head_bytes = 0
        self.eof_body = False  # no length given: the body ends when the engine closes
        # An interim (1xx) answer is being parsed: its end is not the exchange's.
        self.interim = False
        self.deadline = 0.0  # loop time
        self.idle_s: float | None = None
        self.last_data = 0.0
        # Until this loop time the idle bound is looked at even before the head.
        self.first_look = 0.0

    # -- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are asyncio.Transport look-alikes, not subclasses.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None:
            # Bytes nobody asked for: this connection is out of step; never reuse it.
            self.transport.abort()
            return
        self.got_bytes = True
        if self.idle_s is not None:
            self.last_data = self.loop.time()
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # HttpParserUpgrade (not an HttpParserError) follows a 101, which
            # `on_headers_complete` has already failed.
            if self.resp is None:  # trailing garbage after a finished response
                self.transport.abort()
            else:
                what = "response" if resp.status else "response head"
                self.fail(UpstreamBroken(resp.endpoint_id, f"bad {what}: {exc}"))
        else:
            if not resp.status and resp.error is None:
                # All of `data` was head: the head would have ended within it otherwise.
                self.head_bytes += len(data)
                if self.head_bytes > MAX_HEAD_BYTES:
                    why = f"response head over {MAX_HEAD_BYTES // 1024} KiB"
                    self.fail(UpstreamBroken(resp.endpoint_id, why))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.peer_silent = isinstance(exc, TimeoutError)
        resp = self._end()
        if resp is None:
            self.pool.discard(self)
        elif resp.status and self.eof_body and exc is None:
            resp.on_end()
        elif resp.status:
            resp.on_error(UpstreamBroken(resp.endpoint_id, _lost("body", exc)))
        else:
            resp.on_error(UpstreamConnectError(resp.endpoint_id, _lost("response", exc)))

    # -- httptools callbacks -----------------------------------------------------
    # The parser calls these only while data_received feeds it, which it does only
    # with `self.resp` set; the checks below are one comparison each.

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw.append((name, value))

    def on_headers_complete(self) -> None:
        resp = self.resp
        if resp is None:
            return
        raw = self.raw
        status = self.parser.get_status_code()
        if status < 200 or status > 599:
            self._interim(resp, status)
            return
        if not self.parser.should_keep_alive():
            # Neither a length nor chunks: the body runs to the connection's end.
            self.eof_body = not any(
                k.lower() in (b"content-length", b"transfer-encoding") for k, _ in raw
            )
        resp.on_head(status, raw)
        # Lines from here on are a chunked body's trailers: the head is the answer's,
        # and a trailer must not add to it (a `Content-Type` there became the answer's).
        self.raw = []

    def _interim(self, resp: FastResponse, status: int) -> None:
        """A 1xx head: 100 Continue, 103 Early Hints and the like say the answer is
        coming on this connection (RFC 9110 15.2), so they are passed over, lines and
        all; taken for the answer, they reached the client as a 1xx with nothing after
        it, which waited for the rest until its own timeout. A 101 switches to a
        protocol nobody asked for, and a 1xx with a body is no interim answer: the
        engine's failure, both. So is a status outside 100 to 599 (llhttp takes any
        three digits; RFC 9110 15 calls the others invalid): the client got
        `HTTP/1.1 999` over the engine's body, and a `099` was passed over as interim,
        the request then waiting out its whole deadline for an answer."""
        raw = self.raw
        self.raw = []
        if status < 100 or status > 599:
            self.fail(UpstreamBroken(resp.endpoint_id, f"invalid status {status:03d}"))
        elif status == 101:
            self.fail(UpstreamBroken(resp.endpoint_id, "the engine switched protocols (101)"))
        elif any(k.lower() in (b"content-length", b"transfer-encoding") for k, _ in raw):
            self.fail(UpstreamBroken(resp.endpoint_id, f"an interim answer ({status}) with a body"))
        else:
            self.interim = True

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        if resp is not None:
            resp.on_body(body)

    def on_message_complete(self) -> None:
        # `_end()` inlined: this runs once per response on the hot path.
        resp = self.resp
        if resp is None:
            return
        if self.interim:  # the end of a 1xx: the answer follows
            self.interim = False
            return
        self.resp = None
        self.watch.busy.discard(self)
        if resp.on_end():
            # Paused for bytes not yet read on: they are the response's now.
            self.transport.resume_reading()
        if self.parser.should_keep_alive() and not self.lost:
            self.pool.put(self, self.loop.time())
        else:
            self.transport.close()

    # -- exchanges -----------------------------------------------------------------

    def send(
        self, resp: FastResponse, head: bytes, body: bytes, deadline: float, idle_s: float | None
    ) -> None:
        self.resp = resp
        self.raw = []
        self.got_bytes = False
        self.head_bytes = 0
        self.eof_body = False
        self.interim = False
        self.deadline = deadline
        self.idle_s = idle_s
        # Looked at (`check`) when the first of the deadline and the idle bound may be
        # due, then again when it says, instead of a timer moved on every body byte.
        if idle_s is None:
            due = deadline
        else:
            due = self.first_look = min(deadline, self.loop.time() + idle_s)
        self.watch.watch(self, due)
        if len(body) <= COALESCE_BYTES:
            self.transport.write(head + body)
        else:
            self.transport.writelines((head, body))

    def check(self, now: float) -> float:
        """Fail the exchange if it is past its deadline or idle bound; else the loop
        time to look again (never, with no exchange in progress).

        The idle bound applies once the head is in. Before the head it is looked at
        once, when it would first be due (`first_look`), and from then on only the
        deadline: a head that comes later than that is not held to it.
        """
        resp = self.resp
        if resp is None:
            self.watch.busy.discard(self)
            return _NEVER
        if now >= self.deadline:
            what = "response body" if resp.status else "response"
            self.fail(UpstreamTimeout(resp.endpoint_id, f"no complete {what} in time"))
            return _NEVER
        due = self.deadline
        idle_s = self.idle_s
        if idle_s is not None:
            if now < self.first_look:
                due = self.first_look
            elif resp.status:
                idle_due = self.last_data + idle_s
                if now >= idle_due:
                    self.fail(UpstreamTimeout(resp.endpoint_id, f"no data for {idle_s:g}s"))
                    return _NEVER
                due = min(due, idle_due)
            else:
                # No head by the time the idle bound was first due: only the deadline
                # from here on (`send` sets the bound again for the next exchange).
                self.idle_s = None
        return due

    def fail(self, exc: BaseException) -> None:
        """End the exchange with `exc` and drop the connection."""
        resp = self._end()
        self.transport.abort()
        if resp is not None:
            resp.on_error(exc)

    def _end(self) -> FastResponse | None:
        """Detach the exchange in progress (from the watch); the response it had."""
        resp = self.resp
        self.resp = None
        self.watch.busy.discard(self)
        return resp


def _lost(what: str, exc: BaseException | None) -> str:
    why = "closed by the engine" if exc is None else (str(exc) or type(exc).__name__)
    return f"connection lost before the {what} was complete: {why}"[:200]
