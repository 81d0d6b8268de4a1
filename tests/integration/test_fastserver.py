"""The protocol-level server (router/http/server.py) on its own, in this process.

A real listening socket on 127.0.0.1 with a test dispatch, driven by raw bytes:
the cases the router's suites cannot reach on purpose (a handler that fails, an
answer in progress when a pipelined head stalls, stopping with connections
busy and idle). Each waits for a condition with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llmgw.router.http.answers import whole
from llmgw.router.http.server import Answer, FastServer, Request
from llmgw.runtime.httpserver import Edge, ServerLimits, openai_error
from llmgw.testing.wait import until

pytestmark = pytest.mark.timeout(60)


class Harness:
    def __init__(self, server: FastServer, port: int) -> None:
        self.server = server
        self.port = port
        self.release = asyncio.Event()
        self.entered = asyncio.Event()

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


async def shut(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers, body


@contextlib.asynccontextmanager
async def serving(**limits: Any) -> AsyncIterator[Harness]:
    edge = Edge(ServerLimits(**limits), openai_error, name="test")
    h: Harness

    async def dispatch(req: Request) -> Answer:
        if req.path == "/fail":
            raise RuntimeError("a bug")
        if req.path == "/wait":
            h.entered.set()
            await h.release.wait()
        if req.path == "/big":
            return whole(200, b"x" * 65536)
        if req.path == "/headers":
            return whole(200, json.dumps(list(req.headers.items())).encode())
        if req.path == "/reply":
            return whole(201, b"relayed", {"Content-Type": "text/plain", "X-Engine": "e0"})
        body = await req.read()
        return whole(200, json.dumps({"path": req.path, "n": len(body)}).encode())

    server = FastServer(edge, dispatch, max_body_bytes=1024)
    listener = await asyncio.get_running_loop().create_server(server.protocol, "127.0.0.1", 0)
    h = Harness(server, listener.sockets[0].getsockname()[1])
    try:
        yield h
    finally:
        listener.close()
        await server.shutdown(1.0)


class TestFastServer:
    """The protocol-level server's HTTP/1.1 behaviour on its own."""

    async def test_a_handler_that_raises_is_a_json_500_and_the_connection_closes(self) -> None:
        """A handler that raises gives a JSON 500 and the connection closes."""
        async with serving() as h:
            reader, writer = await h.connect()
            writer.write(b"GET /fail HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = await read_answer(reader)
            assert status == 500
            assert json.loads(body)["error"]["code"] == "internal_error"
            assert headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 10) == b""
            await shut(writer)

    async def test_a_stalled_pipelined_head_gets_its_408_after_the_answer_in_progress(self) -> None:
        """A stalled pipelined head gets its 408 after the answer in progress."""
        async with serving(header_timeout_s=0.2) as h:
            reader, writer = await h.connect()
            writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHo")
            await h.entered.wait()
            conn = next(iter(h.server.conns))
            await until(lambda: conn.refuse is not None, every_s=0.01)
            h.release.set()
            status, _, body = await read_answer(reader)
            assert (status, json.loads(body)["path"]) == (200, "/wait")
            status, _, body = await read_answer(reader)
            assert status == 408
            assert json.loads(body)["error"]["code"] == "request_timeout"
            assert await asyncio.wait_for(reader.read(), 10) == b""
            await shut(writer)

    async def test_past_max_connections_a_503_and_the_established_served_on(self) -> None:
        """Past max connections a new client gets a 503 and the established ones are served on."""
        async with serving(max_connections=1) as h:
            r1, w1 = await h.connect()
            await until(lambda: len(h.server.conns) == 1, every_s=0.01)
            r2, w2 = await h.connect()
            status, _, body = await read_answer(r2)
            assert status == 503
            assert json.loads(body)["error"]["code"] == "too_many_connections"
            w1.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
            status, _, body = await read_answer(r1)
            assert (status, json.loads(body)["n"]) == (200, 3)
            await shut(w1)
            await shut(w2)

    async def test_a_whole_answer_is_written_with_its_headers_and_keeps_the_connection(
        self,
    ) -> None:
        """A `Whole` answer goes out with its status, headers and a Content-Length,
        and the connection serves the next request."""
        async with serving() as h:
            reader, writer = await h.connect()
            for _ in range(2):
                writer.write(b"GET /reply HTTP/1.1\r\nHost: x\r\n\r\n")
                status, headers, body = await read_answer(reader)
                assert (status, body) == (201, b"relayed")
                assert headers["x-engine"] == "e0"
                assert headers["content-type"] == "text/plain"
                assert headers["content-length"] == "7"
                assert "connection" not in headers
            writer.write(b"HEAD /reply HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            head = await asyncio.wait_for(reader.read(), 10)
            assert head.startswith(b"HTTP/1.1 201 Created\r\n")
            assert head.endswith(b"\r\n\r\n")  # HEAD: no body, then closed
            await shut(writer)

    async def test_the_idle_bound_counts_from_the_last_answer_not_the_first_arming(self) -> None:
        """One idle timer per connection, not moved per request: when it fires after a
        request it looks again, so a connection is closed `idle_timeout_s` after its last
        answer, and never while a request is in progress."""
        loop = asyncio.get_running_loop()
        async with serving(idle_timeout_s=2.0) as h:
            reader, writer = await h.connect()
            t0 = loop.time()
            await asyncio.sleep(1.0)
            writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_answer(reader))[0] == 200
            answered = loop.time()
            # Past the first arming's 2 s, within 2 s of the answer: still open.
            await asyncio.sleep(max(0.0, t0 + 2.4 - loop.time()))
            writer.write(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_answer(reader))[0] == 200
            answered = loop.time()
            assert await asyncio.wait_for(reader.read(), 10) == b""
            assert loop.time() - answered >= 1.9
            await shut(writer)
        async with serving(idle_timeout_s=0.3) as h:
            reader, writer = await h.connect()
            writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
            await h.entered.wait()
            await asyncio.sleep(0.8)  # the timer fires while the request is in progress
            h.release.set()
            assert (await read_answer(reader))[0] == 200
            assert await asyncio.wait_for(reader.read(), 10) == b""  # then idle: closed
            await shut(writer)

    async def test_idle_connections_close_and_stopping_lets_the_busy_one_finish(self) -> None:
        """Idle connections close and stopping lets the busy one finish."""
        async with serving(idle_timeout_s=0.3) as h:
            r1, w1 = await h.connect()
            assert await asyncio.wait_for(r1.read(), 10) == b""  # idle: closed by the server
            await shut(w1)
        async with serving() as h:
            idle_r, idle_w = await h.connect()
            busy_r, busy_w = await h.connect()
            busy_w.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
            await h.entered.wait()
            stopping = asyncio.ensure_future(h.server.shutdown(5.0))
            assert await asyncio.wait_for(idle_r.read(), 10) == b""
            h.release.set()
            status, headers, _ = await read_answer(busy_r)
            assert status == 200
            assert headers["connection"] == "close"
            await stopping
            await shut(idle_w)
            await shut(busy_w)

    async def test_body_framing_broken_mid_body_is_the_handlers_400(self) -> None:
        """Body framing broken mid-body is the handler's 400."""
        async with serving() as h:
            reader, writer = await h.connect()
            writer.write(
                b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nabc\r\nzz\r\n"
            )
            # The test dispatch does not catch BodyBroken: a handler bug, a 500;
            # the router's intake turns it into a 400 (test_hostile_router.py).
            status, _, _ = await read_answer(reader)
            assert status == 500
            assert await asyncio.wait_for(reader.read(), 10) == b""
            await shut(writer)

    async def test_pipelined_answers_wait_for_a_client_that_does_not_read(self) -> None:
        """Pipelined answers wait for a client that does not read."""
        # A client that pipelines requests for large answers and reads none of them:
        # the server answers the next only once the last has drained, so what it holds
        # for the connection stays near the transport's high-water mark (not 300 answers).
        n = 300
        async with serving() as h:
            reader, writer = await h.connect()
            writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * n)
            await until(lambda: len(h.server.conns) == 1, every_s=0.01)
            conn = next(iter(h.server.conns))
            await until(lambda: conn.drain_waiter is not None, every_s=0.01)
            assert conn.transport is not None
            assert conn.transport.get_write_buffer_size() < 1024 * 1024
            assert len(conn.queue) > n // 2
            for _ in range(n):
                status, _, body = await read_answer(reader)
                assert (status, len(body)) == (200, 65536)
            await until(lambda: not conn.busy and not conn.queue, every_s=0.01)
            await shut(writer)

    async def test_a_bad_pipelined_request_is_refused_after_those_before_it_are_answered(
        self,
    ) -> None:
        """A bad pipelined request is refused after those before it are answered."""
        # /b was parsed whole before the garbage: it gets its own answer, then the 400
        # (answered out of turn, the 400 would read as /b's and /b would go unanswered).
        async with serving() as h:
            reader, writer = await h.connect()
            writer.write(
                b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET / HTTP/1.1\r\nHost x\r\n\r\n"
            )
            await h.entered.wait()
            conn = next(iter(h.server.conns))
            await until(lambda: conn.refuse is not None, every_s=0.01)
            h.release.set()
            for path in ("/wait", "/b"):
                status, _, body = await read_answer(reader)
                assert (status, json.loads(body)["path"]) == (200, path)
            status, headers, body = await read_answer(reader)
            assert status == 400
            assert headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 10) == b""
            await shut(writer)

    @pytest.mark.parametrize(
        ("te", "status", "says"),
        [
            (b"Transfer-Encoding: Chunked", 400, "Content-Length"),
            # A coding before chunked is refused before the upgrade is looked at.
            (b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked", 501, "gzip"),
        ],
    )
    async def test_an_upgrade_request_with_any_chunked_body_is_refused(
        self, te: bytes, status: int, says: str
    ) -> None:
        """An upgrade request with any chunked body is refused."""
        # llhttp stops at an upgrade request's head: a chunked body after it would be
        # parsed as the next request (the chunks' bytes read as a request of their own).
        async with serving() as h:
            reader, writer = await h.connect()
            writer.write(
                b"POST /x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"
                + te
                + b"\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
            )
            got, _, body = await read_answer(reader)
            assert got == status
            assert says in json.loads(body)["error"]["message"]
            assert await asyncio.wait_for(reader.read(), 10) == b""
            await shut(writer)

    async def test_a_pipelined_body_waits_in_the_socket_until_its_turn(self) -> None:
        """A pipelined body waits in the socket until its turn."""
        # Its bytes are not the handler's yet (nor counted against the router's body
        # budget): reading stops at its head, and resumes when its handler reads.
        async with serving() as h:
            reader, writer = await h.connect()
            writer.write(
                b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"
                b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
            )
            await h.entered.wait()
            conn = next(iter(h.server.conns))
            await until(lambda: conn.cur is not None, every_s=0.01)
            assert conn.paused_reading
            writer.write(b"a" * 1000)
            h.release.set()
            status, _, body = await read_answer(reader)
            assert (status, json.loads(body)["path"]) == (200, "/wait")
            status, _, body = await read_answer(reader)
            assert (status, json.loads(body)["n"]) == (200, 1000)
            await shut(writer)

    async def test_a_head_begun_behind_an_answer_gets_its_408_not_the_idle_close(self) -> None:
        """A head begun behind an answer gets its 408, not the idle close."""
        # idle_timeout_s shorter than header_timeout_s: the head in progress is not idle.
        async with serving(idle_timeout_s=0.1, header_timeout_s=2.0) as h:
            reader, writer = await h.connect()
            writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHo")
            await h.entered.wait()
            h.release.set()
            status, _, _ = await read_answer(reader)
            assert status == 200
            status, _, body = await read_answer(reader)
            assert status == 408
            assert json.loads(body)["error"]["code"] == "request_timeout"
            await shut(writer)

    async def test_a_client_that_reads_nothing_of_its_answer_is_closed_after_idle_timeout(
        self,
    ) -> None:
        """A client that reads nothing of its answer is closed after idle timeout."""
        # Its connection slot (and, in the router, the engine's stream) comes back.
        async with serving(idle_timeout_s=0.3) as h:
            _reader, writer = await h.connect()
            writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 300)
            await until(lambda: len(h.server.conns) == 1, every_s=0.01)
            conn = next(iter(h.server.conns))
            await until(lambda: conn.drain_waiter is not None, every_s=0.01)
            await until(lambda: not h.server.conns and h.server.edge.open == 0, every_s=0.01)
            await shut(writer)

    async def test_an_endless_trailer_line_is_refused_not_buffered(self) -> None:
        """An endless trailer line is refused, not buffered."""
        # httptools keeps a trailer line until it ends, outside max_body_bytes: bounded
        # like a head (max_line_bytes × (max_headers + 2)), then the body's read() fails.
        async with serving(max_line_bytes=100, max_headers=10) as h:
            reader, writer = await h.connect()
            writer.write(
                b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nabc\r\n0\r\nX: "
            )
            for _ in range(16):
                writer.write(b"a" * 4096)
            # The test dispatch does not catch BodyBroken: a 500 (the router's
            # intake makes it a 400), and the connection closes.
            status, _, _ = await read_answer(reader)
            assert status == 500
            assert await asyncio.wait_for(reader.read(), 10) == b""
            await shut(writer)

    async def test_many_pipelined_upgrade_requests_in_one_read_are_all_answered(self) -> None:
        """Many pipelined upgrade requests in one read are all answered."""
        # Each `Upgrade` request hands the bytes after it to a fresh parser: in a loop,
        # not by recursion (a read of 1,200 of them overflowed the stack and the
        # connection died with a traceback in the log).
        n = 1200
        async with serving() as h:
            reader, writer = await h.connect()
            writer.write(
                b"GET /u HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n" * n
            )
            for _ in range(n):
                status, _, body = await read_answer(reader)
                assert (status, json.loads(body)["path"]) == (200, "/u")
            await shut(writer)

    async def test_a_head_the_server_stopped_reading_is_not_late(self) -> None:
        """A head the server stopped reading is not late."""
        # /b is queued (reading stops), /c's head is half in: its rest waits in the
        # socket while /wait is answered, which is no slowness of the client's.
        async with serving(header_timeout_s=0.2) as h:
            reader, writer = await h.connect()
            writer.write(
                b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /c HTTP/1.1\r\nHo"
            )
            await h.entered.wait()
            conn = next(iter(h.server.conns))
            await until(lambda: conn.in_head and conn.head_timer is not None, every_s=0.01)
            first = conn.head_timer
            await until(lambda: conn.head_timer is not first, every_s=0.01)
            assert conn.refuse is None
            writer.write(b"st: x\r\n\r\n")
            h.release.set()
            for path in ("/wait", "/b", "/c"):
                status, _, body = await read_answer(reader)
                assert (status, json.loads(body)["path"]) == (200, path)
            await shut(writer)

    async def test_one_task_answers_a_connection_s_requests_and_ends_with_it(self) -> None:
        """One task answers a connection's requests and ends with it."""
        # Keep-alive requests one after another are answered by the connection's one task
        # (it waits between them); the client closing an idle connection ends that task,
        # and the server stopping ends the task of an idle connection still open.
        async with serving() as h:
            reader, writer = await h.connect()
            runners = []
            for i in range(5):
                writer.write(
                    b"POST /n HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % i + b"x" * i
                )
                status, _, body = await read_answer(reader)
                assert (status, json.loads(body)["n"]) == (200, i)
                conn = next(iter(h.server.conns))
                await until(lambda c=conn: not c.busy and c.idle_waiter is not None, every_s=0.01)
                runners.append(conn.runner)
            assert runners[0] is not None
            assert all(r is runners[0] for r in runners)
            assert not runners[0].done()
            await shut(writer)
            await asyncio.wait_for(runners[0], 10)
            assert not h.server.conns

            _, other = await h.connect()
            await until(lambda: len(h.server.conns) == 1, every_s=0.01)
            conn = next(iter(h.server.conns))
            other.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            await until(lambda: conn.idle_waiter is not None, every_s=0.01)
            runner = conn.runner
            assert runner is not None
            await h.server.shutdown(1.0)
            await asyncio.wait_for(runner, 10)
            await shut(other)

    async def test_header_values_past_ascii_reach_the_handler_as_utf8_with_surrogateescape(
        self,
    ) -> None:
        """Header values past ASCII reach the handler as UTF-8 with surrogateescape."""
        async with serving() as h:
            reader, writer = await h.connect()
            writer.write(
                b"GET /headers HTTP/1.1\r\nHost: x\r\nX-Plain: ok\r\nX-Utf8: caf\xc3\xa9\r\n"
                b"X-Bad: \xff\xfe\r\n\r\n"
            )
            status, _, body = await read_answer(reader)
            await shut(writer)
        assert status == 200
        assert json.loads(body) == [
            ["Host", "x"],
            ["X-Plain", "ok"],
            ["X-Utf8", "caf\u00e9"],
            ["X-Bad", "\udcff\udcfe"],
        ]

    async def test_length_and_expect_are_read_whatever_their_case(self) -> None:
        """Content-Length and Expect are read whatever their case."""
        async with serving() as h:
            reader, writer = await h.connect()
            writer.write(
                b"POST /x HTTP/1.1\r\nHost: x\r\ncontent-LENGTH: 3\r\nEXPECT: 100-continue\r\n\r\n"
            )
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == (
                b"HTTP/1.1 100 Continue\r\n\r\n"
            )
            writer.write(b"abc")
            status, _, body = await read_answer(reader)
            assert (status, json.loads(body)) == (200, {"path": "/x", "n": 3})
            writer.write(
                b"POST /y HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                b"expect: something-else\r\n\r\nz"
            )
            status, headers, _ = await read_answer(reader)
            await shut(writer)
        assert status == 417
        assert headers.get("connection") == "close"
