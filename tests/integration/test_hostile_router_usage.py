"""What an engine's odd usage objects cost a limited key, behind a real router process.

The engine is a `RawEngine` (raw asyncio on 127.0.0.1, standing in for an outside
engine) answering with the usage each test writes; the key has an RPM and a TPM, so
every answer says what the key has left (`x-ratelimit-remaining-tokens`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing import Program
from tests.integration.hostile import RawEngine, Script, no_traceback
from tests.integration.router_fixtures import base_config, chat_body, post, router

pytestmark = pytest.mark.timeout(90)

KEY = "sk-limited"
TPM = 100_000
AUTH = {"Authorization": f"Bearer {KEY}"}
# A key without limits: nothing charged, its tokens still counted on /metrics.
FREE = {"Authorization": "Bearer sk-free"}
# Past anything a float holds: 10**400.
ABSURD = "1" + "0" * 400


def chat_answer(usage: str) -> bytes:
    """A whole chat answer whose `usage` is the JSON text `usage`, as an engine wrote it."""
    doc = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
    }
    body = json.dumps(doc).encode()[:-1] + b', "usage": ' + usage.encode() + b"}"
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def stream_answer(usage: str) -> bytes:
    """A chat stream whose last event before [DONE] carries `usage`."""
    events = [
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
        b'"delta":{"content":"hi"},"finish_reason":null}]}\n\n',
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":'
        + usage.encode()
        + b"}\n\n",
        b"data: [DONE]\n\n",
    ]
    body = b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events) + b"0\r\n\r\n"
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + body
    )


@contextlib.asynccontextmanager
async def limited_router(
    tmp_path: Path, answers: list[bytes], *, tpm: int = TPM
) -> AsyncIterator[tuple[RawEngine, Program]]:
    """A router with a key limited to `tpm` and a free one, whose one endpoint answers
    `answers` in turn."""
    engine = RawEngine(lambda n: Script([answers[n]]))
    await engine.start()
    keys = [
        {
            "name": "k",
            "team": "t",
            "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
            "rpm": 1000,
            "tpm": tpm,
        },
        {"name": "free", "team": "t", "sha256": hashlib.sha256(b"sk-free").hexdigest()},
    ]
    try:
        entries = [{"id": "e0", "url": engine.url, "models": ["m"]}]
        with router(tmp_path, base_config(endpoints=entries, api_keys=keys)) as r:
            yield engine, r
    finally:
        await engine.stop()


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(name + "{"))


class TestAbsurdUsage:
    """An engine's absurd token count never costs the client its answer."""

    async def test_a_count_past_any_float_is_relayed_and_counted(self, tmp_path: Path) -> None:
        """A usage of 10**400 tokens, whole to a limited key and streamed to a free one:
        each client gets the engine's answer as it came (not a 500, not a cut stream),
        both requests are counted, and the router logs no traceback."""
        usage = '{"prompt_tokens": ' + ABSURD + ', "completion_tokens": 2}'
        answers = [chat_answer(usage), stream_answer(usage)]
        async with (
            limited_router(tmp_path, answers) as (_, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            whole = await post(session, r.url, chat_body("whole"), headers=AUTH)
            assert whole.status == 200, whole.body[:300]
            assert ABSURD.encode() in whole.body
            stream = await post(session, r.url, chat_body("stream", stream=True), headers=FREE)
            assert stream.status == 200
            assert stream.events()[-1] == "[DONE]"
            assert await metric(session, r.url, "llmgw_router_requests_total") == 2.0
            no_traceback(r.log_text())


class TestUsageWithoutCounts:
    """A usage object that counts nothing is no usage: the estimate stands."""

    async def test_a_usage_without_counts_costs_the_estimate(self, tmp_path: Path) -> None:
        """Answers whose usage is `{}` or only `total_tokens` cost the key the request's
        estimate, as one without usage does, not nothing: each next request's headers show
        every earlier one charged."""
        answers = [chat_answer("{}"), chat_answer('{"total_tokens": 9}'), chat_answer("null")]
        # About 1,000 tokens estimated (4,000 bytes / 4) against 5,000 a minute: a request
        # refunded would leave the next one's remaining 1,000 higher, far more than the
        # bucket refills meanwhile (83 a second).
        text = "x" * 4000
        async with (
            limited_router(tmp_path, answers, tpm=5000) as (_, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            left = []
            for _ in answers:
                rep = await post(session, r.url, chat_body(text), headers=AUTH)
                assert rep.status == 200, rep.body
                left.append(int(rep.headers["x-ratelimit-remaining-tokens"]))
            estimate = 5000 - left[0]
            assert 900 < estimate < 1200, estimate
            assert left[1] < 5000 - 2 * estimate + 300, (left, estimate)
            assert left[2] < 5000 - 3 * estimate + 300, (left, estimate)


class TestUsageBound:
    """An answer is charged at most what its request could have used (usagebound.py)."""

    async def test_a_claim_of_10_to_the_15_costs_the_bound(self, tmp_path: Path) -> None:
        """Usage of 10**15 prompt and completion tokens for a short request with
        max_tokens 8 costs the key 128 Ki + 8 tokens of its 300,000 a minute: its next
        request is admitted (it was a 429 asking to wait for years), and the clipped rest
        is on /metrics and in the log."""
        big = 10**15
        usage = json.dumps({"prompt_tokens": big, "completion_tokens": big})
        answers = [chat_answer(usage), chat_answer('{"prompt_tokens": 3, "completion_tokens": 2}')]
        async with (
            limited_router(tmp_path, answers, tpm=300_000) as (_, r),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            first = await post(session, r.url, chat_body("hi", max_tokens=8), headers=AUTH)
            assert first.status == 200, first.body[:300]
            second = await post(session, r.url, chat_body("hi", max_tokens=8), headers=AUTH)
            assert second.status == 200, second.body[:300]
            left = int(second.headers["x-ratelimit-remaining-tokens"])
            # Less the bound (131,080) and the second's estimate, plus a second's refill.
            assert 300_000 - 131_080 - 100 < left < 300_000 - 131_080 + 5_100, left
            clipped = await metric(session, r.url, "llmgw_router_usage_clipped_tokens_total")
            assert clipped == 2 * big - 131_080
            assert "usage clipped" in r.log_text()
