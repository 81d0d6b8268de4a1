"""A control loop whose ticks keep failing the same way: said once, then now and then."""

from __future__ import annotations

import logging

import pytest

from llmgw.controller.config import parse_args
from llmgw.controller.fleet.live import Fleet
from llmgw.controller.fleet.records import FleetState
from llmgw.controller.idle import IdleTracker
from llmgw.controller.leaderlink import LeaderLink
from llmgw.controller.store import UnreadableRow
from llmgw.controller.store.memory import MemoryLeadership, MemoryStore
from llmgw.controller.tick.loop import ControlLoop
from llmgw.runtime.clock import ManualClock
from llmgw.runtime.repeats import REPEAT_S


class UnreadableStore(MemoryStore):
    """A store holding a key row this llmgw cannot read while `unreadable` is set."""

    unreadable = True

    def load(self) -> FleetState:
        if self.unreadable:
            raise UnreadableRow("api_keys", "alice", "unknown field `x`", "delete that row")
        return super().load()


def failed_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "tick failed" in r.getMessage()]


class TestRepeatedTickFailure:
    """A standby that cannot read a row of the store says why once, and shows it."""

    async def test_said_once_then_every_few_minutes(self, caplog: pytest.LogCaptureFixture) -> None:
        """The one-line reason is logged at the first failed reload, then again only
        after REPEAT_S with the count of failures since (it was logged at every reload,
        each few tenths of a second); the fleet holds the row until a reload reads it."""
        clock = ManualClock()
        config = parse_args(["--standby-reload-s", "0.3"])
        store = UnreadableStore()
        fleet = Fleet(store, clock=clock, config=config)
        leader = MemoryLeadership("tick-failures")
        assert leader.try_acquire()
        loop = ControlLoop(
            fleet,
            MemoryLeadership("tick-failures"),
            IdleTracker(clock=clock),
            clock=clock,
            config=config,
            link=LeaderLink(store, own_url=None, clock=clock),
        )
        try:
            with caplog.at_level(logging.INFO):
                for _ in range(int(REPEAT_S / 0.5)):
                    await loop.step()
                    clock.advance(0.5)
                (first,) = failed_lines(caplog)
                assert "api_keys row 'alice' cannot be read" in first
                assert fleet.unreadable is not None
                assert (fleet.unreadable.table, fleet.unreadable.row) == ("api_keys", "alice")
                await loop.step()
                assert len(failed_lines(caplog)) == 2
                assert f"ticks_failed={int(REPEAT_S / 0.5)}" in failed_lines(caplog)[1]
                store.unreadable = False
                clock.advance(0.5)
                await loop.step()
            assert fleet.unreadable is None
            assert any("store rows readable again" in r.getMessage() for r in caplog.records)
            assert "Traceback" not in caplog.text
        finally:
            leader.release()
