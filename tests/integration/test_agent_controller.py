"""The real agent against the real controller (SQLite), with sim-engine children.

Models are applied through the controller's admin API; the tests watch
replicas turn ready, a fake GPU fault keep the controller off that card, and
the controller going away leave the engines untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing.procs import Program, free_port, start_program
from llmgw.testing.wait import until
from tests.integration.controller_harness import wait_ticks
from tests.integration.test_agent_supervision import AgentRig, alive, engine_health

pytestmark = pytest.mark.timeout(120)

TOKEN = "T"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class ControllerRig:
    """A controller on a fixed port and SQLite file, so it can be stopped and started again."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Program | None = None

    def start(self) -> None:
        self.proc = start_program(
            [
                "controller",
                "--port",
                str(self.port),
                "--database",
                f"sqlite:///{self.tmp / 'c.db'}",
                "--token",
                TOKEN,
                "--tick-s",
                "0.2",
                "--heartbeat-interval-s",
                "0.3",
                "--heartbeat-timeout-s",
                "5",
            ],
            log_dir=self.tmp / "controller-logs",
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(grace_s=5)
            self.proc = None

    async def node_registered(self, s: aiohttp.ClientSession, node: str = "n1") -> None:
        """Wait until `node` is in the controller's node list (its agent's first beat)."""

        async def registered() -> bool:
            async with s.get(f"{self.url}/admin/nodes", headers=AUTH) as resp:
                return any(n["name"] == node for n in await resp.json())

        await until(registered, timeout_s=30, every_s=0.2, what=f"node {node} registered")


@pytest.fixture
def ctrl(tmp_path: Path) -> Iterator[ControllerRig]:
    c = ControllerRig(tmp_path)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def agent_rig(tmp_path: Path, ctrl: ControllerRig) -> Iterator[AgentRig]:
    r = AgentRig(tmp_path, ctrl.url, token=TOKEN)
    try:
        yield r
    finally:
        r.cleanup()


async def admin(method: str, url: str, body: Any = None) -> Any:
    async with (
        aiohttp.ClientSession(headers=AUTH) as s,
        s.request(method, url, json=body) as resp,
    ):
        data = await resp.json()
        assert resp.status == 200, data
        return data


def sim_model(name: str, *, replicas: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "engine": "sim",
        "gpu_classes": ["H100-80G"],
        "gpus_per_node": 1,
        "min_replicas": replicas,
        "max_replicas": replicas,
        "args": ["--speed", "10"],
    }


async def replicas(ctrl: ControllerRig, model: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = await admin("GET", f"{ctrl.url}/admin/replicas?model={model}")
    return data


async def wait_replicas(
    ctrl: ControllerRig, model: str, *, ready: int, timeout_s: float = 45.0
) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]]:
        last = await replicas(ctrl, model)
        assert sum(r["state"] == "ready" for r in last) == ready, last
        return last

    # A failed check is "not yet"; on timeout its message shows the replicas last seen.
    got: list[dict[str, Any]] = await until(
        check,
        timeout_s=timeout_s,
        every_s=0.2,
        ignore=(AssertionError,),
        what=f"{model}: {ready} ready",
    )
    return got


class TestWithController:
    """A real agent serves what a real controller places, skips bad cards, outlives it."""

    async def test_model_becomes_ready(self, ctrl: ControllerRig, agent_rig: AgentRig) -> None:
        """A sim model applied to the controller is started by the agent and turns ready."""
        agent_rig.start()
        await admin("POST", f"{ctrl.url}/admin/models", sim_model("m1"))
        (r,) = await wait_replicas(ctrl, "m1", ready=1)
        (shard,) = r["shards"]
        assert shard["node"] == "n1"
        assert shard["pid"] is not None
        assert alive(shard["pid"])
        assert r["endpoint_url"] == f"http://127.0.0.1:{shard['port']}"
        assert await engine_health(shard["port"]) == 200

    async def test_unhealthy_gpu_is_not_placed_on(
        self, ctrl: ControllerRig, agent_rig: AgentRig
    ) -> None:
        """A fake GPU made unhealthy gets no replica until it is healthy again."""
        agent = agent_rig.start()
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{agent.url}/gpus/0/unhealthy", json={"reason": "xid 79"}) as r:
                assert r.status == 200

            async def node_unhealthy() -> tuple[int, ...] | None:
                async with s.get(f"{ctrl.url}/admin/nodes/n1", headers=AUTH) as resp:
                    # 404 until the agent's first heartbeat registers the node.
                    return tuple((await resp.json())["unhealthy"]) if resp.status == 200 else None

            await until(
                lambda: _equal(node_unhealthy(), (0,)),
                timeout_s=20,
                every_s=0.1,
                what="GPU 0 unhealthy",
            )
            await admin("POST", f"{ctrl.url}/admin/models", sim_model("m2", replicas=2))
            (ready,) = await wait_replicas(ctrl, "m2", ready=1)
            assert ready["shards"][0]["gpus"] == [1]
            # Several ticks later the second replica is still unplaced.
            await asyncio.to_thread(wait_ticks, ctrl.url, TOKEN, 5)
            placed = [
                r for r in await replicas(ctrl, "m2") for sh in r["shards"] if 0 in sh["gpus"]
            ]
            assert placed == []
            async with s.post(f"{agent.url}/gpus/0/healthy") as r:
                assert r.status == 200
        both = await wait_replicas(ctrl, "m2", ready=2)
        assert sorted(r["shards"][0]["gpus"][0] for r in both) == [0, 1]

    async def test_controller_down_engines_untouched(
        self, ctrl: ControllerRig, agent_rig: AgentRig
    ) -> None:
        """With the controller gone for a while, engines keep running; back, nothing restarts."""
        agent_rig.start()
        await admin("POST", f"{ctrl.url}/admin/models", sim_model("m3"))
        (r,) = await wait_replicas(ctrl, "m3", ready=1)
        pid, port = r["shards"][0]["pid"], r["shards"][0]["port"]
        agent_rig.note_pids()
        ctrl.stop()
        await asyncio.sleep(3.0)
        assert alive(pid)
        assert await engine_health(port) == 200
        ctrl.start()
        await wait_replicas(ctrl, "m3", ready=1)
        # A few ticks and heartbeats after the return: still the same replica and engine.
        await asyncio.to_thread(wait_ticks, ctrl.url, TOKEN, 5)
        (again,) = await wait_replicas(ctrl, "m3", ready=1)
        assert (again["id"], again["shards"][0]["pid"]) == (r["id"], pid)
        assert alive(pid)


async def _equal(got: Awaitable[Any], expect: Any) -> bool:
    return bool(await got == expect)


class TestMultiNode:
    """A replica spanning two real agents comes up."""

    async def test_two_node_replica(self, ctrl: ControllerRig, tmp_path: Path) -> None:
        """A two-node model runs one sim-engine per node, ranks 0 and 1, and turns ready."""
        rigs = [
            AgentRig(tmp_path, ctrl.url, token=TOKEN, node=n, gpus="1xH100-80G") for n in ("a", "b")
        ]
        try:
            for r in rigs:
                r.start()
            model = {**sim_model("big"), "nodes": 2}
            await admin("POST", f"{ctrl.url}/admin/models", model)
            (r,) = await wait_replicas(ctrl, "big", ready=1)
            shards = sorted(r["shards"], key=lambda s: s["rank"])
            assert [s["rank"] for s in shards] == [0, 1]
            assert {s["node"] for s in shards} == {"a", "b"}
            for s in shards:
                assert alive(s["pid"])
                assert await engine_health(s["port"]) == 200
            assert r["endpoint_url"] == f"http://127.0.0.1:{shards[0]['port']}"
        finally:
            for r in rigs:
                r.cleanup()
