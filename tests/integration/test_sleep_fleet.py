"""Sleeping replicas end to end: a real controller, agent, sim-engines and router.

One H100 card, two sleep-mode models: the idle one sleeps when the other is wanted,
and a request for a sleeping model is held by the router, triggers one wake (however
many requests wait), and is served by the same replica, not a new one. Three cards, a
model scaled down whose engine takes seconds to fall asleep: scaled up again meanwhile,
that replica wakes once asleep; nothing starts cold on the free card.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing import Program, free_port, start_program
from llmgw.testing.wait import until
from tests.integration.router_fixtures import Reply, base_config, chat_body, post, router
from tests.integration.test_agent_controller import TOKEN, admin
from tests.integration.test_agent_supervision import AgentRig

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, AgentRig]]:
    yield from _fleet(tmp_path, "1xH100-80G")


@pytest.fixture
def three_cards(tmp_path: Path) -> Iterator[tuple[str, AgentRig]]:
    yield from _fleet(tmp_path, "3xH100-80G")


def _fleet(tmp_path: Path, gpus: str) -> Iterator[tuple[str, AgentRig]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    flags = ["--port", str(port), "--database", f"sqlite:///{tmp_path / 'c.db'}"]
    flags += ["--token", TOKEN, "--tick-s", "0.2", "--heartbeat-interval-s", "0.3"]
    flags += ["--heartbeat-timeout-s", "5", "--scale-down-cooldown-s", "1"]
    ctrl: Program = start_program(["controller", *flags], log_dir=tmp_path / "controller")
    agent = AgentRig(tmp_path, url, token=TOKEN, gpus=gpus)
    try:
        agent.start("--host-memory-mib", "2000000")
        yield url, agent
    finally:
        agent.cleanup()
        ctrl.stop(grace_s=5)


def sleepy(name: str, *args: str) -> dict[str, Any]:
    return {
        "name": name,
        "engine": "sim",
        "gpu_classes": ["H100-80G"],
        "min_replicas": 0,
        "max_replicas": 1,
        "idle_timeout_s": 1,
        "sleep_mode": True,
        "weights_gb": 16,
        "args": ["--speed", "10", "--wake-l1-s", "3", *args],
    }


async def replicas(url: str, model: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = await admin("GET", f"{url}/admin/replicas?model={model}")
    return [r for r in got if r["state"] != "stopped"]


async def wait_state(
    url: str, model: str, state: str, *, timeout_s: float = 40.0
) -> dict[str, Any]:
    async def check() -> dict[str, Any]:
        seen = await replicas(url, model)
        assert len(seen) == 1, seen  # a failed look is "not yet", shown if it never holds
        assert seen[0]["state"] == state, seen
        return seen[0]

    got: dict[str, Any] = await until(
        check, timeout_s=timeout_s, ignore=(AssertionError,), what=f"{model} {state}"
    )
    return got


async def wait_idle(url: str, model: str) -> None:
    """Until the controller knows the model's replica idle past its 1 s timeout (what the
    router reports), where a fixed sleep would guess when the report arrives."""

    async def idle() -> bool:
        seen = await replicas(url, model)
        return len(seen) == 1 and seen[0]["idle_seconds"] >= 1

    await until(idle, timeout_s=20, what=f"{model} known idle past its timeout")


async def wait_models(s: aiohttp.ClientSession, router_url: str, names: set[str]) -> None:
    """Until the router has the controller's list (it names every model)."""

    async def listed() -> bool:
        async with s.get(router_url + "/v1/models") as resp:
            return names <= {m["id"] for m in (await resp.json())["data"]}

    await until(listed, timeout_s=20, what=f"the router listing {names}")


async def ask(s: aiohttp.ClientSession, router_url: str, model: str) -> Reply:
    return await post(s, router_url, chat_body("hello", model=model, max_tokens=4))


class TestSleepingFleet:
    """An idle replica sleeps and a held request wakes it once."""

    async def test_idle_sleeps_and_a_held_request_wakes_it_once(
        self, tmp_path: Path, fleet: tuple[str, AgentRig]
    ) -> None:
        """b wanted on a's card: a sleeps; five requests for a: one wake, a itself serves."""
        url, _ = fleet
        await admin("POST", f"{url}/admin/models", [sleepy("a"), sleepy("b")])
        cfg = base_config(
            controller={"url": url, "token": TOKEN, "poll_timeout_s": 5.0},
            hold_timeout_s=60.0,
            report_interval_s=0.2,
        )
        with router(tmp_path, cfg) as r:
            async with aiohttp.ClientSession() as s:
                await wait_models(s, r.url, {"a", "b"})
                first = await asyncio.wait_for(ask(s, r.url, "a"), 60)
                assert first.status == 200, first.body
                a_id = first.endpoint
                await wait_idle(url, "a")
                # b is wanted; a has been idle past its 1 s timeout: it sleeps, b starts.
                second = await asyncio.wait_for(ask(s, r.url, "b"), 60)
                assert second.status == 200, second.body
                a = await wait_state(url, "a", "sleeping")
                assert (a["id"], a["sleep_level"]) == (a_id, 1)
                await wait_idle(url, "b")
                # Five requests for the sleeping a: held, one wake, all served by a itself.
                replies = await asyncio.wait_for(
                    asyncio.gather(*(ask(s, r.url, "a") for _ in range(5))), 60
                )
        assert [x.status for x in replies] == [200] * 5, [x.body for x in replies]
        assert {x.endpoint for x in replies} == {a_id}
        events = await admin("GET", f"{url}/admin/events?model=a")
        wakes = [e for e in events if e["kind"] == "replica.waking"]
        assert len(wakes) == 1, events
        assert any(
            e["kind"] == "replica.sleeping" or "sleeps at level" in e["message"] for e in events
        )
        # b made way for a: swapped out when a was asked for, or, idle past its timeout
        # over a's sleeper, cleared ahead before that.
        b = await wait_state(url, "b", "sleeping")
        assert re.search(r"(swapped out|cleared ahead) for a\b", b["reason"] or ""), b


class TestFallingAsleep:
    """A replica wanted again while it falls asleep wakes in place, never cold."""

    async def test_wanted_while_falling_asleep_it_wakes_in_place(
        self, three_cards: tuple[str, AgentRig]
    ) -> None:
        """Scaled 2 → 1, one replica takes 6 s to fall asleep; scaled back to 2 meanwhile,
        that replica wakes once asleep and nothing starts cold on the free card."""
        url, _ = three_cards
        two = {**sleepy("a", "--sleep-s", "60"), "min_replicas": 2, "max_replicas": 2}
        one = {**two, "min_replicas": 1, "max_replicas": 1}
        await admin("POST", f"{url}/admin/models", [two])

        async def states() -> list[tuple[str, str, list[str]]]:
            got = await replicas(url, "a")
            return sorted((r["id"], r["state"], [x["state"] for x in r["shards"]]) for r in got)

        async def both_ready() -> bool:
            return [st for _, st, _ in await states()] == ["ready", "ready"]

        await until(both_ready, timeout_s=40, what="two replicas of a ready")
        await admin("POST", f"{url}/admin/models", [one])

        async def one_falling_asleep() -> str | None:
            falling = [
                rid for rid, st, shards in await states() if (st, shards) == ("sleeping", ["ready"])
            ]
            return falling[0] if falling else None

        sleeper = await until(one_falling_asleep, timeout_s=20, what="a replica falling asleep")
        await admin("POST", f"{url}/admin/models", [two])
        await until(both_ready, timeout_s=40, what="a back to two ready replicas")
        every = await admin("GET", f"{url}/admin/replicas?model=a")
        assert len(every) == 2, every
        assert sleeper in {r["id"] for r in every}, every
        events = await admin("GET", f"{url}/admin/events?model=a")
        kinds = [e["kind"] for e in events]
        assert (kinds.count("replica.placed"), kinds.count("replica.waking")) == (2, 1), events


class TestClearingAhead:
    """An idle replica over a slower-waking sleeper sleeps before that sleeper is asked for."""

    async def test_idle_small_sleeps_ahead_and_big_wakes_without_a_swap(
        self, tmp_path: Path, fleet: tuple[str, AgentRig]
    ) -> None:
        """big asleep under small; small idle: it sleeps unasked; big then wakes on a free card."""
        url, _ = fleet
        big = {**sleepy("big"), "weights_gb": 60}
        await admin("POST", f"{url}/admin/models", [big, sleepy("small")])
        cfg = base_config(
            controller={"url": url, "token": TOKEN, "poll_timeout_s": 5.0},
            hold_timeout_s=60.0,
            report_interval_s=0.2,
        )
        with router(tmp_path, cfg) as r:
            async with aiohttp.ClientSession() as s:
                await wait_models(s, r.url, {"big", "small"})
                first = await asyncio.wait_for(ask(s, r.url, "big"), 60)
                assert first.status == 200, first.body
                await asyncio.sleep(1.5)  # big idle past its timeout, as the router reports
                second = await asyncio.wait_for(ask(s, r.url, "small"), 60)
                assert second.status == 200, second.body
                # Nobody asks for anything now: small, idle past 1 s, sleeps for big.
                small = await wait_state(url, "small", "sleeping")
                assert "cleared ahead for big" in (small["reason"] or ""), small
                again = await asyncio.wait_for(ask(s, r.url, "big"), 60)
        assert again.status == 200, again.body
        assert again.endpoint == first.endpoint
        events = await admin("GET", f"{url}/admin/events?model=big")
        wakes = [e["message"] for e in events if e["kind"] == "replica.waking"]
        assert len(wakes) == 1, events
        assert "make way" not in wakes[0], wakes
