"""The router's lean upstream client against a scripted HTTP/1.1 peer on 127.0.0.1.

The peer is a few lines of raw asyncio (not one of our components) whose path
picks its behaviour, so each connection rule of `FastUpstream` — reuse, no
reuse after an error or an unread body, one retry of a stale pooled
connection, deadlines, the idle bound, cancellation — is seen on real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvloop

from llmgw.router.errors import UpstreamBroken, UpstreamConnectError, UpstreamTimeout
from llmgw.router.http.answers import HeldAnswers
from llmgw.router.request.attempts import Attempts, hold_within
from llmgw.router.upstream import fastconn
from llmgw.router.upstream.base import HeaderLines
from llmgw.router.upstream.fast import FastUpstream
from llmgw.testing.wait import until

JSON_BODY = b'{"ok":true}'
_CL = re.compile(rb"(?i)content-length:\s*(\d+)")


def _answer(body: bytes, *, ctype: bytes = b"application/json", extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: "
        + ctype
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n"
        + extra
        + b"\r\n"
        + body
    )


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Peer:
    """The scripted engine: counts connections, requests and closes it saw."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[str] = []
        self.heads: list[bytes] = []
        self.closed = 0
        self.gate = asyncio.Event()  # /sse sends its second event once set
        self.got_request = asyncio.Event()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self.gate.set()
        self._server.close()
        # Handlers parked in long waits are cancelled when their writers close.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def wait_closed(self, n: int, timeout_s: float = 5.0) -> None:
        await until(lambda: self.closed >= n, timeout_s=timeout_s, every_s=0.01, what=f"{n} closed")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        on_this = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                m = _CL.search(head)
                body = await reader.readexactly(int(m.group(1)) if m else 0)
                path = head.split(b" ", 2)[1].decode()
                self.requests.append(path)
                self.heads.append(head)
                self.got_request.set()
                on_this += 1
                if not await self._answer(path, body, on_this, reader, writer):
                    return
        finally:
            self.closed += 1
            writer.close()

    async def _answer(
        self,
        path: str,
        body: bytes,
        on_this: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer one request; False ends the connection."""
        if path == "/echo":
            writer.write(_answer(body))
        elif path == "/close":
            writer.write(_answer(JSON_BODY, extra=b"Connection: close\r\n"))
            await writer.drain()
            return False
        elif path == "/stale":
            if on_this > 1:  # as if the keep-alive timer fired as the request came in
                return False
            writer.write(_answer(JSON_BODY))
        elif path == "/drop":
            return False
        elif path in ("/sse", "/stall"):
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + _chunk(b"data: one\n\n")
            )
            await writer.drain()
            if path == "/stall":
                await reader.read()  # silent until the client leaves
                return False
            # The second event once the test opens the gate, unless the client leaves first.
            gate = asyncio.ensure_future(self.gate.wait())
            gone = asyncio.ensure_future(reader.read())
            await asyncio.wait((gate, gone), return_when=asyncio.FIRST_COMPLETED)
            for f in (gate, gone):
                f.cancel()
            await asyncio.gather(gate, gone, return_exceptions=True)
            if not gate.done() or gate.cancelled():
                return False
            writer.write(_chunk(b"data: two\n\n") + b"0\r\n\r\n")
        elif path == "/never":
            await reader.read()
            return False
        elif path == "/big":
            writer.write(_answer(b"x" * (3 * 1024 * 1024)))
        elif path == "/eof":
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
            await writer.drain()
            return False
        elif path == "/garbage":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: zz\r\n\r\n")
        await writer.drain()
        return True


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    p = Peer()
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


@pytest.fixture
async def client() -> AsyncIterator[FastUpstream]:
    c = FastUpstream(connect_timeout_s=2.0)
    await c.start()
    try:
        yield c
    finally:
        await c.close()


async def post(client: FastUpstream, peer: Peer, path: str, **kw: Any) -> Any:
    kw.setdefault("timeout_s", 5.0)
    return await client.post(
        peer.url(path),
        kw.pop("body", b'{"q":1}'),
        {"Content-Type": "application/json", "x-request-id": "r1"},
        endpoint_id="e0",
        **kw,
    )


class TestFastUpstream:
    """The fast upstream client against a scripted peer."""

    async def test_keep_alive_reuses_one_connection(self, peer: Peer, client: FastUpstream) -> None:
        """Sequential requests whose bodies are read go over one pooled connection."""
        for i in range(5):
            resp = await post(client, peer, "/echo", body=b'{"n":%d}' % i)
            assert (200, b'{"n":%d}' % i) == (resp.status, await resp.read())
            resp.close()  # a finished reply: no-op, the connection stays pooled
        assert (peer.connections, len(peer.requests), client.idle_connections()) == (1, 5, 1)

    async def test_headers_and_content_type(self, peer: Peer, client: FastUpstream) -> None:
        """Header lookup is case-insensitive; the content type is what the engine sent."""
        resp = await post(client, peer, "/echo")
        assert resp.content_type == "application/json"
        assert str(len(b'{"q":1}')) == resp.headers["content-length"]
        assert resp.headers.get("CONTENT-TYPE") == resp.headers.get("Content-Type")
        assert not resp.is_event_stream
        await resp.read()
        # No Content-Type at all: JSON, as the proxy relays it.
        resp = await post(client, peer, "/eof")
        assert (resp.content_type, resp.headers.get("Content-Type")) == ("application/json", None)
        assert await resp.read() == b"until the end"

    async def test_stream_arrives_chunk_by_chunk(self, peer: Peer, client: FastUpstream) -> None:
        """The first event is handed over before the engine has sent the second."""
        resp = await post(client, peer, "/sse")
        assert resp.is_event_stream
        assert await asyncio.wait_for(resp.chunk(), 2) == b"data: one\n\n"
        peer.gate.set()
        assert await asyncio.wait_for(resp.chunk(), 2) == b"data: two\n\n"
        assert await resp.chunk() == b""
        assert client.idle_connections() == 1

    async def test_connection_close_is_not_pooled(self, peer: Peer, client: FastUpstream) -> None:
        """An answer with `Connection: close` does not leave its connection in the pool."""
        resp = await post(client, peer, "/close")
        assert await resp.read() == JSON_BODY
        assert client.idle_connections() == 0
        resp = await post(client, peer, "/echo")
        await resp.read()
        assert peer.connections == 2

    async def test_unread_body_closes_the_connection(
        self, peer: Peer, client: FastUpstream
    ) -> None:
        """Closing a reply before its body ended drops the connection (the engine sees it)."""
        resp = await post(client, peer, "/sse")
        await resp.chunk()
        resp.close()
        await peer.wait_closed(1)
        assert client.idle_connections() == 0

    async def test_stale_pooled_connection_is_retried_once(
        self, peer: Peer, client: FastUpstream
    ) -> None:
        """A pooled connection that dies before any response byte is replaced, invisibly."""
        await (await post(client, peer, "/stale")).read()
        resp = await post(client, peer, "/stale")
        assert await resp.read() == JSON_BODY
        assert (peer.connections, len(peer.requests)) == (2, 3)

    async def test_fresh_connection_failure_is_not_retried(
        self, peer: Peer, client: FastUpstream
    ) -> None:
        """A new connection closed without an answer is the engine's failure: one attempt."""
        with pytest.raises(UpstreamConnectError):
            await post(client, peer, "/drop")
        assert len(peer.requests) == 1

    async def test_refused_connection(self, client: FastUpstream) -> None:
        """Nothing listening is a connect error, safe to retry elsewhere."""
        with pytest.raises(UpstreamConnectError):
            await client.post("http://127.0.0.1:9/v1", b"{}", {}, timeout_s=2.0, endpoint_id="e0")

    async def test_deadline_before_the_head(self, peer: Peer, client: FastUpstream) -> None:
        """No answer within the request's deadline is a timeout, and the connection closes."""
        with pytest.raises(UpstreamTimeout):
            await post(client, peer, "/never", timeout_s=0.2)
        await peer.wait_closed(1)

    async def test_idle_stream_times_out(self, peer: Peer, client: FastUpstream) -> None:
        """A stream silent for the idle bound ends with a timeout long before the deadline."""
        resp = await post(client, peer, "/stall", timeout_s=30.0, idle_timeout_s=0.3)
        assert await resp.chunk() == b"data: one\n\n"
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(UpstreamTimeout, match="no data"):
            await resp.chunk()
        assert 0.25 < loop.time() - t0 < 5.0
        await peer.wait_closed(1)

    async def test_idle_bound_does_not_cut_a_flowing_stream(
        self, peer: Peer, client: FastUpstream
    ) -> None:
        """A stream whose events keep coming within the bound is never cut by it."""
        resp = await post(client, peer, "/sse", idle_timeout_s=0.3)
        await resp.chunk()
        await asyncio.sleep(0.2)
        peer.gate.set()
        assert await resp.chunk() == b"data: two\n\n"
        assert await resp.chunk() == b""

    async def test_header_lines_go_out_as_written(self, peer: Peer, client: FastUpstream) -> None:
        """Headers given as their wire lines (the proxy's) are sent as they are, after
        Host and before the Content-Length the client adds; as a mapping they read back."""
        lines = HeaderLines(b"Content-Type: application/json\r\nx-request-id: r\xc3\xa9\r\n")
        assert dict(lines) == {"Content-Type": "application/json", "x-request-id": "r\u00e9"}
        body = b'{"q":2}'
        resp = await client.post(peer.url("/echo"), body, lines, timeout_s=5.0, endpoint_id="e0")
        assert await resp.read() == body
        head = peer.heads[-1]
        assert head.startswith(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1:")
        assert head.endswith(lines.lines + b"Content-Length: 7\r\n\r\n")

    async def test_deadlines_in_flight_share_one_timer(
        self, peer: Peer, client: FastUpstream
    ) -> None:
        """A short deadline sent after a long one still fires on time (the shared timer
        moves earlier), the long one is untouched by it, and nothing stays watched."""
        loop = asyncio.get_running_loop()
        long = asyncio.create_task(post(client, peer, "/never", timeout_s=30.0))
        await asyncio.wait_for(peer.got_request.wait(), 5)
        t0 = loop.time()
        with pytest.raises(UpstreamTimeout, match="no complete response"):
            await post(client, peer, "/never", timeout_s=0.2)
        assert 0.15 < loop.time() - t0 < 5.0
        assert not long.done()
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        await peer.wait_closed(2)
        resp = await post(client, peer, "/echo")
        await resp.read()
        watch = client._watch
        assert watch is not None
        assert not watch.busy

    async def test_idle_bounds_in_flight_are_each_kept(
        self, peer: Peer, client: FastUpstream
    ) -> None:
        """Two stalled streams with different idle bounds: each ends at its own."""
        loop = asyncio.get_running_loop()
        slow = await post(client, peer, "/stall", timeout_s=30.0, idle_timeout_s=1.5)
        fast = await post(client, peer, "/stall", timeout_s=30.0, idle_timeout_s=0.3)
        assert await slow.chunk() == await fast.chunk() == b"data: one\n\n"
        t0 = loop.time()
        with pytest.raises(UpstreamTimeout, match=r"no data for 0\.3s"):
            await fast.chunk()
        mid = loop.time() - t0
        with pytest.raises(UpstreamTimeout, match=r"no data for 1\.5s"):
            await slow.chunk()
        end = loop.time() - t0
        assert 0.25 < mid < 1.0 < end < 10.0
        await peer.wait_closed(2)

    async def test_cancel_while_waiting_closes_the_connection(
        self, peer: Peer, client: FastUpstream
    ) -> None:
        """A request cancelled before its head (the client left) drops the engine's connection."""
        task = asyncio.create_task(post(client, peer, "/never"))
        await asyncio.wait_for(peer.got_request.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await peer.wait_closed(1)

    async def test_large_body_is_read_whole(self, peer: Peer, client: FastUpstream) -> None:
        """A body past the high-water mark pauses and resumes the socket, losing nothing."""
        resp = await post(client, peer, "/big")
        assert len(await resp.read()) == 3 * 1024 * 1024
        resp = await post(client, peer, "/echo")
        await resp.read()
        assert peer.connections == 1

    async def test_body_until_close(self, peer: Peer, client: FastUpstream) -> None:
        """A body with neither length nor chunks ends when the engine closes the connection."""
        resp = await post(client, peer, "/eof")
        assert await resp.read() == b"until the end"

    async def test_unparsable_answer_is_broken(self, peer: Peer, client: FastUpstream) -> None:
        """A head that is not HTTP is an error, and the connection is not kept."""
        with pytest.raises(UpstreamBroken):
            await post(client, peer, "/garbage")
        await peer.wait_closed(1)
        assert client.idle_connections() == 0

    async def test_idle_connections_expire(self, peer: Peer, client: FastUpstream) -> None:
        """A connection idle past the keep-alive bound is closed by the sweep."""
        await (await post(client, peer, "/echo")).read()
        loop = asyncio.get_running_loop()
        assert client.tick(loop.time()) == 0
        assert client.tick(loop.time() + client.keepalive_s) == 1
        await peer.wait_closed(1)
        assert client.idle_connections() == 0

    async def test_header_line_breaks_are_refused(self, peer: Peer, client: FastUpstream) -> None:
        """A header value with a line break never reaches the wire."""
        with pytest.raises(ValueError, match="line break"):
            await client.post(
                peer.url("/echo"),
                b"{}",
                {"x-request-id": "a\r\nX-Evil: 1"},
                timeout_s=2.0,
                endpoint_id="e0",
            )


class TestWholeAnswerInHand:
    """A whole answer that came in with its head is held without looking up a header."""

    async def test_no_header_is_looked_up(
        self, peer: Peer, client: FastUpstream, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The usual answer is taken as `read()` takes it: no `Headers` object is built for
        its Content-Length (bench/RESULTS.md: about 1,700 instructions an answer)."""
        built: list[int] = []

        class Counted(fastconn.Headers):
            __slots__ = ()

            def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
                built.append(1)
                super().__init__(raw)

        resp = await post(client, peer, "/echo")
        monkeypatch.setattr(fastconn, "Headers", Counted)
        answers, att = HeldAnswers(1 << 20), Attempts(0.0, 0)
        assert await hold_within(resp, 1000, answers, att)
        assert (att.data, att.held, answers.held_bytes) == (b'{"q":1}', 7, 7)
        assert built == []

    async def test_one_over_the_bound_is_not_held_whole(
        self, peer: Peer, client: FastUpstream
    ) -> None:
        """In hand but over the bound: not taken (its declared length says so), left to
        be relayed as it comes."""
        resp = await post(client, peer, "/echo")
        answers, att = HeldAnswers(1 << 20), Attempts(0.0, 0)
        assert not await hold_within(resp, 3, answers, att)
        assert (att.data, att.held, answers.held_bytes) == (b"", 0, 0)
        assert await resp.read() == b'{"q":1}'


class TestOnUvloop:
    """The fast client's core rules on uvloop."""

    def test_core_rules_on_uvloop(self) -> None:
        """The router runs uvloop, whose transports differ: reuse, streaming, the stale
        retry, dropping an unread body and the idle bound hold there too."""

        async def scenario() -> None:
            peer = Peer()
            await peer.start()
            client = FastUpstream()
            await client.start()
            try:
                for _ in range(3):
                    await (await post(client, peer, "/stale")).read()
                assert (
                    peer.connections,
                    len(peer.requests),
                    client.idle_connections(),
                ) == (3, 5, 1)
                resp = await post(client, peer, "/sse")
                assert await asyncio.wait_for(resp.chunk(), 2) == b"data: one\n\n"
                resp.close()
                await peer.wait_closed(3)
                resp = await post(client, peer, "/stall", idle_timeout_s=0.2)
                await resp.chunk()
                with pytest.raises(UpstreamTimeout, match="no data"):
                    await resp.chunk()
            finally:
                await client.close()
                await peer.stop()

        uvloop.run(scenario())
