"""A file key's RPM and TPM behind `llmgw router --workers 2`: one bucket per router.

Two keep-alive connections are pinned, one to each worker (an unlimited key with
`x-llmgw-debug: 1` asks which worker holds each), and the limited key's requests
alternate between them: every request of the key is counted by both workers'
shared bucket, never once per worker.
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing.wait import until

from .router_fixtures import base_config, chat_body, endpoint_entries, post, router, sim_engines
from .test_router_workers import dead, workers_of

pytestmark = pytest.mark.slow

PROBE = "sk-probe-unlimited"
LIMITED = "sk-limited-key"


def _keys(**limits: int) -> list[dict[str, Any]]:
    return [
        {"name": "probe", "sha256": hashlib.sha256(PROBE.encode()).hexdigest()},
        {"name": "limited", "sha256": hashlib.sha256(LIMITED.encode()).hexdigest(), **limits},
    ]


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "x-llmgw-debug": "1"}


async def pinned(stack: AsyncExitStack, url: str) -> list[aiohttp.ClientSession]:
    """One keep-alive session held by worker 0 and one held by worker 1, in that order."""
    by_worker: dict[int, aiohttp.ClientSession] = {}

    async def both() -> bool:
        s = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        )
        reply = await post(s, url, chat_body("hi", max_tokens=1), headers=_auth(PROBE))
        assert reply.status == 200, reply.body
        by_worker.setdefault(int(reply.headers["x-llmgw-worker"]), s)
        return set(by_worker) == {0, 1}

    await until(both, timeout_s=30, every_s=0, what="a connection held by each worker")
    return [by_worker[0], by_worker[1]]


class TestOneBucketPerRouter:
    """A key's limits hold for the router, whichever worker counts each request."""

    async def test_rpm_admits_exactly_the_limit_over_both_workers(self, tmp_path: Path) -> None:
        """rpm 6 over requests alternating between the workers: exactly 6 admitted, then
        429 rate_limit_exceeded with Retry-After and the x-ratelimit-* headers."""
        rpm = 6
        with sim_engines(tmp_path, [500.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines), api_keys=_keys(rpm=rpm))
            with router(tmp_path, cfg, workers=2) as r:
                async with AsyncExitStack() as stack:
                    conns = await pinned(stack, r.url)
                    t0 = time.monotonic()
                    replies = [
                        await post(
                            conns[i % 2],
                            r.url,
                            chat_body("hi", max_tokens=1),
                            headers=_auth(LIMITED),
                        )
                        for i in range(3 * rpm)
                    ]
                    elapsed_s = time.monotonic() - t0
        admitted = [x for x in replies if x.status == 200]
        # The bucket refills one request every 60/rpm seconds.
        assert len(admitted) == rpm + math.floor(elapsed_s * rpm / 60), elapsed_s
        assert {x.headers["x-llmgw-worker"] for x in admitted} == {"0", "1"}
        refused = next(x for x in replies if x.status == 429)
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-limit-requests"] == str(rpm)
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert [x.headers["x-ratelimit-remaining-requests"] for x in admitted[:3]] == [
            str(rpm - 1),
            str(rpm - 2),
            str(rpm - 3),
        ]

    async def test_tpm_admits_what_one_process_would(self, tmp_path: Path) -> None:
        """tpm over sequential requests alternating between the workers: admitted while
        the router's one bucket holds the estimate, as the engine's counts spend it."""
        body = chat_body("hi", max_tokens=40)
        with sim_engines(tmp_path, [2000.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines), api_keys=_keys())
            # What one request costs (the engine's count) and its estimate (bytes / 4).
            with router(tmp_path, cfg, workers=1) as r:
                async with aiohttp.ClientSession() as s:
                    probe = await post(s, r.url, body, headers=_auth(PROBE))
            usage = probe.json()["usage"]
            cost = usage["prompt_tokens"] + usage["completion_tokens"]
            estimate = len(_encoded(body)) // 4
            assert estimate < cost
            # Room for exactly four requests: the fifth finds cost/2 + estimate short.
            tpm = estimate + math.floor(3.5 * cost)
            cfg = base_config(endpoints=endpoint_entries(engines), api_keys=_keys(tpm=tpm))
            with router(tmp_path, cfg, workers=2) as r:
                async with AsyncExitStack() as stack:
                    conns = await pinned(stack, r.url)
                    t0 = time.monotonic()
                    replies = [
                        await post(conns[i % 2], r.url, body, headers=_auth(LIMITED))
                        for i in range(10)
                    ]
                    elapsed_s = time.monotonic() - t0
        # Refilled meanwhile: tpm/60 a second, under half a request in this time.
        assert elapsed_s * tpm / 60 < cost / 2, elapsed_s
        admitted = [x for x in replies if x.status == 200]
        assert len(admitted) == 4
        assert {x.headers["x-llmgw-worker"] for x in admitted} == {"0", "1"}
        refused = next(x for x in replies if x.status == 429)
        assert refused.json()["error"]["type"] == "tokens"
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-limit-tokens"] == str(tpm)


class TestCountsOutliveAWorker:
    """The shared counts are the router's, not a worker's."""

    async def test_a_worker_killed_and_restarted_keeps_the_spent_bucket(
        self, tmp_path: Path
    ) -> None:
        """rpm spent, a worker SIGKILLed: its replacement still refuses the key (a fresh
        bucket would admit the whole rpm again)."""
        # One request refilled every 30 s: none while the worker restarts.
        rpm = 2
        with sim_engines(tmp_path, [500.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines), api_keys=_keys(rpm=rpm))
            with router(tmp_path, cfg, workers=2) as r:
                async with AsyncExitStack() as stack:
                    conns = await pinned(stack, r.url)
                    body = chat_body("hi", max_tokens=1)
                    got = [
                        (await post(conns[i % 2], r.url, body, headers=_auth(LIMITED))).status
                        for i in range(rpm)
                    ]
                    assert got == [200] * rpm
                    old = workers_of(r.pid)[1]
                    os.kill(old, signal.SIGKILL)
                    await until(
                        lambda: dead(old) and len(workers_of(r.pid)) == 2,
                        timeout_s=30,
                        what="worker 1 replaced",
                    )
                async with AsyncExitStack() as stack:
                    # The new worker 1 answers (its own connection): refused, as worker 0.
                    conns = await pinned(stack, r.url)
                    for s in conns:
                        reply = await post(s, r.url, body, headers=_auth(LIMITED))
                        assert reply.status == 429, reply.body
                        assert reply.headers["x-ratelimit-remaining-requests"] == "0"


def _encoded(body: dict[str, Any]) -> bytes:
    import json

    return json.dumps(body).encode()
