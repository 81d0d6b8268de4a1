"""The supervisor's decisions with fake processes: start, ready, exit, stop, adopt, persist."""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.engineprocs import KILL, TERM, Exit, PopenSpawner, SpawnError, read_stat
from llmgw.agent.ports import PortAllocator
from llmgw.agent.statefile import ShardRecord, StateStore
from llmgw.agent.supervisor import Supervisor
from llmgw.runtime.clock import ManualClock
from llmgw.wire.agent import ShardSpec


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start_ticks: int | None = 1000 + pid
        self.exit: Exit | None = None
        self.signals: list[int] = []
        # Exit on SIGTERM unless told to be stubborn.
        self.stubborn = False

    def poll(self) -> Exit | None:
        return self.exit

    def signal_group(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == KILL or (sig == TERM and not self.stubborn):
            self.exit = self.exit or Exit(-sig)


class FakeSpawner:
    def __init__(self) -> None:
        self.spawned: list[tuple[tuple[str, ...], dict[str, str], FakeProc]] = []
        self.alive: dict[int, FakeProc] = {}
        self.fail_with: str | None = None
        self._pid = 100

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> FakeProc:
        if self.fail_with:
            raise SpawnError(self.fail_with)
        self._pid += 1
        proc = FakeProc(self._pid)
        self.spawned.append((tuple(argv), dict(env), proc))
        return proc

    def attach(self, pid: int, start_ticks: int | None) -> FakeProc | None:
        proc = self.alive.get(pid)
        return proc if proc is not None and proc.start_ticks == start_ticks else None


class FakeProbe:
    def __init__(self) -> None:
        self.ready_ports: set[int] = set()

    async def check(self, host: str, port: int, path: str) -> bool:
        return port in self.ready_ports

    async def close(self) -> None:
        pass


def spec(rid: str = "r1", rank: int = 0, **kw: Any) -> ShardSpec:
    return ShardSpec(
        replica_id=rid,
        rank=rank,
        model="m",
        served_names=("m",),
        engine=kw.pop("engine", "sim"),
        gpu_indices=kw.pop("gpu_indices", (0,)),
        **kw,
    )


@pytest.fixture
def parts(tmp_path: Path) -> dict[str, Any]:
    clock = ManualClock()
    spawner = FakeSpawner()
    probe = FakeProbe()
    store = StateStore(tmp_path / "state", node="n1")
    sup = Supervisor(
        log_dir=tmp_path / "logs",
        store=store,
        ports=PortAllocator(21000, 21009, is_free=lambda p: True),
        spawner=spawner,
        probe=probe,
        stop_grace_s=5.0,
        clock=clock,
    )
    return {"sup": sup, "spawner": spawner, "probe": probe, "clock": clock, "store": store}


class TestStart:
    """The supervisor starts listed shards once and reports them ready."""

    async def test_start_then_ready(self, parts: dict[str, Any]) -> None:
        """A desired shard starts on a port from the range and is ready once /health answers."""
        sup, probe = parts["sup"], parts["probe"]
        sup.apply([spec()])
        (st,) = sup.statuses()
        assert (st.state, st.port, st.pid) == ("starting", 21000, 101)
        await sup.tick()
        assert sup.statuses()[0].state == "starting"
        probe.ready_ports.add(21000)
        await sup.tick()
        assert sup.statuses()[0].state == "ready"

    async def test_env_has_the_gpus(self, parts: dict[str, Any]) -> None:
        """The engine sees only its own GPUs."""
        parts["sup"].apply([spec(gpu_indices=(4, 5))])
        _, env, _ = parts["spawner"].spawned[0]
        assert env["CUDA_VISIBLE_DEVICES"] == "4,5"

    async def test_repeated_apply_starts_once(self, parts: dict[str, Any]) -> None:
        """The same desired set applied again starts nothing new."""
        sup = parts["sup"]
        sup.apply([spec()])
        sup.apply([spec()])
        await sup.tick()
        sup.apply([spec()])
        assert len(parts["spawner"].spawned) == 1

    async def test_ports_are_distinct(self, parts: dict[str, Any]) -> None:
        """Two shards never share a port."""
        sup = parts["sup"]
        sup.apply([spec("a"), spec("b")])
        assert sorted(s.port for s in sup.statuses()) == [21000, 21001]

    async def test_spawn_failure_is_reported(self, parts: dict[str, Any]) -> None:
        """An engine that cannot start is failed with the reason in its log tail."""
        parts["spawner"].fail_with = "could not start 'vllm': No such file"
        parts["sup"].apply([spec()])
        (st,) = parts["sup"].statuses()
        assert st.state == "failed"
        assert st.log_tail == ("llmgw agent: could not start 'vllm': No such file",)

    async def test_headless_rank_is_ready_while_alive(self, parts: dict[str, Any]) -> None:
        """A vLLM headless rank has no /health; alive means ready."""
        s = spec(engine="vllm", rank=1, world_size=2, master_addr="h", master_port=1)
        parts["sup"].apply([s])
        await parts["sup"].tick()
        assert parts["sup"].statuses()[0].state == "ready"


def wide(rid: str, rank: int, master_port: int) -> ShardSpec:
    """One shard of a two-node replica whose rank 0 listens on `master_port`."""
    return spec(rid, rank, world_size=2, master_addr="10.0.0.1", master_port=master_port)


class TestRendezvousPorts:
    """Engine ports and rendezvous ports never collide on one node."""

    async def test_engine_ports_skip_a_running_shard_s_rendezvous_port(
        self, parts: dict[str, Any]
    ) -> None:
        """A shard started later never gets the rendezvous port of one already running."""
        sup = parts["sup"]
        sup.apply([wide("w", 0, 21001)])
        sup.apply([wide("w", 0, 21001), spec("a"), spec("b")])
        ports = {st.replica_id: st.port for st in sup.statuses()}
        assert ports == {"w": 21000, "a": 21002, "b": 21003}

    async def test_engine_ports_skip_rendezvous_ports_listed_in_the_same_apply(
        self, parts: dict[str, Any]
    ) -> None:
        """The first shard of a list does not take the port a later one's rank 0 listens on."""
        sup = parts["sup"]
        sup.apply([spec("a"), wide("z", 1, 21000)])
        ports = {st.replica_id: st.port for st in sup.statuses()}
        assert ports == {"a": 21001, "z": 21002}

    async def test_rank0_refuses_a_rendezvous_port_an_engine_here_holds(
        self, parts: dict[str, Any]
    ) -> None:
        """A rendezvous port already an engine's fails rank 0 with the reason, starting nothing."""
        sup = parts["sup"]
        sup.apply([spec("a")])
        sup.apply([spec("a"), wide("w", 0, 21000)])
        st = next(st for st in sup.statuses() if st.replica_id == "w")
        assert (st.state, st.port) == ("failed", None)
        assert st.log_tail == (
            "llmgw agent: rendezvous port 21000 is taken: engine port of a rank 0 on this node",
        )
        assert len(parts["spawner"].spawned) == 1

    async def test_rank0_refuses_a_rendezvous_port_another_process_holds(
        self, tmp_path: Path
    ) -> None:
        """A rendezvous port some other program listens on fails rank 0 up front."""
        sup = Supervisor(
            log_dir=tmp_path / "logs",
            store=StateStore(tmp_path / "state", node="n1"),
            ports=PortAllocator(21000, 21009, is_free=lambda p: p != 29500),
            spawner=FakeSpawner(),
            probe=FakeProbe(),
        )
        sup.apply([wide("w", 0, 29500), wide("v", 1, 29500)])
        states = {st.replica_id: st.state for st in sup.statuses()}
        assert states == {"w": "failed", "v": "starting"}  # only rank 0 listens there


class TestExitAndStop:
    """Crashed, unlisted and stubborn engines are reported, stopped or killed."""

    async def test_crash_reports_exit_code_and_log(self, parts: dict[str, Any]) -> None:
        """An engine that exits on its own is failed with its exit code and log tail."""
        sup, spawner = parts["sup"], parts["spawner"]
        sup.apply([spec()])
        log_path = sup.log_paths()[("r1", 0)]
        log_path.parent.mkdir(parents=True)
        log_path.write_text("loading\nCUDA error: out of memory\n")
        spawner.spawned[0][2].exit = Exit(3)
        await sup.tick()
        (st,) = sup.statuses()
        assert (st.state, st.exit_code, st.pid) == ("failed", 3, None)
        assert st.log_tail[-1] == "CUDA error: out of memory"

    async def test_failed_shard_is_not_restarted(self, parts: dict[str, Any]) -> None:
        """A failed shard stays failed while listed: restarts are the controller's call."""
        sup, spawner = parts["sup"], parts["spawner"]
        sup.apply([spec()])
        spawner.spawned[0][2].exit = Exit(1)
        await sup.tick()
        sup.apply([spec()])
        await sup.tick()
        assert len(spawner.spawned) == 1
        assert sup.statuses()[0].state == "failed"

    async def test_unlisted_shard_is_stopped_then_dropped(self, parts: dict[str, Any]) -> None:
        """An unlisted shard gets SIGTERM, is reported stopped, then forgotten."""
        sup, spawner = parts["sup"], parts["spawner"]
        sup.apply([spec()])
        proc = spawner.spawned[0][2]
        sup.apply([])
        assert proc.signals == [TERM]
        await sup.tick()
        assert sup.statuses()[0].state == "stopped"
        sup.apply([])
        assert sup.statuses() == ()

    async def test_stubborn_engine_is_killed_after_grace(self, parts: dict[str, Any]) -> None:
        """An engine that ignores SIGTERM gets SIGKILL once the grace has passed, not before."""
        sup, spawner, clock = parts["sup"], parts["spawner"], parts["clock"]
        sup.apply([spec()])
        proc = spawner.spawned[0][2]
        proc.stubborn = True
        sup.apply([])
        clock.advance(4.0)
        await sup.tick()
        assert proc.signals == [TERM]
        clock.advance(1.5)
        await sup.tick()
        assert KILL in proc.signals
        await sup.tick()
        assert sup.statuses()[0].state == "stopped"

    async def test_logs_of_dropped_shards_are_kept_newest_first(self, tmp_path: Path) -> None:
        """A shard's log (rotated copies too) outlives it, but only the newest
        `ended_logs_keep` of dropped shards stay: each restart is a new replica id, so a
        crash loop used to leave a log file behind at every try, for good."""
        spawner = FakeSpawner()
        sup = Supervisor(
            log_dir=tmp_path / "logs",
            store=StateStore(tmp_path / "state", node="n1"),
            ports=PortAllocator(21000, 21009, is_free=lambda p: True),
            spawner=spawner,
            probe=FakeProbe(),
            clock=ManualClock(),
            ended_logs_keep=2,
        )
        (tmp_path / "logs").mkdir()
        (tmp_path / "logs" / "agent-notes.txt").write_text("not an engine log\n")
        sup.apply([spec("live")])
        for i in range(4):
            sup.apply([spec("live"), spec(f"try{i}")])
            path = sup.log_paths()[(f"try{i}", 0)]
            path.write_text("crashed\n")
            path.with_name(path.name + ".1").write_text("older\n")
            spawner.spawned[-1][2].exit = Exit(1)
            await sup.tick()
            sup.apply([spec("live")])  # the controller lists the failed shard no more
        sup.log_paths()[("live", 0)].write_text("serving\n")
        await sup.tick()
        assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
            "agent-notes.txt",
            "live-rank0.log",
            "try2-rank0.log",
            "try2-rank0.log.1",
            "try3-rank0.log",
            "try3-rank0.log.1",
        ]

    async def test_stop_all(self, parts: dict[str, Any]) -> None:
        """stop_all ends every engine."""
        sup = parts["sup"]
        sup.apply([spec("a"), spec("b")])
        await sup.stop_all(poll_s=0)
        assert {s.state for s in sup.statuses()} == {"stopped"}


class TestAdoption:
    """A restarted agent adopts its running engines from the state file, and only those."""

    async def test_state_file_round_trip(self, parts: dict[str, Any], tmp_path: Path) -> None:
        """A started engine is in the state file with pid, start time and port."""
        parts["sup"].apply([spec()])
        (rec,) = StateStore(tmp_path / "state", node="n1").load()
        assert (rec.replica_id, rec.pid, rec.start_ticks, rec.port) == ("r1", 101, 1101, 21000)

    async def test_running_engine_is_adopted_not_restarted(
        self, parts: dict[str, Any], tmp_path: Path
    ) -> None:
        """A new supervisor keeps a still-running engine and starts nothing for it."""
        parts["sup"].apply([spec()])
        old_proc = parts["spawner"].spawned[0][2]
        sup2, spawner2, probe2 = self._second(parts, tmp_path)
        spawner2.alive[old_proc.pid] = old_proc
        sup2.adopt(StateStore(tmp_path / "state", node="n1").load())
        sup2.apply([spec()])
        assert spawner2.spawned == []
        probe2.ready_ports.add(21000)
        await sup2.tick()
        (st,) = sup2.statuses()
        assert (st.state, st.pid, st.port) == ("ready", old_proc.pid, 21000)

    async def test_priority_scheduling_is_reported_and_kept(
        self, parts: dict[str, Any], tmp_path: Path
    ) -> None:
        """A sim shard started with priority scheduling says so, in the state file too, so
        the agent that adopts it says so again; a llama.cpp shard does not."""
        parts["sup"].apply([spec(), spec("l", engine="llamacpp")])
        got = {st.replica_id: st.priority_scheduling for st in parts["sup"].statuses()}
        assert got == {"r1": True, "l": False}
        old_proc = parts["spawner"].spawned[0][2]
        sup2, spawner2, _ = self._second(parts, tmp_path)
        spawner2.alive[old_proc.pid] = old_proc
        sup2.adopt(StateStore(tmp_path / "state", node="n1").load())
        assert [st.priority_scheduling for st in sup2.statuses() if st.replica_id == "r1"] == [True]

    async def test_reused_pid_is_not_adopted(self, parts: dict[str, Any], tmp_path: Path) -> None:
        """A pid now owned by another process (other start time) is reported failed."""
        parts["sup"].apply([spec()])
        old_proc = parts["spawner"].spawned[0][2]
        impostor = type(old_proc)(old_proc.pid)
        impostor.start_ticks = 999_999
        sup2, spawner2, _ = self._second(parts, tmp_path)
        spawner2.alive[old_proc.pid] = impostor
        sup2.adopt(StateStore(tmp_path / "state", node="n1").load())
        (st,) = sup2.statuses()
        assert st.state == "failed"
        assert "exited while the agent was down" in st.log_tail[-1]
        assert impostor.signals == []

    def _second(self, parts: dict[str, Any], tmp_path: Path) -> tuple[Any, Any, Any]:
        spawner, probe = FakeSpawner(), FakeProbe()
        sup = Supervisor(
            log_dir=tmp_path / "logs",
            store=StateStore(tmp_path / "state", node="n1"),
            ports=PortAllocator(21000, 21009, is_free=lambda p: True),
            spawner=spawner,
            probe=probe,
            clock=parts["clock"],
        )
        return sup, spawner, probe

    def test_state_of_another_node_is_ignored(self, tmp_path: Path) -> None:
        """A state file written for another node adopts nothing."""
        rec = ShardRecord(
            replica_id="r", rank=0, pid=1, start_ticks=1, port=1, spec=spec(), log_path="x",
            started_at=0.0,
        )  # fmt: skip
        StateStore(tmp_path, node="other").save((rec,))
        assert StateStore(tmp_path, node="n1").load() == ()

    def test_corrupt_state_adopts_nothing(self, tmp_path: Path) -> None:
        """A corrupt state file is an empty set, never a crash."""
        (tmp_path / "agent-state.json").write_text("{not json")
        assert StateStore(tmp_path, node="n1").load() == ()


class TestLogsLeftAtRestart:
    """A restarted agent bounds the logs earlier agents left of dropped shards."""

    async def test_leftovers_past_the_bound_are_removed_oldest_first(
        self, parts: dict[str, Any], tmp_path: Path
    ) -> None:
        """Of the engine logs in the folder no adopted shard owns, only the newest
        `ended_logs_keep` stay, each with every rotated copy; an adopted engine's log
        (even the oldest file) and a file not named like an engine log are never touched,
        and the bound goes on counting them as later shards drop."""
        parts["sup"].apply([spec("live")])
        old_proc = parts["spawner"].spawned[0][2]
        logs = tmp_path / "logs"
        logs.mkdir(exist_ok=True)
        names = ["live-rank0.log", "live-rank0.log.1", "notes.txt", "x-rank0.log.bak"]
        for i in range(4):
            names += [f"try{i}-rank0.log", f"try{i}-rank0.log.1", f"try{i}-rank0.log.7"]
        for age, name in enumerate(reversed(names)):
            (logs / name).write_text("line\n")
            os.utime(logs / name, (1_000_000 - age, 1_000_000 - age))
        os.utime(logs / "live-rank0.log", (1, 1))
        spawner = FakeSpawner()
        spawner.alive[old_proc.pid] = old_proc
        sup = Supervisor(
            log_dir=logs,
            store=StateStore(tmp_path / "state", node="n1"),
            ports=PortAllocator(21000, 21009, is_free=lambda p: True),
            spawner=spawner,
            probe=FakeProbe(),
            clock=parts["clock"],
            ended_logs_keep=2,
        )
        sup.adopt(StateStore(tmp_path / "state", node="n1").load())
        sup.apply([spec("live")])
        await sup.tick()
        kept = ["live-rank0.log", "live-rank0.log.1", "notes.txt", "x-rank0.log.bak"]
        tries = [f"try{i}-rank0.log{end}" for i in (2, 3) for end in ("", ".1", ".7")]
        assert sorted([*kept, *tries]) == sorted(p.name for p in logs.iterdir())
        sup.apply([spec("live"), spec("new")])
        sup.log_paths()[("new", 0)].write_text("crashed\n")
        spawner.spawned[-1][2].exit = Exit(1)
        await sup.tick()
        sup.apply([spec("live")])
        await sup.tick()
        tries = [f"try3-rank0.log{end}" for end in ("", ".1", ".7")]
        assert sorted([*kept, *tries, "new-rank0.log"]) == sorted(p.name for p in logs.iterdir())


class FullStore(StateStore):
    """A state store on a disk that is full while `full` is set."""

    full = True

    def save(self, records: tuple[ShardRecord, ...]) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().save(records)


class TestStateFileUnwritable:
    """A state file that cannot be written fails the start it would record, never the agent."""

    async def test_unrecorded_engine_is_stopped_and_failed(self, tmp_path: Path) -> None:
        """An engine the state file cannot record is killed and its shard failed with the
        reason; apply and tick go on, and once the disk has room a new start is recorded."""
        spawner, store = FakeSpawner(), FullStore(tmp_path / "state", node="n1")
        sup = Supervisor(
            log_dir=tmp_path / "logs",
            store=store,
            ports=PortAllocator(21000, 21009, is_free=lambda p: True),
            spawner=spawner,
            probe=FakeProbe(),
            clock=ManualClock(),
        )
        sup.apply([spec()])
        proc = spawner.spawned[0][2]
        assert proc.signals == [KILL]
        await sup.tick()
        (st,) = sup.statuses()
        assert (st.state, st.pid) == ("failed", None)
        assert "No space left on device" in st.log_tail[-1]
        assert str(store.path) in st.log_tail[-1]
        store.full = False
        sup.apply([spec(), spec("r2")])
        assert [r.replica_id for r in StateStore(tmp_path / "state", node="n1").load()] == ["r2"]


class TestProcStat:
    """Reading a process's start time to tell a reused pid apart."""

    def test_own_process(self) -> None:
        """Our own /proc entry reads as a live state letter and a start time."""
        stat = read_stat(os.getpid())
        assert stat is not None
        assert stat[0] in "RS"
        assert stat[1] > 0

    def test_missing_pid(self) -> None:
        """A pid that does not exist reads as None."""
        assert read_stat(2**22 + 12345) is None

    def test_attach_checks_start_time(self) -> None:
        """Attaching needs the same start time: a reused pid is not ours."""
        stat = read_stat(os.getpid())
        assert stat is not None
        spawner = PopenSpawner()
        assert spawner.attach(os.getpid(), stat[1] + 1) is None
        assert spawner.attach(os.getpid(), None) is None
        proc = spawner.attach(os.getpid(), stat[1])
        assert proc is not None
        assert proc.poll() is None


class TestSpecPolicy:
    """The node's spec policy is applied before an engine starts."""

    @pytest.mark.parametrize(
        ("kw", "what"),
        [
            ({"env": {"PYTHONPATH": "/tmp/evil"}}, "spec env PYTHONPATH"),
            ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "spec env LD_PRELOAD"),
            ({"env": {"LD_LIBRARY_PATH": "/tmp"}}, "spec env LD_LIBRARY_PATH"),
            ({"env": {"VLLM_API_KEY": "mine"}}, "spec env VLLM_API_KEY"),
            ({"args": ("--speed", "1", "--trust-remote-code")}, "args[2] --trust-remote-code"),
            ({"args": ("--host=0.0.0.0",)}, "args[0] --host"),
            ({"args": ("--api-key", "k")}, "args[0] --api-key"),
        ],
    )
    async def test_refused_before_start(
        self, parts: dict[str, Any], kw: dict[str, Any], what: str
    ) -> None:
        """A spec the node's policy refuses fails at once with the reason; nothing starts."""
        parts["sup"].apply([spec(**kw)])
        (st,) = parts["sup"].statuses()
        assert st.state == "failed"
        assert what in st.log_tail[0]
        assert "not allowed on this node" in st.log_tail[0]
        assert parts["spawner"].spawned == []

    async def test_allowed_by_name(self, tmp_path: Path) -> None:
        """allow_env / allow_flags lift exactly the named ones."""
        from llmgw.agent.policy import policy_of

        spawner = FakeSpawner()
        sup = Supervisor(
            log_dir=tmp_path / "logs",
            store=StateStore(tmp_path / "state", node="n1"),
            ports=PortAllocator(21000, 21009, is_free=lambda p: True),
            spawner=spawner,
            probe=FakeProbe(),
            policy=policy_of({"PYTHONPATH"}, {"--trust-remote-code"}),
        )
        sup.apply(
            [spec(env={"PYTHONPATH": "/opt/x", "HF_HOME": "/d"}, args=("--trust-remote-code",))]
        )
        assert sup.statuses()[0].state == "starting"
        assert len(spawner.spawned) == 1
        sup.apply([spec("r2", env={"LD_PRELOAD": "x"})])
        assert {s.replica_id: s.state for s in sup.statuses()}["r2"] == "failed"

    async def test_plain_env_is_fine(self, parts: dict[str, Any]) -> None:
        """An ordinary environment passes the policy and the shard starts."""
        parts["sup"].apply([spec(env={"HF_HOME": "/data", "VLLM_LOGGING_LEVEL": "INFO"})])
        assert parts["sup"].statuses()[0].state == "starting"
