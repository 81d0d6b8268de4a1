"""What engines send the router, at the wire: interim answers, invalid statuses, oversized
heads, trailers, streams cut inside an event, an endless /metrics, /metrics values no
float holds.

Each test puts a `RawEngine` (raw asyncio on 127.0.0.1, standing in for an outside
engine) behind a real router process and looks at what the client gets, whether the
router's log stays clean, and whether its in-flight gauge returns to zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing import Program
from llmgw.testing.wait import until
from tests.integration.hostile import CLOSE, RawEngine, Script, no_traceback
from tests.integration.router_fixtures import (
    base_config,
    chat_body,
    post,
    router,
    snapshot,
)

pytestmark = pytest.mark.timeout(90)

CHAT: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}


def json_answer(doc: Any, *, extra: bytes = b"") -> bytes:
    body = json.dumps(doc).encode()
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


@contextlib.asynccontextmanager
async def behind_router(
    tmp_path: Path, script: Callable[[int], Script], **over: Any
) -> AsyncIterator[tuple[RawEngine, Program]]:
    """A router whose one endpoint, e0, is a `RawEngine` playing `script`."""
    engine = RawEngine(script)
    await engine.start()
    try:
        entries = [{"id": "e0", "url": engine.url, "models": ["m"]}]
        with router(tmp_path, base_config(endpoints=entries, **over)) as r:
            yield engine, r
    finally:
        await engine.stop()


async def inflight(session: aiohttp.ClientSession, url: str) -> float:
    """The router's `llmgw_router_inflight` gauge for e0."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith('llmgw_router_inflight{endpoint="e0"}'):
            return float(line.split()[-1])
    raise AssertionError("no inflight gauge for e0")


async def settled(session: aiohttp.ClientSession, url: str) -> None:
    """Until the router has nothing in flight at e0."""

    async def zero() -> bool:
        return await inflight(session, url) == 0.0

    await until(zero, timeout_s=10, what="nothing in flight at e0")


class TestInterimAnswers:
    """An engine's 1xx interim answers are not the answer."""

    async def test_continue_and_early_hints_are_skipped(self, tmp_path: Path) -> None:
        """100 Continue and 103 Early Hints before the 200: the client gets the 200 and its
        body, twice over one kept connection, never a 1xx with nothing after it."""
        pieces = [
            b"HTTP/1.1 100 Continue\r\n\r\n",
            b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
            json_answer(CHAT),
        ]
        async with (
            behind_router(tmp_path, lambda n: Script(pieces)) as (engine, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            reps = [await post(session, r.url, chat_body(f"q{i}")) for i in range(2)]
            assert [x.status for x in reps] == [200, 200], [x.body for x in reps]
            assert [x.json() for x in reps] == [CHAT, CHAT]
            assert "link" not in reps[0].headers
            assert engine.connections == 1
            await settled(session, r.url)
            no_traceback(r.log_text())

    async def test_switching_protocols_is_an_engine_failure(self, tmp_path: Path) -> None:
        """A 101 the router never asked for is the engine's failure: an error in OpenAI's
        shape naming it, no traceback, nothing left in flight."""
        pieces = [
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
        ]
        async with (
            behind_router(tmp_path, lambda n: Script(pieces)) as (_, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            rep = await post(session, r.url, chat_body("upgrade?"))
            assert rep.status >= 500, (rep.status, rep.body)
            assert "switched protocols" in rep.json()["error"]["message"]
            await settled(session, r.url)
            no_traceback(r.log_text())

    async def test_an_interim_answer_with_a_body_is_an_engine_failure(self, tmp_path: Path) -> None:
        """A 1xx with a Content-Length is no interim answer: its bytes never reach the
        client as the answer's body, which gets an error naming it instead."""
        pieces = [b"HTTP/1.1 199 Odd\r\nContent-Length: 5\r\n\r\nxxxxx", json_answer(CHAT)]
        async with (
            behind_router(tmp_path, lambda n: Script(pieces)) as (_, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            rep = await post(session, r.url, chat_body("odd"))
            assert rep.status >= 500, (rep.status, rep.body)
            assert "interim answer (199) with a body" in rep.json()["error"]["message"]
            await settled(session, r.url)
            no_traceback(r.log_text())


class TestInvalidStatus:
    """A status outside 100 to 599 is the engine's failure."""

    @pytest.mark.parametrize("status", [b"999 Odd", b"600", b"099 Odd"])
    async def test_it_is_an_error_naming_it(self, tmp_path: Path, status: bytes) -> None:
        """999 and 600 (relayed as they came, and retried as a 5xx) and 099 (passed over
        as interim, the request then waiting out its deadline) are an error in OpenAI's
        shape naming the status at once; the next request is served."""
        bad = b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\n{}"
        async with (
            behind_router(tmp_path, lambda n: Script([bad] if n == 0 else [json_answer(CHAT)])) as (
                _,
                r,
            ),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            rep = await post(session, r.url, chat_body("odd status"))
            assert rep.status == 503, (rep.status, rep.body)
            code = status[:3].decode()
            assert f"invalid status {code}" in rep.json()["error"]["message"]
            after = await post(session, r.url, chat_body("plain"))
            assert (after.status, after.json()) == (200, CHAT)
            await settled(session, r.url)
            no_traceback(r.log_text())


class TestOversizedHead:
    """An engine's head has a bound."""

    async def test_an_endless_header_line_is_cut(self, tmp_path: Path) -> None:
        """A header line that keeps coming (16 MiB of it) is cut at the head's bound: the
        client gets an error naming it, never the answer behind it, and the router serves
        on with nothing left in flight."""
        endless = [b"HTTP/1.1 200 OK\r\nX-Pad: "] + [b"a" * 65536] * 256
        pieces = [*endless, b"\r\n" + json_answer(CHAT).partition(b"\r\n")[2]]
        async with (
            behind_router(
                tmp_path, lambda n: Script(pieces if n == 0 else [json_answer(CHAT)])
            ) as (engine, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            rep = await post(session, r.url, chat_body("pad"))
            assert rep.status >= 500, (rep.status, rep.body[:200])
            assert "response head over 64 KiB" in rep.json()["error"]["message"]
            after = await post(session, r.url, chat_body("plain"))
            assert after.status == 200
            assert after.json() == CHAT
            assert engine.posts == 2
            await settled(session, r.url)
            no_traceback(r.log_text())


class TestTrailers:
    """An engine's trailer lines are not its head's."""

    async def test_a_trailer_does_not_set_the_answers_content_type(self, tmp_path: Path) -> None:
        """A chunked answer without Content-Type whose trailer says `text/html`: the client
        gets the body as JSON (the default for an answer without one), not as HTML."""
        body = json.dumps(CHAT).encode()
        pieces = [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            f"{len(body):x}\r\n".encode() + body + b"\r\n",
            b"0\r\nContent-Type: text/html\r\n\r\n",
        ]
        async with (
            behind_router(tmp_path, lambda n: Script(pieces)) as (_, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            rep = await post(session, r.url, chat_body("trailer"))
            assert rep.status == 200
            assert rep.headers["content-type"] == "application/json"
            assert rep.json() == CHAT
            no_traceback(r.log_text())


class TestOddErrorEvents:
    """An engine's error event the router cannot read a code from is relayed as it came."""

    async def test_a_code_of_odd_digits_is_relayed(self, tmp_path: Path) -> None:
        """A stream whose error event's code is `"²"` (a digit to Python, not to int()):
        the client gets the stream as the engine sent it, to its [DONE], and the router
        logs no traceback and keeps nothing in flight."""
        events = [
            b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
            b'"delta":{"content":"hi"},"finish_reason":null}]}\n\n',
            b'data: {"error":{"message":"odd","code":"\xc2\xb2"}}\n\n',
            b"data: [DONE]\n\n",
        ]
        body = b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events) + b"0\r\n\r\n"
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        async with (
            behind_router(tmp_path, lambda n: Script([head + body])) as (_, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            rep = await post(session, r.url, chat_body("odd", stream=True))
            assert rep.status == 200
            assert rep.body == b"".join(events)
            await settled(session, r.url)
            no_traceback(r.log_text())


class TestStreamCutInsideAnEvent:
    """A stream cut inside an event still ends with a whole error event."""

    @pytest.mark.parametrize("cut", [b'data: {"id":"c","object":"chat.compl', b"data: x\r"])
    async def test_the_error_event_is_an_event_of_its_own(self, tmp_path: Path, cut: bytes) -> None:
        """An engine that closes after half an event (or after a line's CR): the client's
        last two events are the router's error event, whole JSON, and `[DONE]` (the error
        was written onto the half event's line, one event of broken JSON)."""
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        first = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
        pieces = [head, b"%x\r\n%s\r\n" % (len(first), first), b"%x\r\n%s\r\n" % (len(cut), cut)]
        async with (
            behind_router(tmp_path, lambda n: Script(pieces, then=CLOSE)) as (_, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            rep = await post(session, r.url, chat_body("cut", stream=True))
            assert rep.status == 200
            blocks = rep.body.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n\n")
            assert blocks[-1] == b""
            assert blocks[-2] == b"data: [DONE]"
            error = json.loads(blocks[-3].removeprefix(b"data: "))["error"]
            assert error["code"] == 502
            assert "stream broke" in error["message"]
            await settled(session, r.url)
            no_traceback(r.log_text())


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


class EndlessMetrics:
    """An engine whose /metrics answer never ends (a comment line of 1 MiB after another)."""

    def __init__(self) -> None:
        self.port = 0
        self.scrapes = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = b"# " + b"x" * (1 << 20) + b"\n"
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            self.scrapes += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
            while True:
                writer.write(line)
                await writer.drain()
        writer.close()


class TestEndlessMetrics:
    """An engine's /metrics answer has a bound."""

    async def test_an_endless_metrics_answer_is_cut(self, tmp_path: Path) -> None:
        """An endless /metrics is cut at the scrape's bound: a failed scrape saying so,
        and the router's memory does not take in what the engine sends."""
        engine = EndlessMetrics()
        server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            conf = base_config(endpoints=[{"id": "e0", "url": url, "models": ["m"]}])
            with router(tmp_path, conf) as r:
                base = peak_rss_kib(r.pid)

                def cut() -> bool:
                    return "answer over 4 MiB" in r.log_text()

                await until(cut, timeout_s=20, what="a scrape cut at its bound")
                await until(lambda: engine.scrapes >= 4, timeout_s=20, what="more scrapes")
                # Before: every scrape read all it could for its 1.5 s (hundreds of MiB).
                assert peak_rss_kib(r.pid) - base < 64 * 1024
                no_traceback(r.log_text())
        finally:
            server.close()


GOOD_METRICS = b"vllm:num_requests_running 3\nvllm:num_requests_waiting 0\n"


class MetricsEngine:
    """An engine whose /metrics answers `metrics` (changed by the test) and whose POSTs
    answer CHAT."""

    def __init__(self, metrics: bytes) -> None:
        self.metrics = metrics
        self.scrapes = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"POST "):
                    for line in head.split(b"\r\n"):
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            await reader.readexactly(int(value))
                    writer.write(json_answer(CHAT))
                else:
                    self.scrapes += 1
                    body = self.metrics
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                    writer.write(body)
                await writer.drain()
        writer.close()


class TestMetricsValuesNoFloatHolds:
    """An engine's absurd /metrics values fail its scrape, never the scrape loop or a
    request."""

    async def test_the_router_scrapes_and_serves_on(self, tmp_path: Path) -> None:
        """A block count of 300 digits (its capacity made every request 500), then +Inf
        and -Inf in one series (they ended the scrape loop: no endpoint was scraped
        again): requests are served, and a sound answer after them is read."""
        big = b"9" * 300
        engine = MetricsEngine(
            GOOD_METRICS
            + b'vllm:cache_config_info{block_size="'
            + big
            + b'",num_gpu_blocks="'
            + big
            + b'"} 1\n'
        )
        server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            conf = base_config(endpoints=[{"id": "e0", "url": url, "models": ["m"]}])
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                with router(tmp_path, conf) as r:
                    await until(
                        lambda: snapshot(r.url, "e0")["stats"] is not None,
                        timeout_s=10,
                        blocking=True,
                        what="e0 scraped",
                    )
                    rep = await post(session, r.url, chat_body("capacity"))
                    assert (rep.status, rep.json()) == (200, CHAT)
                    engine.metrics = (
                        b'vllm:num_requests_running +Inf\nvllm:num_requests_running{a="1"} -Inf\n'
                        b"vllm:num_requests_waiting 0\n"
                    )
                    seen = engine.scrapes
                    await until(lambda: engine.scrapes > seen + 2, timeout_s=10, what="scrapes")
                    engine.metrics = GOOD_METRICS.replace(b"running 3", b"running 5")

                    def read_again() -> bool:
                        stats = snapshot(r.url, "e0")["stats"]
                        return stats is not None and stats["running"] == 5

                    await until(read_again, timeout_s=10, blocking=True, what="e0 read again")
                    no_traceback(r.log_text())
        finally:
            server.close()
