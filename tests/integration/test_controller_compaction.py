"""Compaction with real processes: a controller, four agents with fake GPUs running
sim-engines, and a router serving the replica that is moved to make room.

The fleet: a-1, a-2 on fabric ib0 and b-1, b-2 on ib1, eight cards each. x (4
cards) lands on a-1 and y (8 cards) on b-1 (a-2 cordoned while y is placed), so a
model needing two whole nodes on one fabric fits nowhere, though enough cards are
free, and neither x nor y is idle-evictable (min_replicas 1).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing.wait import until
from tests.integration.router_fixtures import base_config, chat_body, get_json, post, router
from tests.integration.test_agent_controller import (
    TOKEN,
    ControllerRig,
    admin,
    replicas,
    sim_model,
    wait_replicas,
)
from tests.integration.test_agent_supervision import AgentRig

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

NODES = {"a-1": "ib0", "a-2": "ib0", "b-1": "ib1", "b-2": "ib1"}


def model(name: str, *, gpus: int, nodes: int = 1) -> dict[str, Any]:
    return {**sim_model(name), "gpus_per_node": gpus, "nodes": nodes}


async def events(ctrl: ControllerRig, **query: str) -> list[dict[str, Any]]:
    q = "&".join(f"{k}={v}" for k, v in query.items())
    got: list[dict[str, Any]] = await admin("GET", f"{ctrl.url}/admin/events?{q}")
    return got


class TestCompaction:
    """A fragmented fleet is compacted, and the moved replica's clients never notice."""

    async def test_the_moved_replica_serves_throughout_and_every_model_ends_ready(
        self, tmp_path: Path
    ) -> None:
        """big (two whole nodes on one fabric) is placed after one replica moves; requests to
        x and y all succeed meanwhile; events say what moved for whom."""
        ctrl = ControllerRig(tmp_path)
        ctrl.start()
        rigs = [
            AgentRig(tmp_path, ctrl.url, token=TOKEN, node=n, gpus="8xH100-80G", fabric=f)
            for n, f in NODES.items()
        ]
        try:
            for r in rigs:
                r.start()
            await admin("POST", f"{ctrl.url}/admin/models", model("x", gpus=4))
            (x,) = await wait_replicas(ctrl, "x", ready=1)
            await admin("POST", f"{ctrl.url}/admin/nodes/a-2/cordon")
            await admin("POST", f"{ctrl.url}/admin/models", model("y", gpus=8))
            (y,) = await wait_replicas(ctrl, "y", ready=1)
            await admin("POST", f"{ctrl.url}/admin/nodes/a-2/uncordon")
            assert [x["shards"][0]["node"], y["shards"][0]["node"]] == ["a-1", "b-1"]
            cfg = base_config(
                controller={"url": ctrl.url, "token": TOKEN, "poll_timeout_s": 2.0},
                hold_timeout_s=30.0,
                report_interval_s=0.2,
            )
            with router(tmp_path, cfg) as r:
                await until(
                    lambda: {"x", "y"} <= {m["id"] for m in get_json(r.url + "/v1/models")["data"]},
                    timeout_s=30,
                    every_s=0.2,
                    blocking=True,
                    what="the router knows x and y",
                )
                statuses, ends = await self._traffic_during(ctrl, r.url)
            assert statuses, "no request was sent"
            assert set(statuses) == {200}, statuses
            assert len(ends) >= 2
        finally:
            for rig in rigs:
                rig.cleanup()
            ctrl.stop()

    async def _traffic_during(self, ctrl: ControllerRig, url: str) -> tuple[list[int], set[str]]:
        """Requests to x and y in a loop while big is applied and placed; the statuses, and
        the replicas of x that answered."""
        statuses: list[int] = []
        ends: set[str] = set()
        done = asyncio.Event()

        async def clients() -> None:
            async with aiohttp.ClientSession() as s:
                while not done.is_set():
                    for name in ("x", "y"):
                        reply = await post(s, url, chat_body("hi", model=name, max_tokens=4))
                        statuses.append(reply.status)
                        if name == "x" and reply.endpoint is not None:
                            ends.add(reply.endpoint)
                    await asyncio.sleep(0.05)

        task = asyncio.create_task(clients())
        try:
            await asyncio.sleep(1.0)
            await admin("POST", f"{ctrl.url}/admin/models", model("big", gpus=8, nodes=2))
            (big,) = await wait_replicas(ctrl, "big", ready=1, timeout_s=120)
            assert {s["node"] for s in big["shards"]} in ({"a-1", "a-2"}, {"b-1", "b-2"})
            for name in ("x", "y"):
                assert sum(r["state"] == "ready" for r in await replicas(ctrl, name)) == 1
            said = [e["message"] for e in await events(ctrl, model="big")]
            assert any(m.startswith("moving ") and "to make room" in m for m in said), said
            await asyncio.sleep(1.0)
        finally:
            done.set()
            await task
        return statuses, ends
