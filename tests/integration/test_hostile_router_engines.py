"""What engines send the router, at the wire: interim answers, oversized heads, trailers,
an endless /metrics.

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
from tests.integration.hostile import RawEngine, Script, no_traceback
from tests.integration.router_fixtures import base_config, chat_body, post, router

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
