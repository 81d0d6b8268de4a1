"""Engine priority end to end: a real router writing each key's band into the `priority`
field of a real sim-engine run with `--scheduling-policy priority`, and leaving an FCFS
engine's bodies as the client sent them."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing import Program, start_program

from .router_fixtures import band_keys, base_config, chat_body, router, sim_args
from .test_router_flow import KEYS

pytestmark = pytest.mark.slow

# One model on an engine that orders its queue by priority, one on an FCFS engine.
PRIO = "prio-model"
FCFS = "fcfs-model"
# Tokens of the request that holds the engine's only slot (about 1 s at speed 1), and of
# each request queued behind it.
HOLD = 150
SHORT = 20


@dataclass
class Setup:
    prio: Program
    fcfs: Program
    router: Program


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """Two sim-engines running one request at a time, and a router with flow control off
    (every request goes to the engine at once and waits in its queue)."""
    tmp: Path = tmp_path_factory.mktemp("engine-priority")
    one = ("--max-num-seqs", "1")
    prio = start_program(
        sim_args(model=PRIO, speed=1.0, extra=(*one, "--scheduling-policy", "priority")),
        log_dir=tmp,
    )
    fcfs = start_program(sim_args(model=FCFS, speed=1.0, extra=one), log_dir=tmp)
    cfg = base_config(
        endpoints=[
            {"id": "p0", "url": prio.url, "models": [PRIO], "priority_scheduling": True},
            {"id": "f0", "url": fcfs.url, "models": [FCFS]},
        ],
        api_keys=band_keys(KEYS),
        flow={"enabled": False},
    )
    try:
        with router(tmp, cfg) as r:
            yield Setup(prio, fcfs, r)
    finally:
        prio.stop(grace_s=3)
        fcfs.stop(grace_s=3)


@dataclass
class Answer:
    name: str
    status: int
    # Monotonic time of the first streamed bytes of a 200; None otherwise.
    first_at: float | None
    body: bytes


async def send(
    s: aiohttp.ClientSession,
    url: str,
    name: str,
    key: str,
    *,
    model: str = PRIO,
    tokens: int = SHORT,
    extra: dict[str, Any] | None = None,
) -> Answer:
    body = {**chat_body(name, max_tokens=tokens, stream=True, model=model), **(extra or {})}
    hdrs = {"Authorization": f"Bearer {KEYS[key][1]}"}
    async with s.post(url + "/v1/chat/completions", json=body, headers=hdrs) as resp:
        first: float | None = None
        data = b""
        async for chunk in resp.content.iter_any():
            if first is None and resp.status == 200:
                first = time.monotonic()
            data += chunk
        return Answer(name, resp.status, first, data)


def waiting(engine: Program) -> int:
    """Requests waiting in the sim-engine's queue (its loopback debug route)."""
    with urllib.request.urlopen(engine.url + "/sim/state", timeout=5) as resp:
        return int(json.loads(resp.read())["waiting"])


async def queue_up(s: aiohttp.ClientSession, setup: Setup) -> list[Answer]:
    """Fill the engine's one slot, then queue, in this order and each once the one
    before is waiting there: batch, standard, standard naming priority -100 itself, and
    critical."""
    url = setup.router.url
    tasks = [asyncio.create_task(send(s, url, "hold", "web", tokens=HOLD))]
    order: list[tuple[str, str, dict[str, Any] | None]] = [
        ("batch", "bulk", None),
        ("web", "web", None),
        ("web-own", "web", {"priority": -100}),
        ("crit", "ops", None),
    ]
    for i, (name, key, extra) in enumerate(order):
        tasks.append(asyncio.create_task(send(s, url, name, key, extra=extra)))
        deadline = time.monotonic() + 10
        while await asyncio.to_thread(waiting, setup.prio) < i + 1:
            assert time.monotonic() < deadline, f"{name} never reached the engine's queue"
            await asyncio.sleep(0.02)
    return list(await asyncio.gather(*tasks))


class TestEnginePriority:
    """The key's band orders the engine's queue; an FCFS engine gets bodies as sent."""

    def test_bands_order_the_engine_queue(self, setup: Setup) -> None:
        """Behind a running request, the critical request queued last starts first, the
        standard ones in arrival order next (a client's own priority -100 replaced by its
        key's), and the batch one queued first starts last."""

        async def main() -> list[Answer]:
            async with aiohttp.ClientSession() as s:
                return await queue_up(s, setup)

        answers = {a.name: a for a in asyncio.run(main())}
        assert all(a.status == 200 for a in answers.values()), answers
        started = sorted(answers.values(), key=lambda a: a.first_at or 0.0)
        assert [a.name for a in started] == ["hold", "crit", "web", "web-own", "batch"]

    def test_the_responses_api_carries_the_band_too(self, setup: Setup) -> None:
        """A critical Responses request queued behind a standard chat request is
        answered first (each runs alone on the engine, so finishing order is
        starting order)."""

        async def responses(s: aiohttp.ClientSession) -> tuple[str, float]:
            body = {"model": PRIO, "input": "crit", "max_output_tokens": SHORT}
            hdrs = {"Authorization": f"Bearer {KEYS['ops'][1]}"}
            async with s.post(setup.router.url + "/v1/responses", json=body, headers=hdrs) as r:
                assert r.status == 200, await r.text()
                await r.read()
            return "crit", time.monotonic()

        async def chat(s: aiohttp.ClientSession, name: str, tokens: int) -> tuple[str, float]:
            a = await send(s, setup.router.url, name, "web", tokens=tokens)
            assert a.status == 200
            return name, time.monotonic()

        async def main() -> list[tuple[str, float]]:
            async with aiohttp.ClientSession() as s:
                tasks = [asyncio.create_task(chat(s, "hold", HOLD))]
                for i, make in enumerate((lambda: chat(s, "web", SHORT), lambda: responses(s))):
                    tasks.append(asyncio.create_task(make()))
                    deadline = time.monotonic() + 10
                    while await asyncio.to_thread(waiting, setup.prio) < i + 1:
                        assert time.monotonic() < deadline, "never queued at the engine"
                        await asyncio.sleep(0.02)
                return list(await asyncio.gather(*tasks))

        done = sorted(asyncio.run(main()), key=lambda x: x[1])
        assert [name for name, _ in done] == ["hold", "crit", "web"]

    def test_an_fcfs_engine_gets_the_body_as_sent(self, setup: Setup) -> None:
        """On an engine without priority scheduling a critical key's request carries no
        priority (served), and a client's own nonzero priority reaches the engine, which
        refuses it as vLLM does."""

        async def main() -> tuple[Answer, Answer]:
            async with aiohttp.ClientSession() as s:
                url = setup.router.url
                crit = await send(s, url, "crit", "ops", model=FCFS)
                own = await send(s, url, "own", "web", model=FCFS, extra={"priority": 3})
                return crit, own

        crit, own = asyncio.run(main())
        assert crit.status == 200
        assert own.status == 400
        assert "priority" in json.loads(own.body)["error"]["message"].lower()
