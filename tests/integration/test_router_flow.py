"""Flow control end to end: a real router in front of a real sim-engine of small capacity,
saturated by a batch team, with a critical team and a standard one beside it."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing import Program, start_program
from llmgw.testing.wait import wait_until

from .router_fixtures import band_keys, base_config, chat_body, router, sim_args

pytestmark = pytest.mark.slow

MODEL = "sim-model"
KEYS = {"bulk": ("batch", "sk-bulk"), "ops": ("critical", "sk-ops"), "web": ("standard", "sk-web")}
# Tokens of one long request: about 4 s at the sim's speed 1 with 8 running (7 ms a step).
LONG = 600
# Tokens between the ends of two of the requests that fill the engine: about 0.35 s, so
# each release grants one queued request well apart from the next.
STAGGER = 50


@dataclass
class Setup:
    engine: Program
    router: Program


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """One sim-engine running at most 8 requests at once, and a router with three keys
    (team = key name) and small flow bounds."""
    tmp: Path = tmp_path_factory.mktemp("flow")
    engine = start_program(
        sim_args(model=MODEL, speed=1.0, extra=("--max-num-seqs", "8")), log_dir=tmp
    )
    cfg = base_config(
        endpoints=[{"id": "e0", "url": engine.url, "models": [MODEL]}],
        api_keys=band_keys(KEYS),
        flow={
            "batch": {"max_queued": 4, "max_wait_s": 60.0},
            "standard": {"max_queued": 10, "max_wait_s": 0.5},
            # A quarter turnover: with 8 running, a team's backlog of 2 is its bound.
            "critical": {"max_wait_turnovers": 0.25},
        },
    )
    try:
        with router(tmp, cfg) as r:
            yield Setup(engine, r)
    finally:
        engine.stop(grace_s=3)


@dataclass
class Answer:
    name: str
    status: int
    sent_at: float
    # Monotonic time of the first streamed bytes of a 200; None otherwise.
    first_at: float | None
    headers: dict[str, str]
    body: bytes


async def send(
    s: aiohttp.ClientSession, url: str, name: str, team: str, tokens: int = LONG
) -> Answer:
    body = chat_body("flow", max_tokens=tokens, stream=True, model=MODEL)
    hdrs = {"Authorization": f"Bearer {KEYS[team][1]}"}
    sent = time.monotonic()
    async with s.post(url + "/v1/chat/completions", json=body, headers=hdrs) as resp:
        first: float | None = None
        data = b""
        async for chunk in resp.content.iter_any():
            if first is None and resp.status == 200:
                first = time.monotonic()
            data += chunk
        headers = {k.lower(): v for k, v in resp.headers.items()}
        return Answer(name, resp.status, sent, first, headers, data)


def queued(router_url: str) -> dict[tuple[str, str], float]:
    """The router's llmgw_router_flow_queued series: (band, team) → value."""
    with urllib.request.urlopen(router_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for m in re.finditer(
        r'^llmgw_router_flow_queued\{band="(\w+)",team="(\w*)"\} (\S+)$', text, re.M
    ):
        out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def granted(router_url: str) -> dict[tuple[str, str], float]:
    """The router's llmgw_router_flow_wait_seconds counts: (band, team) → requests
    granted after waiting in flow control."""
    with urllib.request.urlopen(router_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    pattern = r'^llmgw_router_flow_wait_seconds_count\{band="(\w+)",team="(\w*)"\} (\S+)$'
    return {(m[1], m[2]): float(m[3]) for m in re.finditer(pattern, text, re.M)}


async def until(cond: object, what: str, timeout_s: float = 15.0) -> None:
    """Wait on the loop for `cond()` (a metrics read in a thread)."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(cond):  # type: ignore[arg-type]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def scenario(url: str) -> list[Answer]:
    """Show the engine's capacity; fill it with 8 batch requests; queue 4 more batch, one
    over the bound, a standard one that waits too long, and a critical one."""
    async with aiohttp.ClientSession() as s:
        # 12 at once on an engine of 8: it queues, and the router learns its capacity.
        warm = await asyncio.gather(*(send(s, url, f"warm{i}", "bulk", 150) for i in range(12)))
        assert [a.status for a in warm] == [200] * 12
        running = [
            asyncio.create_task(send(s, url, f"run{i}", "bulk", LONG + STAGGER * i))
            for i in range(8)
        ]
        # Streams awaiting their first token count twice (scheduler.py): some of the 8
        # wait in the router until the engine's first tokens come, then all run.
        await asyncio.sleep(0.5)
        await until(lambda: queued(url) == {}, "the 8 dispatched")
        held = []
        for i in range(4):
            held.append(asyncio.create_task(send(s, url, f"held{i}", "bulk")))
            await until(lambda n=i + 1: queued(url).get(("batch", "bulk")) == n, f"{i + 1} held")
        over = await send(s, url, "over", "bulk")
        slow = asyncio.create_task(send(s, url, "slow", "web"))
        crit = asyncio.create_task(send(s, url, "crit", "ops"))
        await until(lambda: ("critical", "ops") in queued(url), "the critical one queued")
        rest = await asyncio.gather(*running, *held, slow, crit)
        return [*warm, over, *rest]


async def backlog_scenario(url: str) -> list[Answer]:
    """Fill the engine, queue 4 batch requests and let 2 of them be granted (so the
    queue knows its grant rate), then send 4 critical requests at once."""
    async with aiohttp.ClientSession() as s:
        running = [
            asyncio.create_task(send(s, url, f"run{i}", "bulk", LONG + STAGGER * i))
            for i in range(8)
        ]
        await asyncio.sleep(0.5)
        await until(lambda: queued(url) == {}, "the 8 dispatched")
        held = []
        for i in range(4):
            held.append(asyncio.create_task(send(s, url, f"held{i}", "bulk")))
            await until(lambda n=i + 1: queued(url).get(("batch", "bulk")) == n, f"{i + 1} held")
        await until(lambda: queued(url).get(("batch", "bulk")) == 2, "2 granted", 30.0)
        burst = await asyncio.gather(*(send(s, url, f"crit{i}", "ops", 5) for i in range(4)))
        rest = await asyncio.gather(*running, *held)
        return [*burst, *rest]


class TestFlowControl:
    """At saturation the router queues by band and team, refuses at its bounds, loses nothing."""

    def test_critical_overtakes_batch_and_bounds_refuse_with_reasons(self, setup: Setup) -> None:
        """The critical request's first token comes before any batch request queued
        before it; past the batch bound a 429 and past the standard wait a 503, each
        with its reason and Retry-After; every request answered."""
        answers = {a.name: a for a in asyncio.run(scenario(setup.router.url))}
        assert len(answers) == 12 + 8 + 4 + 3  # nothing lost

        over = answers["over"]
        assert over.status == 429
        assert over.headers["retry-after"].isdigit()
        err = json.loads(over.body)["error"]
        assert err["code"] == "flow_queue_full"
        assert "batch band's queue is full" in err["message"]

        slow = answers["slow"]
        assert slow.status == 503
        assert int(slow.headers["retry-after"]) >= 1
        err = json.loads(slow.body)["error"]
        assert err["code"] == "flow_wait_exceeded"
        assert "standard band's queue" in err["message"]

        crit = answers["crit"]
        assert crit.status == 200
        held = [answers[f"held{i}"] for i in range(4)]
        assert all(a.status == 200 for a in held)
        assert crit.first_at is not None
        assert all(a.first_at is not None and crit.first_at < a.first_at for a in held)
        for name in [f"run{i}" for i in range(8)] + [f"warm{i}" for i in range(12)]:
            assert answers[name].status == 200, name
            assert answers[name].body.rstrip().endswith(b"data: [DONE]")

        wait_until(lambda: queued(setup.router.url) == {}, timeout_s=5, what="queues empty")
        # Each granted wait is counted by band and team; refused ones are not.
        waits = granted(setup.router.url)
        assert waits[("critical", "ops")] == 1
        assert waits[("batch", "bulk")] >= 4
        assert ("standard", "web") not in waits

    def test_a_backlog_past_its_turnovers_is_refused_at_once(self, setup: Setup) -> None:
        """Four critical requests at once on a full engine: the team's first is queued and
        served (it had nothing queued), those past a quarter turnover of backlog are
        answered 429 at once with the wait they would have had; every request answered."""
        answers = {a.name: a for a in asyncio.run(backlog_scenario(setup.router.url))}
        assert len(answers) == 4 + 8 + 4  # nothing lost
        crit = [answers[f"crit{i}"] for i in range(4)]
        assert {a.status for a in crit} <= {200, 429}
        served = [a for a in crit if a.status == 200]
        refused = [a for a in crit if a.status == 429]
        assert served
        assert refused
        for a in refused:
            err = json.loads(a.body)["error"]
            assert err["code"] == "flow_queue_full"
            assert "would wait about" in err["message"]
            assert "critical band's queue" in err["message"]
            assert a.headers["retry-after"].isdigit()
        for a in served:
            assert a.body.rstrip().endswith(b"data: [DONE]")
        for name in [f"run{i}" for i in range(8)] + [f"held{i}" for i in range(4)]:
            assert answers[name].status == 200, name

        wait_until(lambda: queued(setup.router.url) == {}, timeout_s=5, what="queues empty")
