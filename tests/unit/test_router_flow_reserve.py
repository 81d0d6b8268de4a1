"""Flow control's critical reserve: room kept for the critical band while it needs it."""

from __future__ import annotations

import asyncio

from llmgw.router.request.flowgate import RESERVE_FOR_S, FlowGate
from llmgw.runtime.clock import ManualClock
from llmgw.testing import vtime
from tests.unit.test_router_flow import limits
from tests.unit.test_router_scheduler import snap

# One replica of capacity 8: room for one more request, for two, and none.
ONE = [snap("e1", running=7, capacity=8)]
TWO = [snap("e1", running=6, capacity=8)]
FULL = [snap("e1", running=8, waiting=1, capacity=8)]


class TestReserveKept:
    """A critical request meeting no room beyond the reserve makes the gate keep it."""

    def test_no_critical_demand_keeps_no_reserve(self) -> None:
        """Without a critical request at saturation a standard one takes the last slot,
        and the proxy's one comparison stays at the hold point."""
        gate = FlowGate(limits())
        assert gate.saturated(0.875, ONE, model="m", band="standard") is False
        assert gate.reserving("m") is False
        assert gate.saturated_load == 1.0

    def test_critical_at_the_reserve_holds_standard_and_batch_there(self) -> None:
        """Once a critical request found room for one only, a standard or batch request
        with that one slot is held and the proxy asks about every request; the
        critical band itself is not held while a slot is free, and other models keep
        no reserve."""
        clock = ManualClock()
        gate = FlowGate(limits(), clock=clock)
        assert gate.must_wait(0.875, ONE, model="m", band="critical") is False
        assert gate.reserving("m") is True
        assert gate.saturated_load == 0.0
        assert gate.saturated(0.875, ONE, model="m", band="standard") is True
        assert gate.saturated(0.875, ONE, model="m", band="batch") is True
        assert gate.saturated(0.75, TWO, model="m", band="standard") is False
        assert gate.must_wait(0.875, ONE, model="m", band="critical") is False
        assert gate.saturated(0.875, ONE, model="other", band="standard") is False

    def test_critical_behind_a_queue_keeps_the_reserve(self) -> None:
        """With a backlog queued the critical request waits its turn (first in line),
        and its arrival is what keeps the reserve."""
        clock = ManualClock()
        gate = FlowGate(limits(), clock=clock)

        async def main() -> None:
            waiter = asyncio.create_task(
                gate.wait_turn("m", "standard", "a", deadline=1e9, snapshots=lambda: FULL)
            )
            await asyncio.sleep(0.01)
            assert gate.must_wait(0.875, ONE, model="m", band="critical") is True
            assert gate.reserving("m") is True
            waiter.cancel()

        vtime.run(main(), clock)

    def test_critical_with_room_to_spare_starts_no_reserve(self) -> None:
        """A critical request that finds room beyond the reserve needed none."""
        gate = FlowGate(limits())
        assert gate.must_wait(0.75, TWO, model="m", band="critical") is False
        assert gate.reserving("m") is False

    def test_the_reserve_lapses_without_critical_demand(self) -> None:
        """RESERVE_FOR_S after the last critical request that needed it, the reserve
        is given back and the proxy's comparison is the hold point again."""
        clock = ManualClock()
        gate = FlowGate(limits(), clock=clock)
        gate.must_wait(1.0, FULL, model="m", band="critical")
        clock.advance(RESERVE_FOR_S / 2)
        gate.must_wait(0.875, ONE, model="m", band="critical")  # needed again: kept on
        clock.advance(RESERVE_FOR_S * 0.9)
        assert gate.saturated(0.875, ONE, model="m", band="standard") is True
        clock.advance(RESERVE_FOR_S * 0.2)
        assert gate.saturated(0.875, ONE, model="m", band="standard") is False
        assert (gate.reserving("m"), gate.saturated_load) == (False, 1.0)

    def test_a_zero_reserve_is_never_kept(self) -> None:
        """critical_reserve 0: the critical band waits for a release like the others."""
        gate = FlowGate(limits(), critical_reserve=0)
        assert gate.must_wait(1.0, FULL, model="m", band="critical") is True
        assert gate.reserving("m") is False
        assert gate.saturated(0.875, ONE, model="m", band="standard") is False


class TestReserveHonoured:
    """Releases and the poller grant below the critical band only beyond the reserve."""

    def test_a_release_grants_standard_only_beyond_the_reserve(self) -> None:
        """With the reserve kept, a release leaving one slot grants no standard waiter,
        a critical arrival takes that slot at once, and a release leaving two grants
        the standard one."""
        clock = ManualClock()
        gate = FlowGate(limits(), clock=clock)
        served: list[str] = []

        async def one(band: str, name: str) -> None:
            await gate.wait_turn("m", band, name, deadline=1e9, snapshots=lambda: FULL)
            served.append(name)

        async def main() -> None:
            gate.must_wait(1.0, FULL, model="m", band="critical")
            async with asyncio.TaskGroup() as tg:
                tg.create_task(one("standard", "std"))
                await asyncio.sleep(0.01)
                gate.freed("m", lambda _m: ONE)
                await asyncio.sleep(0.01)
                assert served == []
                crit = tg.create_task(
                    gate.wait_turn("m", "critical", "crit", deadline=1e9, snapshots=lambda: ONE)
                )
                await asyncio.sleep(0.001)
                assert crit.done()
                gate.freed("m", lambda _m: TWO)
                await asyncio.sleep(0.01)
                assert served == ["std"]

        vtime.run(main(), clock)
        assert gate.waiting == 0

    def test_the_poller_honours_the_reserve(self) -> None:
        """With no release, the first waiter's poll finds one slot and leaves it; it
        goes once the reserve lapses (or room for two comes back)."""
        clock = ManualClock()
        gate = FlowGate(limits(max_wait_s=60.0), clock=clock)

        async def main() -> float:
            gate.must_wait(1.0, FULL, model="m", band="critical")
            start = clock.monotonic()
            await gate.wait_turn("m", "standard", "a", deadline=1e9, snapshots=lambda: ONE)
            return clock.monotonic() - start

        waited = vtime.run(main(), clock)
        assert RESERVE_FOR_S <= waited <= RESERVE_FOR_S + 0.2
