"""A controller whose store cannot be read back, whose leadership check fails, whose
leader URL cannot be written or read, or whose tick crashes, says so once, then every
few minutes, and once when it clears."""

from __future__ import annotations

import logging

import pytest

from llmgw.controller.config import parse_args
from llmgw.controller.errors import StoreUnavailable
from llmgw.controller.fleet.batch import Batch
from llmgw.controller.fleet.live import Fleet
from llmgw.controller.fleet.records import Changes, Event, FleetState
from llmgw.controller.idle import IdleTracker
from llmgw.controller.leaderlink import LeaderLink
from llmgw.controller.store import StoreError
from llmgw.controller.store.memory import MemoryLeadership, MemoryStore
from llmgw.controller.tick.loop import ControlLoop
from llmgw.runtime.clock import ManualClock
from llmgw.runtime.repeats import REPEAT_S

TICK_S = 0.5


class DownStore(MemoryStore):
    """A store that neither loads nor applies while `down` is set."""

    down = False

    def load(self) -> FleetState:
        if self.down:
            raise StoreError("connection refused")
        return super().load()

    def apply(self, changes: Changes) -> list[Event]:
        if self.down:
            raise StoreError("connection refused")
        return super().apply(changes)


class DownLeadership(MemoryLeadership):
    """A leadership whose database answers nothing while `down` is set."""

    down = False

    def try_acquire(self) -> bool:
        if self.down:
            raise StoreError("connection refused")
        return super().try_acquire()

    def still_leader(self) -> bool:
        if self.down:
            raise StoreError("connection refused")
        return super().still_leader()


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def make_loop(store: MemoryStore, leadership: MemoryLeadership) -> tuple[ControlLoop, ManualClock]:
    clock = ManualClock()
    config = parse_args(["--standby-reload-s", "0.3"])
    fleet = Fleet(store, clock=clock, config=config)
    loop = ControlLoop(
        fleet,
        leadership,
        IdleTracker(clock=clock),
        clock=clock,
        config=config,
        link=LeaderLink(store, own_url=None, clock=clock),
    )
    return loop, clock


async def steps(loop: ControlLoop, clock: ManualClock, n: int) -> None:
    for _ in range(n):
        await loop.step()
        clock.advance(TICK_S)


class TestStoreReloadFailed:
    """A leader that cannot read the store back after an unconfirmed write says so once."""

    async def test_said_once_then_every_few_minutes_then_cleared(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """'store reload failed' was logged at every tick (and heartbeat) of the outage;
        now once, again after REPEAT_S with the count, and the reload that works says
        how many failed."""
        store = DownStore()
        leadership = MemoryLeadership("reload-failed")
        loop, clock = make_loop(store, leadership)
        try:
            await steps(loop, clock, 1)
            assert loop.fleet.leading
            store.down = True
            batch = Batch(loop.fleet.state, clock.wall())
            batch.event("test", "controller", "controller", "unconfirmed", model=None)
            async with loop.fleet.lock:
                with pytest.raises(StoreUnavailable):
                    await loop.fleet.commit(batch.changes)
            n = int(REPEAT_S / TICK_S)
            with caplog.at_level(logging.INFO):
                await steps(loop, clock, n)
                assert len(lines(caplog, "store reload failed")) == 1
                await steps(loop, clock, 1)
                again = lines(caplog, "store reload failed")
                assert len(again) == 2
                assert f"reloads_failed={n}" in again[1]
                store.down = False
                await steps(loop, clock, 3)
            (back,) = lines(caplog, "store reloaded after a write it did not confirm")
            assert f"reloads_failed={n + 1}" in back
            assert len(lines(caplog, "store reload failed")) == 2
        finally:
            leadership.release()


class TestLeadershipCheckFailed:
    """A controller whose leadership check cannot reach the database says so once."""

    async def test_standby_said_once_then_cleared(self, caplog: pytest.LogCaptureFixture) -> None:
        """'leadership check failed' was logged at every tick while the database was
        down; now once, again after REPEAT_S with the count, and one line when a check
        answers again."""
        leader = MemoryLeadership("check-failed")
        assert leader.try_acquire()
        standby = DownLeadership("check-failed")
        standby.down = True
        loop, clock = make_loop(MemoryStore(), standby)
        n = int(REPEAT_S / TICK_S)
        with caplog.at_level(logging.INFO):
            await steps(loop, clock, n)
            assert len(lines(caplog, "leadership check failed")) == 1
            await steps(loop, clock, 1)
            again = lines(caplog, "leadership check failed")
            assert len(again) == 2
            assert f"checks_failed={n}" in again[1]
            standby.down = False
            leader.release()
            await steps(loop, clock, 3)
        assert loop.fleet.leading
        (back,) = lines(caplog, "leadership check answers again")
        assert f"checks_failed={n + 1}" in back
        assert len(lines(caplog, "leadership check failed")) == 2
        standby.release()

    async def test_leader_losing_the_database_said_once(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A leader whose database goes down stands by once, then its failed checks are
        said once, not at every tick."""
        leadership = DownLeadership("leader-down")
        loop, clock = make_loop(MemoryStore(), leadership)
        try:
            await steps(loop, clock, 1)
            assert loop.fleet.leading
            leadership.down = True
            with caplog.at_level(logging.INFO):
                await steps(loop, clock, 20)
            assert not loop.fleet.leading
            assert len(lines(caplog, "leadership lost")) == 1
            assert len(lines(caplog, "leadership check failed")) == 1
        finally:
            leadership.down = False
            leadership.release()


class LeaderUrlStore(MemoryStore):
    """A store that neither records nor reads the leader's URL while `down` is set."""

    down = False

    def set_leader_url(self, url: str | None) -> None:
        if self.down:
            raise StoreError("permission denied for table leader")
        super().set_leader_url(url)

    def leader_url(self) -> str | None:
        if self.down:
            raise StoreError("permission denied for table leader")
        return super().leader_url()


class CrashingLeadership(MemoryLeadership):
    """A leadership whose check raises what no tick expects while `crash` is set."""

    crash = False

    def try_acquire(self) -> bool:
        if self.crash:
            raise RuntimeError("a defect")
        return super().try_acquire()

    def still_leader(self) -> bool:
        if self.crash:
            raise RuntimeError("a defect")
        return super().still_leader()


class TestLeaderUrlNotRecorded:
    """A leader that cannot record its URL says so once, not at every tick."""

    async def test_said_once_then_every_few_minutes_then_cleared(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """'leader url not recorded' was logged at every tick while the store refused it;
        now once, again after REPEAT_S with the count, and once when it is recorded."""
        store = LeaderUrlStore()
        store.down = True
        leadership = MemoryLeadership("url-not-recorded")
        loop, clock = make_loop(store, leadership)
        n = int(REPEAT_S / TICK_S)
        try:
            with caplog.at_level(logging.INFO):
                await steps(loop, clock, n)
                assert loop.fleet.leading
                assert len(lines(caplog, "leader url not recorded")) == 1
                await steps(loop, clock, 1)
                again = lines(caplog, "leader url not recorded")
                assert len(again) == 2
                assert f"tries_failed={n}" in again[1]
                store.down = False
                await steps(loop, clock, 3)
            (back,) = lines(caplog, "leader url recorded")
            assert f"tries_failed={n + 1}" in back
            assert len(lines(caplog, "leader url not recorded")) == 2
        finally:
            leadership.release()


class TestLeaderUrlReadFailed:
    """A standby that cannot read the leader's URL says so once, not at every reload."""

    async def test_said_once_then_every_few_minutes_then_cleared(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """'leader url read failed' was logged at every reload while the store refused
        it; now once, again after REPEAT_S with the count, and once when it reads."""
        leader = MemoryLeadership("url-read-failed")
        assert leader.try_acquire()
        store = LeaderUrlStore()
        store.down = True
        standby = MemoryLeadership("url-read-failed")
        loop, clock = make_loop(store, standby)
        n = int(REPEAT_S / TICK_S)
        try:
            with caplog.at_level(logging.INFO):
                await steps(loop, clock, n)
                assert len(lines(caplog, "leader url read failed")) == 1
                await steps(loop, clock, 1)
                again = lines(caplog, "leader url read failed")
                assert len(again) == 2
                assert f"reads_failed={n}" in again[1]
                store.down = False
                await steps(loop, clock, 3)
            (back,) = lines(caplog, "leader url read again")
            assert f"reads_failed={n + 1}" in back
            assert len(lines(caplog, "leader url read failed")) == 2
            assert not loop.fleet.leading
        finally:
            leader.release()


class TestTickCrashed:
    """A tick that crashes the same way at every tick: the traceback once, then counts."""

    async def test_traceback_once_then_every_few_minutes_then_cleared(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """'tick crashed' with its traceback was logged at every tick; now the first
        carries the traceback, a repeat after REPEAT_S the count without it, and one
        line says when a whole tick runs again."""
        leadership = CrashingLeadership("tick-crashed")
        loop, clock = make_loop(MemoryStore(), leadership)
        n = int(REPEAT_S / TICK_S)
        try:
            await steps(loop, clock, 1)
            assert loop.fleet.leading
            leadership.crash = True
            with caplog.at_level(logging.INFO):
                await steps(loop, clock, n)
                crashed = [r for r in caplog.records if "tick crashed" in r.getMessage()]
                assert len(crashed) == 1
                assert crashed[0].exc_info is not None
                assert "RuntimeError: a defect" in caplog.text
                await steps(loop, clock, 1)
                again = [r for r in caplog.records if "tick crashed" in r.getMessage()]
                assert len(again) == 2
                assert f"ticks_crashed={n}" in again[1].getMessage()
                assert again[1].exc_info is None
                leadership.crash = False
                await steps(loop, clock, 3)
            (back,) = lines(caplog, "ticks run again")
            assert f"ticks_crashed={n + 1}" in back
            assert len(lines(caplog, "tick crashed")) == 2
            assert caplog.text.count("Traceback") == 1
        finally:
            leadership.release()
