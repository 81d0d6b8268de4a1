"""Whole (non-stream) answers larger than the router holds: `max_answer_bytes`.

Each test puts a `BigEngine` (raw asyncio on 127.0.0.1, standing in for a buggy or
hostile engine) behind a real router process whose bound is 1 MiB, and looks at what
the client gets, the router's peak memory, and what it leaves in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing import Program
from tests.integration.hostile import no_traceback, peak_kib, read_post
from tests.integration.router_fixtures import base_config, chat_body, post, router
from tests.integration.test_hostile_router_engines import settled

pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024
BOUND = MIB
# What the engine sends at most of an answer it never ends: bounded, so that a router
# that buffers it all still fails the test instead of the machine.
CAP = 256 * MIB
PIECE = 256 * 1024


@dataclass
class Plan:
    """One answer: its status, its framing, its first bytes, then filler."""

    status: int = 200
    length: int | None = None  # the declared Content-Length; None: chunked
    body: bytes = b""
    filler: int = 0  # bytes of filler after `body`, as fast as the router takes them
    end: bool = True  # a chunked answer's last chunk is sent (else it is held open)


class BigEngine:
    """An engine answering every POST by its `Plan`, 404 to anything else; `sent` counts
    the body bytes it got written (the router's backpressure holds the rest back)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.sent = 0
        self.posts = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._stopping = asyncio.Event()
        self._handlers: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._stopping.set()
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._exchanges(reader, writer)
        except asyncio.CancelledError:
            pass
        finally:
            writer.transport.abort()
            self._handlers.discard(task)

    async def _exchanges(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                if not await read_post(reader, writer):
                    continue
                self.posts += 1
                await self._answer(writer)

    async def _answer(self, writer: asyncio.StreamWriter) -> None:
        plan = self.plan
        framing = (
            b"Transfer-Encoding: chunked"
            if plan.length is None
            else b"Content-Length: %d" % plan.length
        )
        writer.write(
            b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n%s\r\n\r\n"
            % (plan.status, framing)
        )
        await self._write(writer, plan.body)
        left = plan.filler
        while left > 0:
            n = min(PIECE, left)
            await self._write(writer, b" " * n)
            left -= n
        if plan.length is None and plan.end:
            writer.write(b"0\r\n\r\n")
        elif not plan.end:
            # Held open: the router must end it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 60)
        await writer.drain()

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        if not data:
            return
        if self.plan.length is None:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        writer.write(data)
        await writer.drain()
        self.sent += len(data)


@contextlib.asynccontextmanager
async def behind_router(
    tmp_path: Path, plan: Plan, **over: Any
) -> AsyncIterator[tuple[BigEngine, Program]]:
    """A router bound at `BOUND` whose one endpoint, e0, is a `BigEngine` playing `plan`."""
    engine = BigEngine(plan)
    await engine.start()
    try:
        entries = [{"id": "e0", "url": f"http://127.0.0.1:{engine.port}", "models": ["m"]}]
        conf = base_config(endpoints=entries, **{"max_answer_bytes": BOUND, **over})
        with router(tmp_path, conf) as r:
            yield engine, r
    finally:
        await engine.stop()


def chat_answer(content: str) -> bytes:
    doc = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    return json.dumps(doc).encode()


async def metric(session: aiohttp.ClientSession, url: str, prefix: str) -> float:
    """The value of the first /metrics series that starts with `prefix` (0 without one)."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


class TestEndlessAnswers:
    """An answer that never ends costs the router its bound, not the answer."""

    @pytest.mark.parametrize("length", [None, 10 * 1024**3], ids=["chunked", "declared-10GB"])
    async def test_a_slow_client_of_an_endless_answer(
        self, tmp_path: Path, length: int | None
    ) -> None:
        """An endless answer (chunked, or declaring 10 GB) to a client that reads 16 MiB
        and then stops reading: the router relays it as it comes, pauses the engine while
        the client does not read, and its peak memory grows by far less than it relayed."""
        plan = Plan(length=length, filler=CAP, end=False)
        async with (
            behind_router(tmp_path, plan, request_timeout_s=15) as (engine, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            before = peak_kib(r.pid)
            async with session.post(r.url + "/v1/chat/completions", json=chat_body("big")) as resp:
                assert resp.status == 200
                assert resp.headers["x-llmgw-endpoint"] == "e0"
                got = 0
                while got < 16 * MIB:
                    got += len(await resp.content.read(MIB))
                await asyncio.sleep(1.5)  # the client reads nothing for a while
                sent = engine.sent
                grown_mib = (peak_kib(r.pid) - before) / 1024
            assert sent < 64 * MIB, f"the engine got {sent / MIB:.0f} MiB written"
            assert grown_mib < 48, f"peak memory grew {grown_mib:.0f} MiB"
            await settled(session, r.url)
            assert "answer over max_answer_bytes" in r.log_text()
            no_traceback(r.log_text())


class TestBigWholeAnswers:
    """A whole answer over the bound still reaches its client, counted."""

    async def test_an_answer_over_the_bound_is_relayed_with_its_usage(self, tmp_path: Path) -> None:
        """A 3 MiB chat answer, over the 1 MiB bound: the client gets it byte for byte,
        its usage (read from its tail) is counted, and the unbuffered answer is counted."""
        body = chat_answer("x" * (3 * MIB))
        async with (
            behind_router(tmp_path, Plan(length=len(body), body=body)) as (_, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            rep = await post(session, r.url, chat_body("big"))
            assert rep.status == 200
            assert rep.body == body
            assert await metric(session, r.url, 'llmgw_router_prompt_tokens_total{model="m"}') == 5
            unbuffered = 'llmgw_router_unbuffered_answers_total{endpoint="e0",model="m"}'
            assert await metric(session, r.url, unbuffered) == 1
            await settled(session, r.url)
            no_traceback(r.log_text())

    @pytest.mark.parametrize("length", [True, False], ids=["declared", "chunked"])
    async def test_an_answer_under_the_bound_is_held_once(
        self, tmp_path: Path, length: bool
    ) -> None:
        """A 96 MiB answer under a 128 MiB bound, to a client that reads it at once: the
        router's peak memory grows by about the answer, not twice it (its pieces joined
        into a copy of their own)."""
        body = chat_answer("x" * (96 * MIB))
        plan = Plan(length=len(body) if length else None, body=body)
        async with (
            behind_router(tmp_path, plan, max_answer_bytes=128 * MIB) as (_, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        ):
            before = peak_kib(r.pid)
            rep = await post(session, r.url, chat_body("big"))
            assert (rep.status, rep.headers["content-length"]) == (200, str(len(body)))
            assert rep.body == body
            grown_mib = (peak_kib(r.pid) - before) / 1024
            assert grown_mib < 144, f"peak memory grew {grown_mib:.0f} MiB"
            no_traceback(r.log_text())

    async def test_an_answer_under_the_bound_is_whole(self, tmp_path: Path) -> None:
        """A chunked 512 KiB answer under the bound: relayed whole, with a Content-Length,
        its usage counted, none counted unbuffered."""
        body = chat_answer("x" * (512 * 1024))
        async with (
            behind_router(tmp_path, Plan(body=body)) as (_, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            rep = await post(session, r.url, chat_body("big"))
            assert rep.status == 200
            assert rep.body == body
            assert rep.headers["content-length"] == str(len(body))
            assert await metric(session, r.url, 'llmgw_router_prompt_tokens_total{model="m"}') == 5
            assert await metric(session, r.url, "llmgw_router_unbuffered_answers_total{") == 0
            no_traceback(r.log_text())


class TestAnswersHeldTogether:
    """Whole answers held at once stay within max_held_answer_bytes, none refused."""

    async def test_an_unread_answer_stays_held_and_the_next_is_relayed(
        self, tmp_path: Path
    ) -> None:
        """A 24 MiB answer (under a 32 MiB max_answer_bytes) whose client reads none of it
        stays held, the gauge says how much; the same answer asked for meanwhile would pass
        the 40 MiB bound, so it is relayed as it arrives, byte for byte; once the first
        client has gone, nothing is held."""
        body = chat_answer("x" * (24 * MIB))
        plan = Plan(length=len(body), body=body)
        over = {"max_answer_bytes": 32 * MIB, "max_held_answer_bytes": 40 * MIB}
        timeout = aiohttp.ClientTimeout(total=30)
        async with (
            behind_router(tmp_path, plan, **over) as (_, r),
            aiohttp.ClientSession(timeout=timeout) as stalled,
            aiohttp.ClientSession(timeout=timeout) as session,
        ):
            held = "llmgw_router_held_answer_bytes "
            resp = await stalled.post(r.url + "/v1/chat/completions", json=chat_body("big"))
            assert resp.headers["content-length"] == str(len(body))
            await asyncio.sleep(1.0)  # the router writes what the sockets take
            assert await metric(session, r.url, held) == len(body)
            rep = await post(session, r.url, chat_body("again"))
            assert (rep.status, rep.headers.get("transfer-encoding")) == (200, "chunked")
            assert rep.body == body
            unbuffered = 'llmgw_router_unbuffered_answers_total{endpoint="e0",model="m"}'
            assert await metric(session, r.url, unbuffered) == 1
            assert "answers over max_held_answer_bytes" in r.log_text()
            resp.close()  # the first client goes
            for _ in range(50):
                if await metric(session, r.url, held) == 0:
                    break
                await asyncio.sleep(0.1)
            assert await metric(session, r.url, held) == 0
            await settled(session, r.url)
            no_traceback(r.log_text())


class TestBigErrorAnswers:
    """An error answer over the bound is the engine's failure, not held."""

    @pytest.mark.parametrize("length", [None, 10 * 1024**3], ids=["chunked", "declared-10GB"])
    async def test_an_error_answer_over_the_bound_is_a_502(
        self, tmp_path: Path, length: int | None
    ) -> None:
        """A 500 whose body never ends: the client gets a 502 in OpenAI's shape naming the
        bound, the engine wrote little of it, nothing is left in flight."""
        plan = Plan(status=500, length=length, filler=CAP, end=False)
        async with (
            behind_router(tmp_path, plan, request_timeout_s=15) as (engine, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            before = peak_kib(r.pid)
            rep = await post(session, r.url, chat_body("err"))
            assert rep.status == 502, (rep.status, rep.body[:200])
            err = rep.json()["error"]
            assert "max_answer_bytes" in err["message"]
            assert err["type"] == "upstream_error"
            assert engine.sent < 64 * MIB
            assert (peak_kib(r.pid) - before) / 1024 < 48
            await settled(session, r.url)
            no_traceback(r.log_text())


class ScriptedEngine(BigEngine):
    """A BigEngine that answers each POST with the next plan of `script`, a list it may
    share with others (the first POST to any of them gets the first plan); the last
    plan repeats."""

    def __init__(self, script: list[Plan]) -> None:
        super().__init__(script[0])
        self.script = script

    async def _answer(self, writer: asyncio.StreamWriter) -> None:
        self.plan = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        await super()._answer(writer)


@contextlib.asynccontextmanager
async def two_behind_router(
    tmp_path: Path, script: list[Plan], **over: Any
) -> AsyncIterator[Program]:
    """A router with two endpoints of model m, both `ScriptedEngine`s playing `script`."""
    engines = [ScriptedEngine(script), ScriptedEngine(script)]
    for e in engines:
        await e.start()
    try:
        entries = [
            {"id": f"e{i}", "url": f"http://127.0.0.1:{e.port}", "models": ["m"]}
            for i, e in enumerate(engines)
        ]
        with router(tmp_path, base_config(endpoints=entries, **over)) as r:
            yield r
    finally:
        for e in engines:
            await e.stop()


def error_answer(n_bytes: int) -> bytes:
    doc = {"error": {"message": "x" * n_bytes, "type": "server_error", "code": 500}}
    return json.dumps(doc).encode()


async def until_metric(session: aiohttp.ClientSession, url: str, prefix: str, want: float) -> None:
    for _ in range(100):
        if await metric(session, url, prefix) == want:
            return
        await asyncio.sleep(0.05)
    assert await metric(session, url, prefix) == want


class TestErrorAnswersHeld:
    """Error answers count against max_held_answer_bytes like any whole answer."""

    async def test_an_error_kept_for_a_retry_is_counted_while_held(self, tmp_path: Path) -> None:
        """A 500 of 8 MiB kept while the router retries on a replica that has not answered
        yet shows in llmgw_router_held_answer_bytes, and once the request is over nothing
        is held (it was not counted at all)."""
        err = error_answer(8 * MIB)
        script = [Plan(status=500, length=len(err), body=err), Plan(end=False)]
        over = {
            "max_answer_bytes": 32 * MIB,
            "max_held_answer_bytes": 64 * MIB,
            "request_timeout_s": 4,
        }
        held = "llmgw_router_held_answer_bytes "
        async with (
            two_behind_router(tmp_path, script, **over) as r,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            asked = asyncio.create_task(post(session, r.url, chat_body("err")))
            await until_metric(session, r.url, held, len(err))
            rep = await asked
            assert rep.status >= 500
            await until_metric(session, r.url, held, 0)
            no_traceback(r.log_text())

    async def test_an_error_past_the_held_bound_is_a_502(self, tmp_path: Path) -> None:
        """A 500 of 8 MiB, under max_answer_bytes but past max_held_answer_bytes (4 MiB),
        at every replica: not held for a retry, the client gets the router's 502 naming
        the bound, and nothing stays held."""
        err = error_answer(8 * MIB)
        script = [Plan(status=500, body=err)]
        over = {"max_answer_bytes": 32 * MIB, "max_held_answer_bytes": 4 * MIB}
        async with (
            two_behind_router(tmp_path, script, **over) as r,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            rep = await post(session, r.url, chat_body("err"))
            assert rep.status == 502, (rep.status, rep.body[:200])
            body = rep.json()["error"]
            assert (body["type"], body["code"]) == ("upstream_error", "answer_too_large")
            assert "max_held_answer_bytes" in body["message"]
            await until_metric(session, r.url, "llmgw_router_held_answer_bytes ", 0)
            no_traceback(r.log_text())

    async def test_a_client_error_past_the_held_bound_is_relayed(self, tmp_path: Path) -> None:
        """A 400 of 8 MiB (not retried) past max_held_answer_bytes is relayed as it
        arrives, byte for byte, as a 2xx answer past it is, and logged."""
        err = error_answer(8 * MIB)
        script = [Plan(status=400, length=len(err), body=err)]
        over = {"max_answer_bytes": 32 * MIB, "max_held_answer_bytes": 4 * MIB}
        async with (
            two_behind_router(tmp_path, script, **over) as r,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            rep = await post(session, r.url, chat_body("err"))
            assert (rep.status, rep.headers.get("transfer-encoding")) == (400, "chunked")
            assert rep.body == err
            assert "answers over max_held_answer_bytes" in r.log_text()
            await until_metric(session, r.url, "llmgw_router_held_answer_bytes ", 0)
            no_traceback(r.log_text())
