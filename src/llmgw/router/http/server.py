"""The router's HTTP/1.1 server: httptools (llhttp) parsing, prebuilt answer heads.

The same pattern as the router's upstream client (router/upstream/fast.py), on
the serving side: one `asyncio.Protocol` per connection, no aiohttp
RequestHandler, BaseRequest, StreamWriter, URL dispatcher or middleware chain
per request. The program gives a `Dispatch`: an async function of a
`Request` that answers with a `Whole` (answers.py: written here in one
`write`) or a `Stream` it opened itself (an event stream, relayed as it
comes, chunked).

It keeps what `runtime.httpserver.EdgeHandler` gives aiohttp's server, with the
same `Edge` (limits, the connection count and the canned answers):

- a request the parser refuses (bad framing, a line over `max_line_bytes`, more
  than `max_headers` headers, smuggling attempts such as Content-Length with
  Transfer-Encoding, or Transfer-Encoding on HTTP/1.0) is a 400 with the program's
  JSON error body, one log line, and the connection closed;
- a head must arrive within `header_timeout_s` of its first byte (else 408),
  a connection with no request for `idle_timeout_s` is closed, and past
  `max_connections` a new one is answered 503 at once;
- keep-alive and pipelining (requests answered in order, one at a time; reading
  stops at a pipelined head until its turn, and the next answer waits until the
  last has drained), chunked request bodies, `Expect: 100-continue`, HEAD;
- a body larger than `max_body_bytes` (`max_upload_bytes` on an upload path)
  makes `read()` raise `BodyTooLarge` and
  a broken one `BodyBroken` (connection.py); a client that disconnects cancels
  its handler.

What differs: a client that takes none of an answer for `idle_timeout_s` while
more is to be sent is closed, whether the answer keeps the connection or closes
it (aiohttp waits on it for ever); a request body the handler did not read
closes the connection after the answer (aiohttp reads it off for up to two
seconds); request bodies are never decompressed (the router
does not want them to be); an `Upgrade` header is ignored (the request is served
as HTTP/1.1), CONNECT refused (400).

The connection's own state and closing are connection.py's; the heads heads.py's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final
from urllib.parse import unquote

import httptools
from multidict import CIMultiDict

from llmgw.router.http.answers import JSON, Hold, Whole, whole
from llmgw.router.http.connection import (
    Answer,
    Connection,
    Dispatch,
    Listener,
    Request,
    Stream,
)
from llmgw.router.http.heads import DATE, head, status_line
from llmgw.runtime.httpserver import _one_line, _without_echo
from llmgw.runtime.logs import kv

log: Final = logging.getLogger(__name__)
# An answer's body up to this is joined to its head and sent in one write (one syscall).
_COALESCE_BYTES: Final = 64 * 1024
# llhttp's reason for a Content-Length of digits only whose value passes 2**64-1 (one
# with any other character is "Invalid character in Content-Length": a 400).
_CL_OVERFLOW: Final = "Content-Length overflow"

__all__ = [
    "Answer",
    "Dispatch",
    "FastProtocol",
    "FastServer",
    "Request",
    "Stream",
    "Whole",
]


class _HeadError(Exception):
    """A head the server refuses before parsing further (its message is the answer's)."""

    def __init__(self, why: str, status: int = 400) -> None:
        super().__init__(why)
        self.status = status


def _check_head(req: Request) -> None:
    """Refuse (`_HeadError`) a head llhttp parses but that this server must not serve."""
    version = req.version
    if version != "1.1" and version != "1.0":
        # llhttp takes `HTTP/2.0` (and 0.9) in a request line; the answer would be
        # HTTP/1.1 framing to a client that asked for something else.
        raise _HeadError(f"HTTP/{version} is not supported")
    headers = req.headers
    hosts = headers.getall("Host", ())
    if len(hosts) > 1 or (not hosts and version == "1.1"):
        # RFC 9112 3.2 (a MUST, as nginx does): with two, the router and a proxy in
        # front of it can each take another one for the request's name (the admin
        # routes' guard against rebound names reads it).
        raise _HeadError("an HTTP/1.1 request needs exactly one Host header")
    if "Transfer-Encoding" not in headers:
        return
    if version != "1.1":
        # Chunked framing is HTTP/1.1's: a proxy in front that frames this request
        # as 1.0 reads its body as further requests (RFC 9112 6.1; nginx refuses it).
        raise _HeadError("Transfer-Encoding needs HTTP/1.1")
    given = ",".join(headers.getall("Transfer-Encoding"))
    if [c.strip() for c in given.lower().split(",")] != ["chunked"]:
        # llhttp frames any list that ends in chunked as chunked and leaves the coding
        # before it on the body (`gzip, chunked` reached the JSON decoder as if plain),
        # and fails one without chunked only once its body begins, after a handler has
        # answered it. A coding the server does not implement: 501 (RFC 9112 6.1).
        why = f"Transfer-Encoding {given[:100]!r} is not implemented; only chunked is"
        raise _HeadError(why, 501)


class FastServer(Listener):
    """What every connection of one listening socket shares; `protocol` makes each."""

    def protocol(self) -> FastProtocol:
        return FastProtocol(self)


class FastProtocol(Connection):
    """One client connection, parsed and answered."""

    def __init__(self, server: Listener) -> None:
        super().__init__(server)
        # The charge of an answer written whose bytes the transport still holds
        # (`hand_over`); None: none.
        self.unsent: Hold | None = None

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
        req = Request(
            self,
            method.decode("ascii"),
            self.url.decode("latin-1"),
            # Not wrapped in a read-only CIMultiDictProxy, as aiohttp's are: nothing
            # writes to a request's headers, and the wrapper cost a call per request.
            CIMultiDict(self.fields),
            keep_alive=p.should_keep_alive(),
            version=p.get_http_version(),
        )
        _check_head(req)
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
        status = cause.status if isinstance(cause, _HeadError) else 400
        if why == _CL_OVERFLOW:
            # Digits only, past 2**64-1: a body larger than any limit, so the 413 any
            # Content-Length over max_body_bytes gets, not a 400 for a malformed head.
            why, status = f"Request body is larger than {self._limit_of_url()} bytes.", 413
        self.closing = True
        self._cancel_timers()
        cur = self.cur
        if cur is not None and not self.in_head and cur is self._handling:
            # Broken framing in the body of the request being handled: its read() fails.
            cur._fail(exc)
            return
        self._refuse_head(why, status)

    def _limit_of_url(self) -> int:
        """The body limit of the path of the head being read: `max_upload_bytes` on an
        upload path (Request.body_limit), else `max_body_bytes`. Named in the 413 of a
        Content-Length past 2**64-1, which comes before there is a Request."""
        server = self.server
        path = self.url.partition(b"?")[0].decode("latin-1")
        if "%" in path:
            path = unquote(path)
        return server.max_upload_bytes if path in server.upload_paths else server.max_body_bytes

    def _refuse_head(self, why: str, status: int = 400) -> None:
        """A 400 (or `status`) for a request that cannot be parsed, then close (after any
        answer in progress)."""
        self.closing = True
        self._cancel_timers()
        if self.cur is not None and self.queue and self.queue[-1] is self.cur:
            # A pipelined request whose body broke: it will never be complete.
            self.queue.pop()
        self.cur = None
        log.warning(
            kv("refused request", server=self.edge.name, status=status, peer=self.remote, why=why)
        )
        text = _one_line(f"Bad HTTP request: {why}" if status == 400 else why)
        body = self.head_error()(status, text)
        answer = head(
            status,
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

    def _begin(self) -> Request:
        req = self.queue.popleft()
        self._handling = req
        self.started = False
        self.busy = True
        return req

    async def _run(self, first: Request) -> None:
        """Answer the connection's requests in turn until it closes.

        One task per connection, waiting between requests: a task per request cost
        more (asyncio registers each task in a WeakSet, in Python, and unregisters it
        when it is freed; the figure is in bench/RESULTS.md).
        """
        req: Request | None = first
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
            waiter: asyncio.Future[Request | None] = self.loop.create_future()
            self.idle_waiter = waiter
            try:
                req = await waiter
            except asyncio.CancelledError:
                return

    def _expected(self, req: Request) -> bool:
        """A request with an Expect header: whether the handler is to answer it (a 100
        Continue sent if the body is still to come), or it was refused (417, closing)."""
        expect = req.expect
        assert expect is not None
        if expect.lower() == "100-continue":
            # HTTP/1.0 has no 1xx: its 100-continue is ignored (RFC 9110 10.1.1), not
            # refused, and it gets no 100 it could not read.
            # Nor one for a body declared over the limit: the handler refuses it (413)
            # unread, and a 100 had the client send it all to be read and dropped.
            declared = req.content_length
            fits = (
                declared is None
                or declared <= self.server.max_body_bytes
                or declared <= req.body_limit()
            )
            if req.version == "1.1" and not req.complete and fits:
                self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            return True
        msg = f"Unknown Expect: {expect}"
        refusal = whole(417, self.server.error_for(req.path)(417, msg), content_type=JSON)
        self._send_whole(req, refusal, close=True)
        return False

    def _handler_failed(self, req: Request) -> None:
        """The handler raised: a 500 closing the connection, unless an answer had begun
        (then the connection is only closed)."""
        if self.started:
            return
        msg = "The server had an error while processing your request."
        resp = whole(500, self.server.error_for(req.path)(500, msg), content_type=JSON)
        self._send_whole(req, resp, close=True)

    def _answered(self, req: Request, resp: Answer) -> bool:
        """Write the handler's answer (a stream is already written); whether the
        connection may carry another request."""
        if type(resp) is Whole:
            close = resp.close or not req.keep_alive or not req.complete or self.draining
            self._send_whole(req, resp, close=close)
            return not close
        if isinstance(resp, Stream):
            return resp.keep_alive and resp._eof
        raise TypeError(f"a handler answered {type(resp).__name__}, not a Whole or a Stream")

    def _send_whole(self, req: Request, resp: Whole, *, close: bool) -> None:
        """Status line, the answer's lines, Date, Content-Length, Connection, the body."""
        if close:
            end = b"\r\nConnection: close\r\n\r\n"
        elif req.version == "1.0":
            end = b"\r\nConnection: keep-alive\r\n\r\n"
        else:
            end = b"\r\n\r\n"
        body = resp.body
        head = b"".join(
            (
                status_line(resp.status, None),
                resp.lines,
                DATE.get(),
                b"Content-Length: ",
                str(len(body)).encode("ascii"),
                end,
            )
        )
        self.started = True
        try:
            if req.method == "HEAD":
                self.send(head)
            elif len(body) <= _COALESCE_BYTES:
                self.send(head + body)
            else:
                # Joined, a large body (an engine's answer of up to max_answer_bytes) would
                # be copied whole once more, and that copy held until the client read it.
                self.send(head)
                self.send(body)
        finally:
            if resp.hold is not None:
                self.hand_over(resp.hold)

    def hand_over(self, hold: Hold) -> None:
        """An answer written, its charge to the held answers' bound given back now if the
        transport took its bytes (it is under its high-water mark), else once it drains
        or the connection is lost: a client that does not read keeps them in memory."""
        if not self.paused_writing or self.transport is None:
            hold.release()
        elif self.unsent is None:
            self.unsent = hold
        else:
            # Not while the runner drains before the next answer (`_run`); were it so,
            # the two charges go back together.
            self.unsent.n_bytes += hold.n_bytes
            hold.n_bytes = 0

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.unsent is not None:
            self.unsent.release()
            self.unsent = None

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        if self.unsent is not None:
            self.unsent.release()
            self.unsent = None

    def _finished(self, req: Request, keep: bool) -> bool:
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
                self._close_answered(transport)
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

    def _close_answered(self, transport: asyncio.Transport) -> None:
        """Close once the answer is out. `close()` waits until the write buffer is empty,
        and a client that reads none of it would keep the connection (a slot of the cap,
        a descriptor, the whole answer in memory) for as long as it stays: as a stream's
        writes (`drain`), what is left must shrink within each `idle_timeout_s`."""
        transport.close()
        left = transport.get_write_buffer_size()
        if left and self.linger_timer is None:
            idle_s = self.edge.limits.idle_timeout_s
            self.linger_timer = self.loop.call_later(idle_s, self._unsent_check, left)

    def _unsent_check(self, before: int) -> None:
        self.linger_timer = None
        transport = self.transport
        if transport is None:
            return
        left = transport.get_write_buffer_size()
        if left and left < before:
            # The client reads on, however slowly: another idle_timeout_s.
            idle_s = self.edge.limits.idle_timeout_s
            self.linger_timer = self.loop.call_later(idle_s, self._unsent_check, left)
        elif left:
            self._stalled()
