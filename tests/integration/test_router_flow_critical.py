"""Where a critical request goes at saturation, end to end: two real sim-engines of 8
slots, both full, a router with flow control, and a critical request whose prompt one of
them holds. A slot frees on the other: the critical request goes home if that engine
orders its queue by priority, else where the slot freed."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing import Program, start_program

from .router_fixtures import band_keys, base_config, chat_body, router, sim_args
from .test_router_flow import KEYS, MODEL, queued, until

pytestmark = pytest.mark.slow

# Tokens of the requests that fill the engines (about 4 s with 8 running at speed 1).
LONG = 600
# The critical team's prompt: long enough that the replica holding it holds many
# blocks of it, and the other none.
PROMPT = "the operations runbook for the on-call engineer, step by step: " * 12


@dataclass
class Fleet:
    engines: dict[str, Program]
    router: Program
    ordered: bool


@pytest.fixture(scope="module", params=[True, False], ids=["priority", "fcfs"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two sim-engines running 8 requests at once, each ordering its queue by priority
    (and listed so) or not, behind a router with flow control on."""
    ordered: bool = request.param
    tmp: Path = tmp_path_factory.mktemp("flow-critical")
    extra = ("--max-num-seqs", "8", *(("--scheduling-policy", "priority") if ordered else ()))
    engines = {
        f"e{i}": start_program(sim_args(model=MODEL, speed=1.0, extra=extra), log_dir=tmp)
        for i in range(2)
    }
    cfg = base_config(
        endpoints=[
            {"id": eid, "url": p.url, "models": [MODEL], "priority_scheduling": ordered}
            for eid, p in engines.items()
        ],
        api_keys=band_keys(KEYS),
    )
    try:
        with router(tmp, cfg) as r:
            yield Fleet(engines, r, ordered)
    finally:
        for p in engines.values():
            p.stop(grace_s=3)


@dataclass
class Answer:
    status: int
    endpoint: str


class Stream:
    """A streamed request whose endpoint is known once its first bytes are in."""

    def __init__(self, s: aiohttp.ClientSession, url: str, team: str, content: str) -> None:
        self.endpoint: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self._run(s, url, team, content))

    async def _run(self, s: aiohttp.ClientSession, url: str, team: str, content: str) -> Answer:
        body = chat_body(content, max_tokens=LONG, stream=True, model=MODEL)
        hdrs = {"Authorization": f"Bearer {KEYS[team][1]}"}
        async with s.post(url + "/v1/chat/completions", json=body, headers=hdrs) as resp:
            eid = resp.headers.get("x-llmgw-endpoint", "")
            async for _ in resp.content.iter_any():
                if not self.endpoint.done():
                    self.endpoint.set_result(eid)
            return Answer(resp.status, eid)


async def ask(
    s: aiohttp.ClientSession, url: str, team: str, content: str, tokens: int = 4
) -> Answer:
    body = chat_body(content, max_tokens=tokens, model=MODEL)
    hdrs = {"Authorization": f"Bearer {KEYS[team][1]}"}
    async with s.post(url + "/v1/chat/completions", json=body, headers=hdrs) as resp:
        await resp.read()
        return Answer(resp.status, resp.headers.get("x-llmgw-endpoint", ""))


def running(engine: Program) -> int:
    """Requests the sim-engine runs now (its loopback debug route)."""
    with urllib.request.urlopen(engine.url + "/sim/state", timeout=5) as resp:
        return int(json.loads(resp.read())["running"])


async def scenario(f: Fleet) -> tuple[str, Answer]:
    """Show both engines' capacity; send the critical prompt once (its home); fill both
    engines and hold 4 more; queue the critical prompt again; free a slot on the other
    engine (its client leaves)."""
    url = f.router.url
    async with aiohttp.ClientSession() as s:
        # 24 at once on two engines of 8: both queue, and the router learns their capacity.
        warm = await asyncio.gather(*(ask(s, url, "bulk", f"warm {i}", 150) for i in range(24)))
        assert {a.status for a in warm} == {200}
        home = (await ask(s, url, "ops", PROMPT)).endpoint
        # 16 run, 4 more wait in the router: every replica is full.
        fill = [Stream(s, url, "bulk", f"fill {i}") for i in range(20)]
        for p in f.engines.values():
            await until(lambda p=p: running(p) == 8, "8 running")
        await until(lambda: queued(url).get(("batch", "bulk")) == 4, "4 batch held")
        started = [x for x in fill if x.endpoint.done()]
        where = [x.endpoint.result() for x in started]
        assert sorted(where) == ["e0"] * 8 + ["e1"] * 8, where
        crit = asyncio.create_task(ask(s, url, "ops", PROMPT + "and once more"))
        await until(lambda: ("critical", "ops") in queued(url), "the critical one queued")
        other = next(x for x, eid in zip(started, where, strict=True) if eid != home)
        other.task.cancel()
        answer = await asyncio.wait_for(crit, 30)
        for x in fill:
            x.task.cancel()
        await asyncio.gather(*(x.task for x in fill), return_exceptions=True)
        return home, answer


class TestCriticalAtSaturation:
    """A critical request let go at saturation goes home where its engine orders by band."""

    def test_home_if_its_engine_orders_by_priority_else_the_freed_slot(self, fleet: Fleet) -> None:
        """With priority engines the critical request goes back to the replica holding its
        prompt, full as it is (it starts there first); with FCFS engines it takes the slot
        freed on the other replica rather than queue behind eight at home."""
        home, answer = asyncio.run(scenario(fleet))
        assert answer.status == 200
        if fleet.ordered:
            assert answer.endpoint == home
        else:
            assert answer.endpoint not in ("", home)
