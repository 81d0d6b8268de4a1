"""The agent's side of sleeping: driving engines, the warm-up, the vLLM guard, host memory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw.agent.engineprocs import Exit
from llmgw.agent.hostmem import host_memory_mib
from llmgw.agent.ports import PortAllocator
from llmgw.agent.quiet import Load
from llmgw.agent.sleeping import Patience
from llmgw.agent.statefile import StateStore
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.templates import render
from llmgw.agent.vllmguard import GUARD_DIR, GUARD_MIDDLEWARE
from llmgw.agent.vllmguard.llmgw_vllm_guard import Guard
from llmgw.agent.waking import WarmUpRetry
from llmgw.runtime.clock import ManualClock
from llmgw.testing.wait import until
from tests.unit.test_agent_supervisor import FakeProbe, FakeSpawner, spec


class FakeSleepClient:
    """Records every call; `fail` makes the next calls answer an error; `hold`, while
    unset, keeps sleeps and wakes unanswered (an engine stopped or wedged), and
    `hold_asked` the same for /is_sleeping."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.fail: str | None = None
        self.hold: asyncio.Event | None = None
        self.asleep: bool | None = False
        self.asked = 0  # GET /is_sleeping calls
        self.hold_asked: asyncio.Event | None = None
        # What GET /metrics says: (running, waiting); None: it does not say.
        self.load_is: tuple[int, int] | None = (0, 0)
        self.loads = 0  # GET /metrics calls
        # When set, the warm-up's own answer (the wake keeps `fail`'s).
        self.warm_up_fails: str | None = None
        # When set, what /metrics says once a sleep has answered (a request it caught).
        self.sleep_leaves: tuple[int, int] | None = None
        # When set, the wake's own answer (the sleep keeps `fail`'s).
        self.wake_fails: str | None = None

    async def sleep(self, host: str, port: int, api_key: str, level: int) -> str | None:
        self.calls.append(("sleep", str(level), api_key))
        if self.hold is not None:
            await self.hold.wait()
        if self.sleep_leaves is not None and self.fail is None:
            self.load_is, self.sleep_leaves = self.sleep_leaves, None
        return self.fail

    async def wake(self, host: str, port: int, api_key: str) -> str | None:
        self.calls.append(("wake", api_key))
        if self.hold is not None:
            await self.hold.wait()
        return self.wake_fails or self.fail

    async def warm_up(self, host: str, port: int, api_key: str, model: str) -> str | None:
        self.calls.append(("warm_up", model))
        return self.warm_up_fails or self.fail

    async def load(self, host: str, port: int, api_key: str) -> Load | None:
        self.loads += 1
        return Load(*self.load_is) if self.load_is is not None else None

    async def is_sleeping(self, host: str, port: int, api_key: str) -> bool | None:
        self.asked += 1
        if self.hold_asked is not None:
            await self.hold_asked.wait()
        return self.asleep

    async def close(self) -> None:
        pass


@pytest.fixture
def rig(tmp_path: Path) -> dict[str, Any]:
    client = FakeSleepClient()
    probe = FakeProbe()
    spawner = FakeSpawner()
    clock = ManualClock()
    sup = Supervisor(
        log_dir=tmp_path / "logs",
        store=StateStore(tmp_path / "state", node="n1"),
        ports=PortAllocator(21000, 21009, is_free=lambda p: True),
        spawner=spawner,
        probe=probe,
        clock=clock,
        sleep_client=client,
        call_wait_s=0.2,
        patience=Patience(quiet_wait_s=5.0, warm_up=WarmUpRetry(tries=3, first_backoff_s=0.01)),
    )
    return {"sup": sup, "client": client, "probe": probe, "spawner": spawner, "clock": clock}


async def ready(rig: dict[str, Any], **kw: Any) -> Any:
    s = spec(sleep_mode=True, **kw)
    rig["sup"].apply([s])
    rig["probe"].ready_ports.add(21000)
    await rig["sup"].tick()
    assert rig["sup"].statuses()[0].state == "ready"
    return s


class TestDrivingSleep:
    """The agent sleeps and wakes engines as the controller lists them."""

    async def test_sleeps_when_listed_with_a_level(self, rig: dict[str, Any]) -> None:
        """A ready shard listed with sleep_level 2 is put to sleep, with its key, and says so."""
        s = await ready(rig)
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=2)])
        await rig["sup"].tick()
        (st,) = rig["sup"].statuses()
        assert st.state == "sleeping"
        assert rig["client"].calls == [("sleep", "2", st.api_key)]

    async def test_wakes_and_warms_up_before_ready(self, rig: dict[str, Any]) -> None:
        """Listed awake again: woken, then one warm-up request, then reported ready."""
        s = await ready(rig)
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        rig["sup"].apply([s])
        await rig["sup"].tick()
        (st,) = rig["sup"].statuses()
        assert st.state == "ready"
        assert rig["client"].calls[1:] == [("wake", st.api_key), ("warm_up", "m")]

    async def test_a_refused_sleep_keeps_the_state_and_retries(self, rig: dict[str, Any]) -> None:
        """An engine that refuses stays reported as it is, and the call is made again."""
        s = await ready(rig)
        rig["client"].fail = "HTTP 400: Sleep mode is not enabled"
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        assert rig["sup"].statuses()[0].state == "ready"
        rig["client"].fail = None
        await rig["sup"].tick()
        assert rig["sup"].statuses()[0].state == "sleeping"
        assert [c[0] for c in rig["client"].calls] == ["sleep", "sleep"]

    async def test_a_refused_wake_stays_sleeping(self, rig: dict[str, Any]) -> None:
        """A wake the engine refuses: still sleeping, no warm-up, tried again next tick."""
        s = await ready(rig)
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        rig["client"].fail = "HTTP 503"
        rig["sup"].apply([s])
        await rig["sup"].tick()
        await rig["sup"].tick()
        assert rig["sup"].statuses()[0].state == "sleeping"
        assert [c[0] for c in rig["client"].calls] == ["sleep", "wake", "wake"]

    async def test_a_failing_warm_up_is_retried_alone_then_served_cold(
        self, rig: dict[str, Any]
    ) -> None:
        """Woken once; the warm-up tried three times; then ready, the failure in its note."""
        s = await ready(rig)
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        rig["client"].warm_up_fails = "HTTP 500: boom"
        rig["sup"].apply([s])
        await rig["sup"].tick()
        (st,) = rig["sup"].statuses()
        assert st.state == "ready"
        assert st.note == "warm-up failed 3 times, last: HTTP 500: boom"
        woken = [c[0] for c in rig["client"].calls if c[0] in ("wake", "warm_up")]
        assert woken == ["wake", "warm_up", "warm_up", "warm_up"]

    async def test_awake_and_warming_up_is_starting(self, rig: dict[str, Any]) -> None:
        """Between a wake and its warm-up the engine is reported starting: awake on its
        cards, not yet serving."""
        s = await ready(rig)
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        gate = asyncio.Event()
        client = rig["client"]

        async def held_warm_up(host: str, port: int, api_key: str, model: str) -> str | None:
            await gate.wait()
            return None

        client.warm_up = held_warm_up
        rig["sup"].apply([s])
        await rig["sup"].tick()
        assert rig["sup"].statuses()[0].state == "starting"
        await rig["sup"].tick()  # the probe leaves it alone: the call is in flight
        assert rig["sup"].statuses()[0].state == "starting"
        gate.set()
        await until(lambda: rig["sup"].statuses()[0].state == "ready", what="ready")
        assert rig["sup"].statuses()[0].note == ""

    async def test_a_starting_shard_sleeps_once_ready(self, rig: dict[str, Any]) -> None:
        """Nothing is called before the engine is ready."""
        rig["sup"].apply([spec(sleep_mode=True, sleep_level=1)])
        await rig["sup"].tick()
        assert rig["client"].calls == []
        rig["probe"].ready_ports.add(21000)
        await rig["sup"].tick()
        await rig["sup"].tick()
        assert rig["sup"].statuses()[0].state == "sleeping"


class TestAdoptedAsleep:
    """An engine found asleep at the health probe is reported sleeping, then woken."""

    async def test_an_engine_found_asleep_is_reported_sleeping_then_woken(
        self, rig: dict[str, Any]
    ) -> None:
        """Ready to /health but asleep (adopted after a restart): sleeping, then woken."""
        rig["client"].asleep = True
        rig["sup"].apply([spec(sleep_mode=True)])
        rig["probe"].ready_ports.add(21000)
        await rig["sup"].tick()
        assert rig["client"].asked == 1
        assert [c[0] for c in rig["client"].calls] == ["wake", "warm_up"]
        assert rig["sup"].statuses()[0].state == "ready"

    async def test_no_question_without_sleep_mode(self, rig: dict[str, Any]) -> None:
        """An engine of a model that cannot sleep is never asked."""
        rig["sup"].apply([spec()])
        rig["probe"].ready_ports.add(21000)
        await rig["sup"].tick()
        assert rig["client"].asked == 0


class TestUnansweredIsSleeping:
    """An engine that answers /health but never /is_sleeping holds up nothing else."""

    async def test_the_tick_goes_on_without_the_answer(self, rig: dict[str, Any]) -> None:
        """While a's /is_sleeping goes unanswered, ticks return, b becomes ready and its
        exit is reaped, and a is asked once and not reported ready until it answers."""
        sup, client = rig["sup"], rig["client"]
        client.hold_asked = asyncio.Event()
        sup.apply([spec("a", sleep_mode=True), spec("b", gpu_indices=(1,))])
        rig["probe"].ready_ports.update({21000, 21001})
        await asyncio.wait_for(sup.tick(), timeout=5)
        assert [st.state for st in sup.statuses()] == ["starting", "ready"]
        rig["spawner"].spawned[1][2].exit = Exit(1)
        for _ in range(2):
            await asyncio.wait_for(sup.tick(), timeout=5)
        assert [st.state for st in sup.statuses()] == ["starting", "failed"]
        assert client.asked == 1
        client.hold_asked.set()
        await until(lambda: sup.statuses()[0].state == "ready", timeout_s=5)

    async def test_a_stopped_engine_is_not_made_ready_by_a_late_answer(
        self, rig: dict[str, Any]
    ) -> None:
        """An answer that comes after the controller stopped the engine changes nothing."""
        sup, client = rig["sup"], rig["client"]
        client.hold_asked = asyncio.Event()
        sup.apply([spec("a", sleep_mode=True)])
        rig["probe"].ready_ports.add(21000)
        await asyncio.wait_for(sup.tick(), timeout=5)
        sup.apply([])
        client.hold_asked.set()
        await sup.wait_call_finished(timeout_s=5)
        assert [st.state for st in sup.statuses()] == ["starting"]
        await sup.tick()
        assert [st.state for st in sup.statuses()] == ["stopped"]


class TestSwapOnOneCard:
    """Two engines sharing one card never stay awake at the same time."""

    async def test_the_leaving_engine_sleeps_before_the_other_wakes(
        self, rig: dict[str, Any]
    ) -> None:
        """Listed together (a swap), the sleep runs first and the wake after it, same tick."""
        a = spec("a", sleep_mode=True)
        b = spec("b", sleep_mode=True)
        sup, probe = rig["sup"], rig["probe"]
        sup.apply([a, msgspec.structs.replace(b, sleep_level=1)])
        probe.ready_ports.update({21000, 21001})
        await sup.tick()  # both ready, then b falls asleep
        await sup.tick()
        assert [st.state for st in sup.statuses()] == ["ready", "sleeping"]
        rig["client"].calls.clear()
        sup.apply([msgspec.structs.replace(a, sleep_level=1), b])
        await sup.tick()
        assert [c[0] for c in rig["client"].calls] == ["sleep", "wake", "warm_up"]
        assert [st.state for st in sup.statuses()] == ["sleeping", "ready"]

    async def test_no_wake_while_another_engine_is_awake_on_the_card(
        self, rig: dict[str, Any]
    ) -> None:
        """A wake waits while the card's other engine is still awake (it fails to sleep)."""
        a = spec("a", sleep_mode=True)
        b = spec("b", sleep_mode=True)
        sup, probe = rig["sup"], rig["probe"]
        sup.apply([a, msgspec.structs.replace(b, sleep_level=1)])
        probe.ready_ports.update({21000, 21001})
        await sup.tick()
        await sup.tick()
        rig["client"].calls.clear()
        rig["client"].fail = "HTTP 500"
        sup.apply([msgspec.structs.replace(a, sleep_level=1), b])
        await sup.tick()
        assert [c[0] for c in rig["client"].calls] == ["sleep"]
        assert [st.state for st in sup.statuses()] == ["ready", "sleeping"]


class TestHungEngine:
    """An engine that never answers a sleep or wake holds up no other engine on the node."""

    async def test_a_hung_sleep_leaves_the_tick_free(self, rig: dict[str, Any]) -> None:
        """While a's sleep goes unanswered, b still becomes ready; once a answers, it sleeps."""
        a = await ready(rig)
        rig["client"].hold = asyncio.Event()
        b = spec("b", sleep_mode=True, gpu_indices=(1,))
        rig["sup"].apply([msgspec.structs.replace(a, sleep_level=1), b])
        rig["probe"].ready_ports.add(21001)
        await asyncio.wait_for(rig["sup"].tick(), timeout=5)
        assert [st.state for st in rig["sup"].statuses()] == ["ready", "ready"]
        rig["client"].hold.set()
        # b sorts before r1 (a).
        await until(lambda: [st.state for st in rig["sup"].statuses()] == ["ready", "sleeping"])
        assert [c[0] for c in rig["client"].calls] == ["sleep"]

    async def test_one_call_per_engine_at_a_time(self, rig: dict[str, Any]) -> None:
        """A wake still unanswered is not sent again by the next ticks."""
        s = await ready(rig)
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        rig["client"].hold = asyncio.Event()
        rig["sup"].apply([s])
        for _ in range(3):
            await asyncio.wait_for(rig["sup"].tick(), timeout=5)
        assert [c[0] for c in rig["client"].calls] == ["sleep", "wake"]
        assert rig["sup"].statuses()[0].state == "sleeping"
        rig["client"].hold.set()
        await until(lambda: rig["sup"].statuses()[0].state == "ready", timeout_s=5)

    async def test_an_ended_call_ends_the_pause_between_ticks(self, rig: dict[str, Any]) -> None:
        """The supervise loop's pause ends when a call ends, not after the whole interval."""
        s = await ready(rig)
        rig["client"].hold = asyncio.Event()
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        await rig["sup"].wait_call_finished(timeout_s=0.01)  # nothing ended yet
        asyncio.get_running_loop().call_later(0.05, rig["client"].hold.set)
        await asyncio.wait_for(rig["sup"].wait_call_finished(timeout_s=60), timeout=5)
        assert rig["sup"].statuses()[0].state == "sleeping"

    async def test_close_ends_the_calls_in_flight(self, rig: dict[str, Any]) -> None:
        """Closing the supervisor cancels a call the engine never answers."""
        s = await ready(rig)
        rig["client"].hold = asyncio.Event()
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await asyncio.wait_for(rig["sup"].tick(), timeout=5)
        await asyncio.wait_for(rig["sup"].close(), timeout=5)
        assert rig["sup"].statuses()[0].state == "ready"


class TestTemplates:
    """Engine command lines with and without sleep mode."""

    def test_vllm_gets_sleep_mode_dev_routes_and_the_guard(self) -> None:
        """vLLM: --enable-sleep-mode, the guard middleware, dev mode and the guard's folder."""
        plan = render(spec(engine="vllm", sleep_mode=True), port=1, host="h", api_key="k")
        argv = list(plan.argv)
        assert "--enable-sleep-mode" in argv
        assert argv[argv.index("--middleware") + 1] == GUARD_MIDDLEWARE
        assert plan.env["VLLM_SERVER_DEV_MODE"] == "1"
        assert plan.env["PYTHONPATH"].split(":")[0] == str(GUARD_DIR)

    def test_sim_gets_sleep_mode_without_the_guard(self) -> None:
        """The sim-engine guards its own routes: no middleware flag."""
        plan = render(spec(engine="sim", sleep_mode=True), port=1, host="h")
        assert "--enable-sleep-mode" in plan.argv
        assert "--middleware" not in plan.argv
        assert plan.env["VLLM_SERVER_DEV_MODE"] == "1"

    def test_no_sleep_mode_no_flags(self) -> None:
        """Without sleep_mode nothing changes."""
        plan = render(spec(engine="vllm"), port=1, host="h")
        assert "--enable-sleep-mode" not in plan.argv
        assert "VLLM_SERVER_DEV_MODE" not in plan.env

    @pytest.mark.parametrize("value", ["1", " 2", "true"])
    def test_dev_mode_from_the_spec_gets_the_guard(self, value: str) -> None:
        """A spec's own VLLM_SERVER_DEV_MODE (vLLM reads any non-zero integer) opens the
        dev routes without sleep mode: the guard is loaded all the same."""
        env = {"VLLM_SERVER_DEV_MODE": value, "PYTHONPATH": "/mine"}
        plan = render(spec(engine="vllm", env=env), port=1, host="h", api_key="k")
        argv = list(plan.argv)
        assert argv[argv.index("--middleware") + 1] == GUARD_MIDDLEWARE
        assert plan.env["PYTHONPATH"] == f"{GUARD_DIR}:/mine"
        assert "--enable-sleep-mode" not in argv

    @pytest.mark.parametrize("value", ["0", "", " 00 "])
    def test_dev_mode_off_needs_no_guard(self, value: str) -> None:
        """A dev-mode variable vLLM reads as off adds nothing."""
        plan = render(spec(engine="vllm", env={"VLLM_SERVER_DEV_MODE": value}), port=1, host="h")
        assert "--middleware" not in plan.argv


async def call(guard: Guard, path: str, auth: bytes | None = None) -> int:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    async def send(msg: Any) -> None:
        sent.append(msg)

    headers = [(b"authorization", auth)] if auth is not None else []
    await guard({"type": "http", "method": "POST", "path": path, "headers": headers}, receive, send)
    return int(sent[0]["status"])


class TestGuard:
    """The vLLM guard keeps sleep routes behind the key and probes open."""

    async def test_sleep_routes_need_the_key(self) -> None:
        """/sleep without the key is 401; with it, it reaches vLLM."""

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})

        g = Guard(app, env={"VLLM_API_KEY": "sk-1"})
        assert await call(g, "/sleep") == 401
        assert await call(g, "/wake_up", b"Bearer wrong") == 401
        assert await call(g, "/sleep", b"bearer sk-1") == 200

    async def test_probes_stay_open(self) -> None:
        """/health and /metrics answer without the key, as vLLM leaves them."""

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})

        g = Guard(app, env={"VLLM_API_KEY": "sk-1"})
        assert await call(g, "/health") == 200
        assert await call(g, "/metrics") == 200


class TestHostMemory:
    """Host memory read from /proc/meminfo."""

    def test_meminfo_total_in_mib(self, tmp_path: Path) -> None:
        """MemTotal in kB becomes MiB; a configured figure wins; unreadable is None."""
        f = tmp_path / "meminfo"
        f.write_text("MemTotal:       2097152 kB\nMemFree: 1 kB\n")
        assert host_memory_mib(None, meminfo=f) == 2048
        assert host_memory_mib(512, meminfo=f) == 512
        assert host_memory_mib(None, meminfo=tmp_path / "absent") is None


class TestQuietBeforeSleep:
    """A sleep waits, for a while, until its engine has no request running or waiting."""

    async def test_postponed_while_requests_are_there(self, rig: dict[str, Any]) -> None:
        """Two requests running: no /sleep, the shard stays ready and says why; once the
        engine is idle, it sleeps."""
        s = await ready(rig)
        rig["client"].load_is = (2, 0)
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        (st,) = rig["sup"].statuses()
        assert (st.state, st.note) == ("ready", "sleep postponed: 2 requests running, 0 waiting")
        assert rig["client"].calls == []
        rig["client"].load_is = (0, 0)
        await rig["sup"].tick()
        (st,) = rig["sup"].statuses()
        assert (st.state, st.note) == ("sleeping", "")

    async def test_sleeps_anyway_after_the_wait(self, rig: dict[str, Any]) -> None:
        """Requests still arriving past the quiet wait: the engine sleeps all the same."""
        s = await ready(rig)
        rig["client"].load_is = (0, 1)
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        assert rig["sup"].statuses()[0].state == "ready"
        rig["clock"].advance(5.0)
        await rig["sup"].tick()
        assert rig["sup"].statuses()[0].state == "sleeping"

    async def test_an_engine_that_does_not_say_sleeps(self, rig: dict[str, Any]) -> None:
        """No readable /metrics: the sleep goes ahead, as before the question."""
        s = await ready(rig)
        rig["client"].load_is = None
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        assert rig["sup"].statuses()[0].state == "sleeping"
        assert rig["client"].loads == 2  # before the sleep, and after it

    async def test_a_forced_sleep_is_not_undone(self, rig: dict[str, Any]) -> None:
        """Sleeping past the quiet wait with a request waiting: no wake follows."""
        s = await ready(rig)
        rig["client"].load_is = (0, 1)
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        rig["clock"].advance(5.0)
        await rig["sup"].tick()
        assert rig["sup"].statuses()[0].state == "sleeping"
        assert [c[0] for c in rig["client"].calls] == ["sleep"]


class TestRequestCaughtBySleep:
    """A request that arrives as the engine falls asleep undoes the sleep."""

    async def test_woken_at_once_then_slept_once_it_is_served(self, rig: dict[str, Any]) -> None:
        """Idle before the sleep, one waiting after: woken and warmed up in the same call,
        still ready with the reason; postponed while it runs, asleep once it is done."""
        s = await ready(rig)
        rig["client"].sleep_leaves = (0, 1)
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        (st,) = rig["sup"].statuses()
        why = "sleep undone, requests arrived as it fell asleep: 0 requests running, 1 waiting"
        assert (st.state, st.note) == ("ready", why)
        assert [c[0] for c in rig["client"].calls] == ["sleep", "wake", "warm_up"]
        rig["client"].load_is = (1, 0)
        await rig["sup"].tick()
        (st,) = rig["sup"].statuses()
        assert (st.state, st.note) == ("ready", "sleep postponed: 1 requests running, 0 waiting")
        rig["client"].load_is = (0, 0)
        await rig["sup"].tick()
        (st,) = rig["sup"].statuses()
        assert (st.state, st.note) == ("sleeping", "")
        assert [c[0] for c in rig["client"].calls] == ["sleep", "wake", "warm_up", "sleep"]

    async def test_a_failed_wake_leaves_it_asleep_and_says_so(self, rig: dict[str, Any]) -> None:
        """The wake after the sleep refused: reported sleeping (its cards free), with why."""
        s = await ready(rig)
        rig["client"].sleep_leaves = (0, 2)
        rig["client"].wake_fails = "HTTP 500: boom"
        rig["sup"].apply([msgspec.structs.replace(s, sleep_level=1)])
        await rig["sup"].tick()
        (st,) = rig["sup"].statuses()
        assert st.state == "sleeping"
        assert st.note == "asleep with 0 requests running, 2 waiting: the wake to serve them failed"
