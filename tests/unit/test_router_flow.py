"""Flow control: the pure queues (flow.py) and the gate's waiting on a virtual clock."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.errors import FlowRefused
from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot
from llmgw.router.request.flow import BANDS, GRANTED, PUSHED_OUT, BandLimits, FlowQueue, Refusal
from llmgw.router.request.flowgate import FlowGate
from llmgw.router.request.holdpoint import HoldPoints
from llmgw.runtime.clock import ManualClock
from llmgw.testing import vtime
from tests.unit.test_router_scheduler import snap


def limits(max_queued: int = 100, max_wait_s: float = 10.0) -> dict[str, BandLimits]:
    return {b: BandLimits(max_queued=max_queued, max_wait_s=max_wait_s) for b in BANDS}


def push(q: FlowQueue, band: str, tenant: str, now: float = 0.0) -> None:
    got = q.push(band, tenant, now)
    assert not isinstance(got, Refusal)


def order(q: FlowQueue) -> list[str]:
    out = []
    while (t := q.pop(0.0)) is not None:
        out.append(f"{t.band}:{t.tenant}")
    return out


class TestBands:
    """Bands are served in strict priority; arrival order inside a tenant."""

    def test_critical_before_standard_before_batch(self) -> None:
        """Whatever the arrival order, every critical goes before any standard, then batch."""
        q = FlowQueue(limits())
        for band in ("batch", "standard", "critical", "batch", "critical"):
            push(q, band, "a")
        assert order(q) == [
            "critical:a",
            "critical:a",
            "standard:a",
            "batch:a",
            "batch:a",
        ]

    def test_empty_queue_grants_nothing(self) -> None:
        """pop and peek on an empty queue say None."""
        q = FlowQueue(limits())
        assert (q.pop(0.0), q.peek(), len(q)) == (None, None, 0)


class TestFairness:
    """Tenants inside a band share it by weighted fair queueing."""

    def test_a_backlogged_tenant_alternates_with_a_quiet_one(self) -> None:
        """A tenant with ten queued does not delay another's two: they alternate, the
        tenant with fewer queued first at each tie of their tags."""
        q = FlowQueue(limits())
        for _ in range(10):
            push(q, "standard", "noisy")
        push(q, "standard", "quiet")
        push(q, "standard", "quiet")
        assert order(q)[:4] == [
            "standard:quiet",
            "standard:noisy",
            "standard:quiet",
            "standard:noisy",
        ]

    def test_idle_time_earns_no_credit(self) -> None:
        """A tenant that comes back after others were served starts at the band's
        virtual time: it does not get a burst ahead of the backlog."""
        q = FlowQueue(limits())
        push(q, "standard", "a")
        assert q.pop(0.0) is not None
        for _ in range(6):
            push(q, "standard", "b")
        for _ in range(5):
            assert q.pop(0.0) is not None  # b is served alone for a while
        for _ in range(3):
            push(q, "standard", "a")
        # Tags: a's at 5, 6, 7 (the band's virtual time is 4), b's last at 6; at the
        # tie the tenant with fewer queued goes first.
        assert order(q) == ["standard:a", "standard:b", "standard:a", "standard:a"]

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.sampled_from("abcd"), min_size=1, max_size=80))
    def test_every_backlogged_tenant_gets_an_equal_share(self, arrivals: list[str]) -> None:
        """Over any prefix of the grants, two tenants that both still wait differ by at
        most one grant."""
        q = FlowQueue(limits(max_queued=1000))
        for t in arrivals:
            push(q, "standard", t)
        left = Counter(arrivals)
        got: Counter[str] = Counter()
        while (t := q.pop(0.0)) is not None:
            got[t.tenant] += 1
            left[t.tenant] -= 1
            waiting = [x for x in left if left[x] > 0]
            for x in waiting:
                for y in waiting:
                    assert abs(got[x] - got[y]) <= 1


class TestBounds:
    """Each band holds at most max_queued; a full band pushes out the noisiest tenant."""

    def test_a_full_band_refuses_the_tenant_with_the_most(self) -> None:
        """The arrival of the tenant that already has the most is refused with a Retry-After."""
        q = FlowQueue(limits(max_queued=3))
        for _ in range(3):
            push(q, "batch", "a")
        got = q.push("batch", "a", 0.0)
        assert got == Refusal(band="batch", retry_after_s=1)
        assert len(q) == 3

    def test_a_quiet_arrival_pushes_out_the_noisiest_newest(self) -> None:
        """A quiet tenant's arrival at a full band takes the place of the newest request
        of the tenant with the most queued."""
        q = FlowQueue(limits(max_queued=3))
        push(q, "standard", "noisy", 1.0)
        push(q, "standard", "noisy", 2.0)
        push(q, "standard", "noisy", 3.0)
        got = q.push("standard", "quiet", 4.0)
        assert not isinstance(got, Refusal)
        _, pushed = got
        assert pushed is not None
        assert (pushed.tenant, pushed.queued_at, pushed.state) == ("noisy", 3.0, PUSHED_OUT)
        assert q.depth() == {("standard", "noisy"): 2, ("standard", "quiet"): 1}

    def test_bands_are_bounded_apart(self) -> None:
        """A full batch band leaves the critical band room."""
        q = FlowQueue(limits(max_queued=1))
        push(q, "batch", "a")
        assert isinstance(q.push("batch", "b", 0.0), Refusal)
        push(q, "critical", "b")

    def test_retry_after_follows_the_grant_rate(self) -> None:
        """Retry-After is the requests ahead times the seconds between grants."""
        q = FlowQueue(limits())
        for i in range(12):
            push(q, "standard", "a", float(i))
        for now in (0.0, 2.0, 4.0):
            q.pop(now)
        # 9 left, one grant every 2 s.
        assert q.retry_after_s("standard") == 18
        assert q.retry_after_s("critical") == 1


class TestRemoval:
    """A waiter that leaves is removed at once from the counts and skipped by pop."""

    def test_removed_ticket_is_never_granted(self) -> None:
        """Removing the head makes the next one the head."""
        q = FlowQueue(limits())
        got = q.push("standard", "a", 0.0)
        assert not isinstance(got, Refusal)
        first, _ = got
        push(q, "standard", "b")
        q.remove(first)
        assert (len(q), q.depth()) == (1, {("standard", "b"): 1})
        assert order(q) == ["standard:b"]

    def test_removing_a_granted_ticket_changes_nothing(self) -> None:
        """remove() after the grant is a no-op."""
        q = FlowQueue(limits())
        push(q, "standard", "a")
        t = q.pop(0.0)
        assert t is not None
        q.remove(t)
        assert (t.state, len(q)) == (GRANTED, 0)


def saturated_snaps() -> list:  # type: ignore[type-arg]
    """One replica at its capacity (8 running of 8, and seen with a queue)."""
    return [snap("e1", running=8, waiting=1, capacity=8)]


def free_snaps() -> list:  # type: ignore[type-arg]
    return [snap("e1", running=2, capacity=8)]


class TestGate:
    """The gate queues at saturation, grants on release, and enforces its bounds."""

    def test_saturation_needs_the_capacity_shown(self) -> None:
        """A replica at its learned capacity whose engine was never seen queueing is not
        a limit; once seen (the registry remembers), it is."""
        shown: set[str] = set()
        gate = FlowGate(limits(), shown=shown.__contains__)
        full = [snap("e1", running=8, capacity=8)]
        assert gate.saturated(1.0, full) is False
        assert gate.below_capacity(full) is True
        shown.add("e1")
        assert gate.saturated(1.0, full) is True
        assert gate.below_capacity(full) is False
        assert gate.saturated(0.5, full) is False
        assert gate.saturated(None, full) is False

    def test_critical_overtakes_queued_batch(self) -> None:
        """Granted one at a time, a critical arrival goes before batch ones queued earlier."""
        clock = ManualClock()
        gate = FlowGate(limits(), clock=clock)
        served: list[str] = []
        snaps = saturated_snaps()

        async def one(name: str, band: str) -> None:
            await gate.wait_turn("m", band, name, deadline=1e9, snapshots=saturated_snaps)
            served.append(name)

        async def main() -> None:
            async with asyncio.TaskGroup() as tg:
                for i in range(3):
                    tg.create_task(one(f"batch{i}", "batch"))
                await asyncio.sleep(0.01)
                tg.create_task(one("crit", "critical"))
                await asyncio.sleep(0.01)
                assert gate.depth() == {
                    ("critical", "crit"): 1,
                    **{("batch", f"batch{i}"): 1 for i in range(3)},
                }
                for _ in range(4):
                    gate.freed("m", lambda _m: [snap("e1", running=7, capacity=8)])
                    await asyncio.sleep(0.01)

        vtime.run(main(), clock)
        assert served == ["crit", "batch0", "batch1", "batch2"]
        assert (gate.waiting, gate.depth()) == (0, {})
        assert snaps  # the replica list the test saturated on

    def test_a_release_without_capacity_grants_nothing(self) -> None:
        """freed() while every replica is still at capacity leaves the waiter queued."""
        clock = ManualClock()
        gate = FlowGate(limits(max_wait_s=2.0), clock=clock)

        async def main() -> None:
            task = asyncio.create_task(
                gate.wait_turn("m", "standard", "a", deadline=1e9, snapshots=saturated_snaps)
            )
            await asyncio.sleep(0.5)
            gate.freed("m", lambda _m: saturated_snaps())
            await asyncio.sleep(0.5)
            assert not task.done()
            with pytest.raises(FlowRefused) as err:
                await task
            assert (err.value.status, err.value.code) == (503, "flow_wait_exceeded")
            assert err.value.retry_after_s >= 1

        vtime.run(main(), clock)
        assert gate.waiting == 0

    def test_the_poller_grants_when_capacity_comes_back_unannounced(self) -> None:
        """With no release at all, the first waiter sees capacity come back within a poll."""
        clock = ManualClock()
        gate = FlowGate(limits(), clock=clock)
        full = [True]

        async def main() -> float:
            start = clock.monotonic()
            task = asyncio.create_task(
                gate.wait_turn(
                    "m",
                    "standard",
                    "a",
                    deadline=1e9,
                    snapshots=lambda: saturated_snaps() if full[0] else free_snaps(),
                )
            )
            await asyncio.sleep(1.0)
            assert not task.done()
            full[0] = False
            await task
            return clock.monotonic() - start

        waited = vtime.run(main(), clock)
        assert 1.0 <= waited <= 1.2

    def test_deadline_bounds_the_wait(self) -> None:
        """A request's own deadline, sooner than its band's max wait, ends the wait."""
        clock = ManualClock()
        gate = FlowGate(limits(max_wait_s=30.0), clock=clock)

        async def main() -> float:
            start = clock.monotonic()
            with pytest.raises(FlowRefused):
                await gate.wait_turn(
                    "m", "batch", "a", deadline=start + 3.0, snapshots=saturated_snaps
                )
            return clock.monotonic() - start

        assert vtime.run(main(), clock) == pytest.approx(3.0)

    def test_full_band_refuses_with_429(self) -> None:
        """An arrival at a full band, from the tenant with the most, is a 429 at once."""
        clock = ManualClock()
        gate = FlowGate(limits(max_queued=1), clock=clock)

        async def main() -> None:
            first = asyncio.create_task(
                gate.wait_turn("m", "batch", "a", deadline=1e9, snapshots=saturated_snaps)
            )
            await asyncio.sleep(0)
            with pytest.raises(FlowRefused) as err:
                await gate.wait_turn("m", "batch", "a", deadline=1e9, snapshots=saturated_snaps)
            assert (err.value.status, err.value.code) == (429, "flow_queue_full")
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first

        vtime.run(main(), clock)
        assert (gate.waiting, gate.depth()) == (0, {})

    def test_pushed_out_waiter_gets_429(self) -> None:
        """The noisy tenant's newest waiter is answered 429 when a quiet one takes its place."""
        clock = ManualClock()
        gate = FlowGate(limits(max_queued=2), clock=clock)

        async def wait(tenant: str) -> None:
            await gate.wait_turn("m", "standard", tenant, deadline=1e9, snapshots=saturated_snaps)

        async def main() -> None:
            a1 = asyncio.create_task(wait("noisy"))
            a2 = asyncio.create_task(wait("noisy"))
            await asyncio.sleep(0)
            b = asyncio.create_task(wait("quiet"))
            await asyncio.sleep(0)
            with pytest.raises(FlowRefused) as err:
                await a2
            assert err.value.status == 429
            assert gate.depth() == {("standard", "noisy"): 1, ("standard", "quiet"): 1}
            for t in (a1, b):
                t.cancel()
            await asyncio.gather(a1, b, return_exceptions=True)

        vtime.run(main(), clock)
        assert gate.waiting == 0

    def test_a_grant_cancelled_before_use_passes_on(self) -> None:
        """A waiter cancelled right after its grant hands the slot to the next in line."""
        clock = ManualClock()
        gate = FlowGate(limits(), clock=clock)

        async def main() -> None:
            first = asyncio.create_task(
                gate.wait_turn("m", "standard", "a", deadline=1e9, snapshots=saturated_snaps)
            )
            second = asyncio.create_task(
                gate.wait_turn("m", "standard", "b", deadline=1e9, snapshots=saturated_snaps)
            )
            await asyncio.sleep(0)
            gate.freed("m", lambda _m: free_snaps())
            first.cancel()  # granted, not yet resumed
            with pytest.raises(asyncio.CancelledError):
                await first
            await asyncio.wait_for(second, timeout=0.05)

        vtime.run(main(), clock)
        assert gate.waiting == 0


class TestExpectedWait:
    """An arrival that would wait past its band's max_wait_s is refused at once."""

    def test_a_backlogged_tenant_is_refused_and_a_quiet_one_is_not(self) -> None:
        """At one grant a second and 5 s of wait allowed, the tenant with 4 queued is
        refused its fifth; another tenant's first is queued."""
        q = FlowQueue(limits(max_wait_s=5.0))
        for i in range(12):
            push(q, "standard", "noisy", float(i))
        for now in range(8):
            q.pop(float(now))  # 4 left, a grant every second
        assert q.expected_wait_s("standard", "noisy") == 5.0
        push(q, "standard", "noisy")
        got = q.push("standard", "noisy", 8.0)
        assert isinstance(got, Refusal)
        assert got.wait_s == 6.0
        assert q.expected_wait_s("standard", "quiet") == 2.0
        push(q, "standard", "quiet")

    def test_higher_bands_count_ahead(self) -> None:
        """Every waiting critical request is ahead of a batch arrival."""
        q = FlowQueue(limits())
        for now in (0.0, 1.0):
            push(q, "critical", "c", now)
            q.pop(now)
        for _ in range(3):
            push(q, "critical", "c")
        assert q.expected_wait_s("batch", "b") == 4.0
        assert FlowQueue(limits()).expected_wait_s("batch", "b") is None


def same_scrape(s: Snapshot, *, inflight: int) -> Snapshot:
    """`s` later, before the next scrape: its Stats the same object, `inflight` now."""
    return Snapshot.of(
        info=s.info,
        stats=s.stats,
        drain_rate=s.drain_rate,
        inflight=inflight,
        running_capacity=s.running_capacity,
        stale=s.stale,
        age_s=s.age_s,
        breaker=s.breaker,
        restarts=s.restarts,
        inflight_at_scrape=s.inflight_at_scrape,
        pending=s.pending,
    )


class TestBelowCapacity:
    """A replica takes a granted request only if it is below capacity and has no queue."""

    def test_an_engine_with_a_queue_is_full_below_its_learned_capacity(self) -> None:
        """4 running and 2 waiting of a learned 8 is full until 2 of ours finish there
        (its hold point, 6.4 requests after this one scrape, is not what holds it)."""
        gate = FlowGate(limits())
        queued = snap("e1", running=4, waiting=2, capacity=8, inflight=6)
        assert gate.below_capacity([queued]) is False
        one_done = same_scrape(queued, inflight=5)
        assert gate.below_capacity([one_done]) is False
        two_done = same_scrape(queued, inflight=4)
        assert gate.below_capacity([two_done]) is True

    def test_a_stale_or_open_replica_does_not_count(self) -> None:
        """An open breaker is never capacity; a stale figure's queue is not believed."""
        gate = FlowGate(limits())
        assert gate.below_capacity([free_snaps()[0], snap("x", breaker=BreakerState.OPEN)])
        assert gate.below_capacity([snap("x", breaker=BreakerState.OPEN)]) is False
        stale = snap("e1", running=2, waiting=2, capacity=32, stale=True)
        assert gate.below_capacity([stale]) is True


class TestHoldPoints:
    """Each replica's hold point follows its engine's queue, one request at a time."""

    def test_a_queue_lowers_the_point_below_what_the_engine_ran(self) -> None:
        """An engine of learned capacity 10 seen running 5 with 2 waiting is held at 8,
        then 6.4, 5.12, 4.096, 4: a fifth off a scrape at most, down to one below
        what it ran."""
        points = HoldPoints()
        seen = []
        for _ in range(5):
            seen.append(points.point(snap("e1", running=5, waiting=2, capacity=10)))
        assert seen == pytest.approx([0.8, 0.64, 0.512, 0.4096, 0.4])
        assert points.lowest == pytest.approx(0.4)

    def test_the_same_scrape_is_learned_from_once(self) -> None:
        """Asked again before the next scrape, the point stays where the scrape put it."""
        points = HoldPoints()
        s = snap("e1", running=5, waiting=2, capacity=8)
        points.point(s)
        assert points.point(same_scrape(s, inflight=9)) == 0.8

    def test_no_queue_at_the_point_raises_it_up_to_the_ceiling(self) -> None:
        """Running at its point with nothing waiting, the engine gets one more a scrape,
        never past its learned capacity; below its point a scrape changes nothing."""
        points = HoldPoints()
        for _ in range(8):
            points.point(snap("e1", running=3, waiting=1, capacity=8))
        assert points.points() == {"e1": 2 / 8}
        assert points.point(snap("e1", running=1, capacity=8)) == 2 / 8
        for n in range(2, 8):
            assert points.point(snap("e1", running=n, capacity=8)) == pytest.approx((n + 1) / 8)
        assert points.point(snap("e1", running=8, capacity=8)) == 1.0
        assert points.lowest == 1.0

    def test_a_stale_or_open_replica_teaches_nothing(self) -> None:
        """A scrape that is stale, or of a replica whose breaker is open, is not believed."""
        points = HoldPoints()
        assert points.point(snap("e1", running=2, waiting=5, stale=True)) == 1.0
        opened = snap("e1", running=2, waiting=5, breaker=BreakerState.OPEN)
        assert points.point(opened) == 1.0

    def test_the_gate_holds_at_the_point(self) -> None:
        """A replica whose engine queued at 9 of 10 saturates the gate at 8, once a
        request at its capacity has shown the gate that queue."""
        gate = FlowGate(limits())
        assert gate.saturated_load == 1.0
        s = snap("e1", running=9, waiting=1, capacity=10, inflight=10)
        assert gate.saturated(0.9, [s]) is False  # below every point: not looked at
        assert gate.saturated(1.0, [s]) is True
        assert gate.saturated_load == pytest.approx(0.8)
        assert gate.saturated(0.8, [same_scrape(s, inflight=8)]) is True
        assert gate.saturated(0.8, [same_scrape(s, inflight=7)]) is False


class TestWaitBound:
    """An arrival is refused at once past its band's turnovers of the running requests."""

    def test_the_bound_is_the_turnover_when_sooner_than_max_wait(self) -> None:
        """At a grant every 0.1 s, 4 requests running turn over in 0.4 s; a band of two
        turnovers queues 0.8 s of wait, one of none queues max_wait_s."""
        bands = {
            b: BandLimits(max_queued=100, max_wait_s=10.0, max_wait_turnovers=2.0) for b in BANDS
        }
        q = FlowQueue(bands)
        assert q.wait_bound_s("standard", 4) == 10.0  # no grant rate yet
        for i in range(3):
            push(q, "standard", "a", i * 0.1)
            q.pop(i * 0.1)
        assert q.turnover_s(4) == pytest.approx(0.4)
        assert q.wait_bound_s("standard", 4) == pytest.approx(0.8)
        assert q.wait_bound_s("standard", 0) == 10.0  # nothing running: no turnover
        assert FlowQueue(limits()).wait_bound_s("standard", 4) == 10.0

    def test_a_backlog_past_the_turnover_is_refused_and_a_newcomer_is_not(self) -> None:
        """A grant every 0.1 s and 4 running: a tenant with 4 queued is refused its
        fifth (0.5 s of wait), another tenant's first is queued."""
        bands = {
            b: BandLimits(max_queued=100, max_wait_s=10.0, max_wait_turnovers=1.0) for b in BANDS
        }
        q = FlowQueue(bands)
        for i in range(2):
            push(q, "standard", "noisy", float(i))
            q.pop(i * 0.1)
        for _ in range(4):
            assert not isinstance(q.push("standard", "noisy", 1.0, running=4), Refusal)
        got = q.push("standard", "noisy", 1.0, running=4)
        assert isinstance(got, Refusal)
        assert got.wait_s == pytest.approx(0.5)
        assert not isinstance(q.push("standard", "quiet", 1.0, running=4), Refusal)

    def test_a_tenant_with_nothing_queued_is_bounded_by_max_wait_only(self) -> None:
        """Behind a critical backlog longer than the turnover, a standard tenant's first
        request is queued (it is within its share); its second is refused."""
        bands = {
            b: BandLimits(max_queued=100, max_wait_s=10.0, max_wait_turnovers=1.0) for b in BANDS
        }
        q = FlowQueue(bands)
        for i in range(2):
            push(q, "critical", "c", i * 0.1)
            q.pop(i * 0.1)
        for _ in range(8):
            push(q, "critical", "c", 1.0)
        assert q.wait_bound_s("standard", 4, "s") == 10.0
        assert not isinstance(q.push("standard", "s", 1.0, running=4), Refusal)
        got = q.push("standard", "s", 1.0, running=4)
        assert isinstance(got, Refusal)
        assert got.wait_s == pytest.approx(1.0)
