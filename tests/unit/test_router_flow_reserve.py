"""Flow control's critical reserve: room kept for the critical band while it needs it."""

from __future__ import annotations

import asyncio

from llmgw.router.request.flowgate import FlowGate
from llmgw.router.request.reserve import RESERVE_FOR_S, reserve_for
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


# Ten replicas of capacity 8 (80 slots; at most 8 reserved): room for 3 more, and for 4.
FLEET_3 = [snap(f"e{i}", running=8 if i else 5, capacity=8) for i in range(10)]
FLEET_4 = [snap(f"e{i}", running=8 if i else 4, capacity=8) for i in range(10)]


def _traffic(gate: FlowGate, clock: ManualClock, *, critical: int, released: int) -> None:
    """A second of a model's traffic while its reserve is kept: `critical` critical
    arrivals (each finding no room beyond the reserve) and `released` releases."""
    for i in range(released):
        if i < critical:
            gate.must_wait(1.0, FULL, model="m", band="critical")
        gate.freed("m", lambda _m: FULL)
        clock.advance(1.0 / released)


class TestReserveSize:
    """The reserve grows with the critical band's share of the model's releases."""

    def test_sized_so_an_arrival_rarely_finds_it_taken(self) -> None:
        """The smallest reserve an arrival finds all taken at most 1 % of the time:
        ratio ** n <= 0.01, between the floor and the most allowed."""
        assert [reserve_for(r, 1, 100) for r in (0.0, 0.05, 0.1, 0.114, 0.2, 0.5)] == [
            1,
            2,
            2,
            3,
            3,
            7,
        ]
        assert reserve_for(0.5, 4, 100) == 7
        assert reserve_for(0.01, 4, 100) == 4
        assert reserve_for(0.9, 1, 5) == 5
        assert reserve_for(1.5, 1, 5) == 5
        assert reserve_for(0.5, 2, 1) == 2
        assert reserve_for(0.5, 0, 100) == 0

    def test_a_busy_critical_band_keeps_more_room(self) -> None:
        """Critical arrivals at a fifth of the releases make the kept reserve three
        slots: a standard request is held with room for three, let go with four."""
        clock = ManualClock()
        gate = FlowGate(limits(), clock=clock)
        for _ in range(10):
            _traffic(gate, clock, critical=4, released=20)
        assert gate.reserve.size("m", FLEET_3) == 3
        assert gate.saturated(0.9, FLEET_3, model="m", band="standard") is True
        assert gate.saturated(0.9, FLEET_4, model="m", band="standard") is False

    def test_a_light_critical_band_keeps_the_floor(self) -> None:
        """Arrivals at a two-hundredth of the releases need no more than the floor."""
        clock = ManualClock()
        gate = FlowGate(limits(), clock=clock)
        for _ in range(10):
            _traffic(gate, clock, critical=1, released=200)
        assert gate.reserve.size("m", FLEET_3) == 1

    def test_the_floor_until_releases_are_counted(self) -> None:
        """A few releases say nothing of the rates yet: the floor."""
        clock = ManualClock()
        gate = FlowGate(limits(), clock=clock)
        _traffic(gate, clock, critical=5, released=10)
        assert gate.reserve.size("m", FLEET_3) == 1

    def test_never_more_than_a_tenth_of_the_slots(self) -> None:
        """A critical band as busy as the releases keeps a tenth of the replicas'
        slots, and a small fleet the floor."""
        clock = ManualClock()
        gate = FlowGate(limits(), clock=clock)
        for _ in range(10):
            _traffic(gate, clock, critical=20, released=20)
        assert gate.reserve.size("m", FLEET_3) == 8
        assert gate.reserve.size("m", FULL) == 1
