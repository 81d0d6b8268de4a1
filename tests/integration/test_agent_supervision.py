"""A real agent process with real sim-engine children, against a scripted controller.

The controller here is a test-local aiohttp server playing the heartbeat route
only, so each test can script exactly what the agent is told (a desired set,
a 503, silence). The agent and its engines are real processes; every engine
PID seen is killed by process group when the test ends, pass or fail.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from llmgw.agent.statefile import STATE_FILE, StateDoc
from llmgw.testing.procs import Program, start_program
from llmgw.testing.wait import until
from llmgw.wire.agent import Heartbeat, HeartbeatReply, ShardSpec, ShardStatus

pytestmark = pytest.mark.timeout(90)

INTERVAL_S = 0.3


class ScriptedController:
    """The controller's heartbeat route, with the answer set by the test."""

    def __init__(self) -> None:
        self.desired: tuple[ShardSpec, ...] = ()
        self.beats: list[Heartbeat] = []
        # time.monotonic() at each heartbeat's arrival, beside `beats`.
        self.beat_times: list[float] = []
        # While True, answer 503 like a standby controller.
        self.down = False
        # Changes the reply's JSON before it is sent (what a newer controller may add).
        self.edit: Callable[[dict[str, Any]], None] | None = None
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _heartbeat(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer secret":
            return web.json_response({"error": {"message": "no token"}}, status=401)
        if self.down:
            return web.json_response({"error": {"type": "not_leader"}}, status=503)
        hb = msgspec.json.decode(await request.read(), type=Heartbeat)
        assert hb.node == request.match_info["node"]
        self.beats.append(hb)
        self.beat_times.append(time.monotonic())
        reply = HeartbeatReply(shards=self.desired, interval_s=INTERVAL_S)
        body = msgspec.json.encode(reply)
        if self.edit is not None:
            doc = msgspec.json.decode(body)
            self.edit(doc)
            body = msgspec.json.encode(doc)
        return web.Response(body=body, content_type="application/json")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/agents/{node}/heartbeat", self._heartbeat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def last(self) -> Heartbeat:
        return self.beats[-1]

    def shard(self, replica_id: str, rank: int = 0) -> ShardStatus | None:
        if not self.beats:
            return None
        for s in self.last().shards:
            if (s.replica_id, s.rank) == (replica_id, rank):
                return s
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2] != "Z"


def sim_spec(
    replica_id: str, *, args: tuple[str, ...] = (), gpus: tuple[int, ...] = (0,)
) -> ShardSpec:
    return ShardSpec(
        replica_id=replica_id,
        rank=0,
        model="sim-model",
        served_names=("sim-model", "sim-alias"),
        engine="sim",
        gpu_indices=gpus,
        args=("--speed", "10", *args),
    )


class AgentRig:
    """Starts and restarts the agent on one state dir; remembers every engine PID."""

    def __init__(
        self,
        tmp: Path,
        url: str,
        *,
        token: str = "secret",
        node: str = "n1",
        gpus: str = "2xH100-80G",
        pid_source: Callable[[], Iterable[int]] = lambda: (),
        address: str = "127.0.0.1",
        name: str | None = None,
        fabric: str = "ib0",
    ) -> None:
        self.node = node
        self.fabric = fabric
        self.address = address
        self.gpus = gpus
        # The rig's own folder (state, logs): the node's name unless told otherwise
        # (two agents claiming one node name need two folders).
        self.tmp = tmp / (name or node)
        self.url = url
        self.token = token
        self.pid_source = pid_source
        lo = random.randrange(30000, 60000, 50)
        self.port_range = f"{lo}-{lo + 49}"
        self.agent: Program | None = None
        self.engine_pids: set[int] = set()

    def start(
        self,
        *flags: str,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        interval_s: float = INTERVAL_S,
    ) -> Program:
        extra: list[str] = list(flags)
        self.agent = start_program(
            [
                "agent",
                *extra,
                "--controller",
                self.url,
                "--token",
                self.token,
                "--node",
                self.node,
                "--gpus",
                self.gpus,
                "--fabric",
                self.fabric,
                "--label",
                "zone=a",
                "--address",
                self.address,
                "--port-range",
                self.port_range,
                "--state-dir",
                str(self.tmp / "state"),
                "--interval-s",
                str(interval_s),
                "--stop-grace-s",
                "3",
                "--port",
                "0",
            ],
            log_dir=self.tmp / "agent-logs",
            env=env,
            wait=wait,
        )
        return self.agent

    def note_pids(self) -> None:
        """Remember every engine pid known so far (state file and the test's own source)."""
        self.engine_pids.update(self.pid_source())
        path = self.tmp / "state" / STATE_FILE
        if path.exists():
            doc = msgspec.json.decode(path.read_bytes(), type=StateDoc)
            self.engine_pids.update(r.pid for r in doc.shards)

    def cleanup(self) -> None:
        self.note_pids()
        if self.agent is not None:
            self.agent.stop(grace_s=5)
            # Engines it started after the first look are in its state file now.
            self.note_pids()
        for pid in self.engine_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def scripted_controller() -> AsyncIterator[ScriptedController]:
    """A started ScriptedController, stopped at the end (the fixtures of every file
    that drives one agent against it)."""
    c = ScriptedController()
    await c.start()
    try:
        yield c
    finally:
        await c.stop()


@contextlib.contextmanager
def rig_for(tmp_path: Path, controller: ScriptedController) -> Iterator[AgentRig]:
    """An AgentRig heartbeating to `controller`, which also learns the engines' pids from
    the heartbeats (so cleanup ends engines the agent started after its first look)."""

    def beat_pids() -> Iterator[int]:
        for hb in controller.beats:
            yield from (s.pid for s in hb.shards if s.pid is not None)

    r = AgentRig(tmp_path, controller.url, pid_source=beat_pids)
    try:
        yield r
    finally:
        r.cleanup()


@pytest.fixture
async def controller() -> AsyncIterator[ScriptedController]:
    async with scripted_controller() as c:
        yield c


@pytest.fixture
def rig(tmp_path: Path, controller: ScriptedController) -> Iterator[AgentRig]:
    with rig_for(tmp_path, controller) as r:
        yield r


async def get_status(agent: Program) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{agent.url}/status") as resp:
        assert resp.status == 200
        data: dict[str, Any] = await resp.json()
        return data


async def engine_health(port: int) -> int:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/health") as resp:
        return resp.status


class TestInventoryAndHeartbeat:
    """The agent's heartbeat carries its inventory and injected faults."""

    async def test_heartbeat_carries_inventory(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """The first heartbeat reports GPUs, fabrics, labels, address, ports and start time."""
        rig.start()
        await until(lambda: controller.beats, what="a heartbeat")
        hb = controller.last()
        assert [g.gpu_class for g in hb.gpus] == ["H100-80G", "H100-80G"]
        assert (hb.fabrics, hb.labels, hb.address) == (("ib0",), {"zone": "a"}, "127.0.0.1")
        lo, hi = (int(p) for p in rig.port_range.split("-"))
        assert hb.port_range == (lo, hi)
        assert hb.agent_started_at > time.time() - 60

    async def test_fake_gpu_fault_round_trip(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """A GPU made unhealthy over the loopback endpoint is reported so, then healthy again."""
        agent = rig.start()
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{agent.url}/gpus/1/unhealthy", json={"reason": "xid 79"}) as r:
                assert r.status == 200
            await until(
                lambda: controller.beats and not controller.last().gpus[1].healthy,
                what="GPU 1 reported unhealthy",
            )
            assert controller.last().gpus[1].reason == "xid 79"
            assert controller.last().gpus[0].healthy
            async with s.post(f"{agent.url}/gpus/1/healthy") as r:
                assert r.status == 200
            await until(lambda: controller.last().gpus[1].healthy, what="GPU 1 healthy")
            async with s.post(f"{agent.url}/gpus/9/unhealthy") as r:
                assert r.status == 404


class TestShards:
    """Shards started, reported ready, crashed, failed or stopped by a real agent."""

    async def test_start_ready_reported(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """A desired sim shard starts, becomes ready, and is reported with its pid and port."""
        controller.desired = (sim_spec("r1"),)
        rig.start()
        st = await until(
            lambda: (s := controller.shard("r1")) and s.state == "ready" and s, what="r1 ready"
        )
        assert st.pid is not None
        assert st.port is not None
        assert await engine_health(st.port) == 200
        # The engine runs in its own session: its process group is its pid.
        assert os.getpgid(st.pid) == st.pid

    async def test_crash_reported_with_exit_code(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """An engine that crashes while serving is reported failed with its exit code."""
        controller.desired = (sim_spec("r1", args=("--crash-after-requests", "0")),)
        rig.start()
        st = await until(
            lambda: (s := controller.shard("r1")) and s.state == "ready" and s, what="r1 ready"
        )
        body = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
        url = f"http://127.0.0.1:{st.port}/v1/completions"
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {st.api_key}"}) as s:
            with contextlib.suppress(aiohttp.ClientError):
                await s.post(url, json=body)
        failed = await until(
            lambda: (s := controller.shard("r1")) and s.state == "failed" and s, what="failed"
        )
        # The sim-engine's crash fault exits with 70 (os._exit).
        assert (failed.exit_code, failed.pid) == (70, None)
        assert failed.log_tail

    async def test_startup_failure_reported_with_log(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """An engine that refuses to start is failed with its exit code and its last log lines."""
        controller.desired = (sim_spec("bad", args=("--num-gpu-blocks", "1")),)
        rig.start()
        st = await until(
            lambda: (s := controller.shard("bad")) and s.state == "failed" and s, what="failed"
        )
        assert st.exit_code == 2
        assert any("num-gpu-blocks" in line for line in st.log_tail)

    async def test_unlisted_shard_is_stopped(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """A shard the controller stops listing is stopped and its process ends."""
        controller.desired = (sim_spec("r1"),)
        rig.start()
        st = await until(
            lambda: (s := controller.shard("r1")) and s.state == "ready" and s, what="r1 ready"
        )
        controller.desired = ()
        await until(lambda: not alive(st.pid), what="engine gone")
        await until(lambda: controller.shard("r1") is None, what="r1 forgotten")

    async def test_controller_down_engines_untouched(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """While the controller answers 503, engines keep serving; nothing restarts after."""
        controller.desired = (sim_spec("r1"),)
        agent = rig.start()
        st = await until(
            lambda: (s := controller.shard("r1")) and s.state == "ready" and s, what="r1 ready"
        )
        controller.down = True

        async def two_failures() -> bool:
            status = await get_status(agent)
            return bool(status["controller"]["consecutive_failures"] >= 2)

        await until(two_failures, what="two failed heartbeats")
        assert alive(st.pid)
        assert await engine_health(st.port) == 200
        n = len(controller.beats)
        controller.down = False
        await until(lambda: len(controller.beats) > n, timeout_s=40, what="beats again")
        again = controller.shard("r1")
        assert again is not None
        assert (again.pid, again.state) == (st.pid, "ready")


class TestReadoption:
    """A restarted agent readopts its engines or reports those that died meanwhile."""

    async def test_sigkilled_agent_readopts(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """After SIGKILL and restart, the agent reports the same engine PIDs, still serving."""
        controller.desired = (sim_spec("r1"), sim_spec("r2", gpus=(1,)))
        agent = rig.start()
        await until(
            lambda: all((s := controller.shard(r)) and s.state == "ready" for r in ("r1", "r2")),
            what="both ready",
        )
        before = {s.replica_id: (s.pid, s.port) for s in controller.last().shards}
        rig.note_pids()
        agent.signal(signal.SIGKILL)
        agent.proc.wait(timeout=10)
        for pid, port in before.values():
            assert pid is not None
            assert alive(pid)
            assert port is not None
            assert await engine_health(port) == 200
        controller.beats.clear()
        rig.start()
        await until(
            lambda: (
                controller.beats
                and all((s := controller.shard(r)) and s.state == "ready" for r in ("r1", "r2"))
            ),
            what="re-adopted and ready",
        )
        after = {s.replica_id: (s.pid, s.port) for s in controller.last().shards}
        assert after == before
        # Re-adopted, not duplicated: the agent started nothing new.
        rig.note_pids()
        assert rig.engine_pids == {pid for pid, _ in before.values()}
        # An adopted engine is still watched: its death is reported (status unknown).
        r2_pid = before["r2"][0]
        assert r2_pid is not None
        os.killpg(r2_pid, signal.SIGKILL)
        failed = await until(
            lambda: (s := controller.shard("r2")) and s.state == "failed" and s, what="r2 failed"
        )
        assert (failed.pid, failed.exit_code) == (None, None)
        assert controller.shard("r1") == next(s for s in controller.last().shards if s.rank == 0)

    async def test_engine_died_while_agent_down(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """An engine that died while the agent was down is reported failed, not adopted."""
        controller.desired = (sim_spec("r1"),)
        agent = rig.start()
        st = await until(
            lambda: (s := controller.shard("r1")) and s.state == "ready" and s, what="r1 ready"
        )
        agent.signal(signal.SIGKILL)
        agent.proc.wait(timeout=10)
        os.killpg(st.pid, signal.SIGKILL)
        await until(lambda: not alive(st.pid), what="engine dead")
        controller.beats.clear()
        rig.start()
        failed = await until(
            lambda: (s := controller.shard("r1")) and s.state == "failed" and s, what="failed"
        )
        assert failed.pid is None
        assert "exited while the agent was down" in failed.log_tail[-1]


class TestExit:
    """What the agent's exit does to its engines."""

    async def test_sigterm_leaves_engines(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """SIGTERM ends the agent with 0 and leaves its engines for the next agent."""
        controller.desired = (sim_spec("r1"),)
        agent = rig.start()
        st = await until(
            lambda: (s := controller.shard("r1")) and s.state == "ready" and s, what="r1 ready"
        )
        assert agent.stop(grace_s=10) == 0
        assert st.pid is not None
        assert alive(st.pid)

    async def test_stop_engines_on_exit(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """With --stop-engines-on-exit, SIGTERM stops the engines before the agent exits."""
        controller.desired = (sim_spec("r1"),)
        agent = rig.start("--stop-engines-on-exit")
        st = await until(
            lambda: (s := controller.shard("r1")) and s.state == "ready" and s, what="r1 ready"
        )
        assert agent.stop(grace_s=10) == 0
        assert st.pid is not None
        assert not alive(st.pid)
