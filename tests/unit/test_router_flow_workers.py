"""Flow control: claims across a router's workers, and where a granted request goes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from llmgw.router.replicas.registry import Registry
from llmgw.router.request.flow import BANDS, BandLimits, FlowQueue, Refusal
from llmgw.router.request.flowgate import SHARED_POLL_S, FlowGate
from llmgw.router.request.reserve import RESERVE_FOR_S
from llmgw.router.workers.shared import SharedInflight
from llmgw.runtime.clock import ManualClock
from llmgw.testing import vtime
from llmgw.wire.endpoints import EndpointInfo
from tests.unit.test_router_flow import free_snaps, saturated_snaps
from tests.unit.test_router_flow_reserve import ONE, TWO
from tests.unit.test_router_scheduler import snap


def limits() -> dict[str, BandLimits]:
    return {b: BandLimits(max_queued=100, max_wait_s=10.0) for b in BANDS}


def claim_of(*arrivals: tuple[str, str], at: float = 0.0, now: float = 1.0) -> int:
    """The claim at `now` of a queue holding `arrivals`, queued at `at`."""
    q = FlowQueue(limits())
    for band, tenant in arrivals:
        assert not isinstance(q.push(band, tenant, at), Refusal)
    return q.claim(now)


class Claims:
    """Two workers' claim and reserve cells for one model, as the Registry keeps them."""

    def __init__(self) -> None:
        self.cells = [0, 0]
        self.stamps = [0, 0]
        self.queued: list[dict[int, int]] = [{}, {}]

    def gate(self, i: int, clock: ManualClock) -> FlowGate:
        return FlowGate(limits(), clock=clock, peers=_Peer(self, i))


class _Peer:
    """Worker `i`'s view of `Claims` (flowgate.Peers)."""

    def __init__(self, cells: Claims, i: int) -> None:
        self.c, self.i = cells, i

    def claim(self, model: str, claims: Mapping[str, int]) -> None:
        self.c.cells[self.i] = claims.get(model, 0)

    def claimed_elsewhere(self, model: str) -> int:
        return self.c.cells[1 - self.i]

    def reserve(self, model: str, stamp: int) -> None:
        self.c.stamps[self.i] = stamp

    def reserved_elsewhere(self, model: str) -> int:
        return self.c.stamps[1 - self.i]

    def count_queued(self, bucket: int, n: int) -> None:
        self.c.queued[self.i][bucket] = n

    def queued_total(self, bucket: int) -> int:
        return sum(q.get(bucket, 0) for q in self.c.queued)


class TestClaim:
    """A queue's claim orders bands, then a tenant alone before a backlog, then age."""

    def test_bands_then_a_tenant_alone_then_the_older(self) -> None:
        """Critical beats any standard; a standard tenant with one queued beats one with
        three however long they waited; of two backlogs the one whose first request
        waited longer wins; nothing queued claims nothing."""
        assert claim_of() == 0
        quiet = claim_of(("standard", "quiet"))
        noisy = [("standard", "noisy")] * 3
        old, young = claim_of(*noisy, at=0.0, now=9.0), claim_of(*noisy, at=8.5, now=9.0)
        critical = claim_of(("critical", "c"), ("critical", "c"))
        batch = claim_of(("batch", "b"), now=100.0)
        assert critical > quiet > old > young > batch > 0
        # What the queue would grant first is what it claims with.
        assert claim_of(("batch", "b"), ("critical", "c")) == claim_of(("critical", "c"))


class TestSharedClaims:
    """Each worker publishes its claim per endpoint; the others read the strongest."""

    def test_the_strongest_other_claim_over_the_models_an_endpoint_serves(self) -> None:
        """A worker's cell for an endpoint of two models is the stronger of its two
        claims; a worker never reads its own cell as another's."""
        first = SharedInflight.create(3, 8)
        views = [first] + [SharedInflight(first.fd, workers=3, index=i, capacity=8) for i in (1, 2)]
        infos = [
            EndpointInfo(id="e1", url="http://e1", models=("a", "b")),
            EndpointInfo(id="e2", url="http://e2", models=("b",)),
        ]
        slots = {"e1": 0, "e2": 1}
        regs = []
        for v in views:
            v.slots = dict(slots)
            reg = Registry(shared=v)
            reg.replace(infos)
            regs.append(reg)
        regs[0].claim("a", {"a": 5, "b": 9})
        regs[1].claim("b", {"b": 7})
        assert regs[2].claimed_elsewhere("a") == 9  # e1 carries worker 0's 9 (of b)
        assert regs[0].claimed_elsewhere("a") == 7  # its own 9 not counted
        assert regs[0].claimed_elsewhere("b") == 7
        regs[0].claim("a", {})
        assert regs[1].claimed_elsewhere("a") == 0
        assert Registry().claimed_elsewhere("a") == 0  # one worker: no claims
        # Critical reserves: the latest stamp of another worker on the model's endpoints.
        regs[0].reserve("a", 40)
        regs[1].reserve("b", 42)
        assert regs[2].reserved_elsewhere("a") == 42  # e1 serves b too
        assert regs[0].reserved_elsewhere("a") == 42
        assert regs[1].reserved_elsewhere("a") == 40
        assert regs[1].reserved_elsewhere("b") == 40
        assert Registry().reserved_elsewhere("a") == 0
        regs[0].replace([])  # a departed endpoint's cells are left at 0
        assert regs[1].reserved_elsewhere("a") == 0


class TestGrantsAcrossWorkers:
    """A freed slot goes to the worker holding the strongest claim, never lost."""

    def test_a_release_leaves_the_slot_to_a_stronger_claim(self) -> None:
        """Worker 0 holds a noisy backlog, worker 1 one critical request: worker 0's
        release grants nothing of its own, worker 1's poller takes the slot within a
        poll; with the critical one gone, worker 0's release grants again."""
        clock = ManualClock()
        claims = Claims()
        g0, g1 = claims.gate(0, clock), claims.gate(1, clock)
        room = [False]
        served: list[str] = []

        async def one(gate: FlowGate, band: str, name: str) -> None:
            await gate.wait_turn(
                "m",
                band,
                name,
                deadline=1e9,
                snapshots=lambda: free_snaps() if room[0] else saturated_snaps(),
            )
            served.append(name)

        async def main() -> float:
            async with asyncio.TaskGroup() as tg:
                for _ in range(3):
                    tg.create_task(one(g0, "standard", "noisy"))
                await asyncio.sleep(0.5)
                tg.create_task(one(g1, "critical", "crit"))
                await asyncio.sleep(0.5)
                assert claims.cells[1] > claims.cells[0] > 0
                room[0] = True
                start = clock.monotonic()
                g0.freed("m", lambda _m: [snap("e1", running=1, capacity=8)])
                assert g0.waiting == 3  # left for worker 1
                while not served:
                    await asyncio.sleep(0.001)
                waited = clock.monotonic() - start
                room[0] = False
                assert served == ["crit"]
                assert claims.cells[1] == 0
                g0.freed("m", lambda _m: [snap("e1", running=1, capacity=8)])
                await asyncio.sleep(0.01)
                assert served == ["crit", "noisy"]
                room[0] = True
            return waited

        assert vtime.run(main(), clock) <= SHARED_POLL_S + 0.001
        assert served == ["crit", "noisy", "noisy", "noisy"]

    def test_room_left_unclaimed_for_a_poll_is_taken(self) -> None:
        """A stronger claim that does not take the room (its worker stalled, or its
        claim stale) holds a weaker worker's poller back one poll, never more."""
        clock = ManualClock()
        claims = Claims()
        g0 = claims.gate(0, clock)
        claims.cells[1] = 1 << 30  # another worker claims, and never takes the room

        async def main() -> float:
            start = clock.monotonic()
            await g0.wait_turn("m", "standard", "a", deadline=1e9, snapshots=free_snaps)
            return clock.monotonic() - start

        waited = vtime.run(main(), clock)
        assert SHARED_POLL_S <= waited <= 2 * SHARED_POLL_S + 0.001

    def test_slots_left_for_a_claim_go_at_one_poll(self) -> None:
        """Three slots freed by another worker's requests go to the three waiters of
        the worker that claims them at its next poll, not one a poll; a fourth waiter
        stays queued."""
        clock = ManualClock()
        g1 = Claims().gate(1, clock)
        room = [False]
        three = [snap("e1", running=4, capacity=8)]  # 3 below its point, 7 (learned)
        served: list[float] = []

        async def one() -> None:
            await g1.wait_turn(
                "m",
                "critical",
                "c",
                deadline=1e9,
                snapshots=lambda: three if room[0] else saturated_snaps(),
            )
            served.append(clock.monotonic())

        async def main() -> float:
            tasks = [asyncio.create_task(one()) for _ in range(4)]
            await asyncio.sleep(0.5)
            room[0] = True
            start = clock.monotonic()
            await asyncio.sleep(SHARED_POLL_S * 1.5)
            assert g1.waiting == 1
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return start

        start = vtime.run(main(), clock)
        assert len(served) == 3
        assert max(served) - start <= SHARED_POLL_S + 0.001


class TestOneQueueAcrossWorkers:
    """Workers' queues act as one: a reserve kept by one is kept by all, none passes."""

    def test_a_claim_counts_the_tenant_over_every_worker(self) -> None:
        """A tenant with one request queued in worker 0 and four in worker 1 claims as a
        backlog of five: worker 1's quiet request, queued later, claims more strongly;
        with it gone, the older backlog request, in worker 0, claims more strongly."""
        clock = ManualClock()
        claims = Claims()
        g0, g1 = claims.gate(0, clock), claims.gate(1, clock)

        def wait(gate: FlowGate, tenant: str) -> asyncio.Task[None]:
            return asyncio.create_task(
                gate.wait_turn("m", "standard", tenant, deadline=1e9, snapshots=saturated_snaps)
            )

        async def main() -> None:
            first = wait(g0, "noisy")
            await asyncio.sleep(0.05)
            rest = [wait(g1, "noisy") for _ in range(4)]
            await asyncio.sleep(0.05)
            quiet = wait(g1, "quiet")
            await asyncio.sleep(0.05)
            assert g0._ours(g0._models["m"]) is False
            assert claims.cells[1] > claims.cells[0]
            quiet.cancel()
            await asyncio.sleep(0.01)
            assert g0._ours(g0._models["m"]) is True
            assert g1._ours(g1._models["m"]) is False
            for t in [first, *rest]:
                t.cancel()
            await asyncio.gather(first, *rest, quiet, return_exceptions=True)

        vtime.run(main(), clock)
        assert [sum(q.values()) for q in claims.queued] == [0, 0]  # every count given back

    def test_a_reserve_one_worker_keeps_the_other_keeps(self) -> None:
        """Worker 0's critical request finds room for one only and keeps the reserve;
        worker 1 then holds a standard request at that slot and asks about every
        request, until the reserve lapses there too."""
        clock = ManualClock()
        claims = Claims()
        g0, g1 = claims.gate(0, clock), claims.gate(1, clock)
        assert g1.saturated(0.875, ONE, model="m", band="standard") is False
        assert g0.must_wait(0.875, ONE, model="m", band="critical") is False
        assert claims.stamps[0] > 0
        assert g1.saturated(0.875, ONE, model="m", band="standard") is True
        assert g1.saturated_load == 0.0
        assert g1.saturated(0.75, TWO, model="m", band="standard") is False
        assert g1.saturated(0.875, ONE, model="m", band="critical") is False
        clock.advance(RESERVE_FOR_S + 1.01)
        assert g1.saturated(0.875, ONE, model="m", band="standard") is False
        assert g1.saturated_load > 0.0

    def test_a_worker_publishes_its_reserve_once_a_second(self) -> None:
        """Many critical requests in one second write the shared cell once."""
        clock = ManualClock()
        writes: list[int] = []
        claims = Claims()
        peer = _Peer(claims, 0)
        peer.reserve = lambda _m, stamp: writes.append(stamp)  # type: ignore[method-assign]
        gate = FlowGate(limits(), clock=clock, peers=peer)
        for _ in range(5):
            gate.must_wait(0.875, ONE, model="m", band="critical")
            clock.advance(0.1)
        clock.advance(0.6)
        gate.must_wait(0.875, ONE, model="m", band="critical")
        assert writes == [1001, 1002]

    def test_every_scrape_teaches_the_hold_point(self) -> None:
        """A gate fed each scrape as it comes (Router.observed) learns from the queue
        one showed; a gate that looks only after the last one never saw it."""
        fed, late = FlowGate(limits()), FlowGate(limits())
        s = snap("e1", running=6, capacity=8)
        for running, waiting in ((8, 2), (7, 1), (6, 0)):
            s = snap("e1", running=running, waiting=waiting, capacity=8)
            fed.learn(s)
        late.saturated(1.0, [s])
        assert fed.saturated_load == 0.875
        assert late.saturated_load == 1.0

    def test_a_request_waits_behind_another_workers_waiters(self) -> None:
        """With room free, a request is not held unless another worker's requests wait
        for the same replicas: then it queues behind them."""
        clock = ManualClock()
        claims = Claims()
        g0 = claims.gate(0, clock)
        assert g0.must_wait(0.25, free_snaps(), model="m", band="standard") is False
        claims.cells[1] = claim_of(("standard", "noisy"))
        assert g0.must_wait(0.25, free_snaps(), model="m", band="standard") is True


class TestWhereAGrantGoes:
    """A critical request at saturation goes where it starts soonest: home, else room."""

    def test_critical_leaves_out_the_replicas_at_their_point(self) -> None:
        """A replica at its learned capacity (seen queueing) is left out of a granted
        critical request's choice when another has room, and only then; the other
        bands choose as before."""
        gate = FlowGate(limits())
        full = snap("e1", running=8, waiting=1, capacity=8)
        free = snap("e2", running=2, capacity=8)
        assert set(gate.exclude_for("critical", [full, free], ())) == {"e1"}
        assert set(gate.exclude_for("standard", [full, free], ())) == set()
        assert set(gate.exclude_for("critical", [full, free], ("e2",))) == {"e2"}
        assert set(gate.exclude_for("critical", [full], ("x",))) == {"x"}

    def test_critical_prefers_a_replica_not_prefilling_for_us(self) -> None:
        """Of the replicas with room, a critical request leaves out those with a request
        of ours still awaiting its first token, when one has none; if every one has,
        none is left out for it."""
        gate = FlowGate(limits())
        busy = snap("e1", running=2, capacity=8, pending=1)
        idle = snap("e2", running=3, capacity=8)
        assert set(gate.exclude_for("critical", [busy, idle], ())) == {"e1"}
        assert set(gate.exclude_for("critical", [busy], ())) == set()
        assert set(gate.exclude_for("standard", [busy, idle], ())) == set()

    def test_critical_stays_home_when_its_home_has_room(self) -> None:
        """A home with room keeps a critical request, even one with a prefill of ours
        in progress; the other replicas with room are left out."""
        gate = FlowGate(limits())
        home = snap("e1", running=2, capacity=8, pending=1)
        other = snap("e2", running=1, capacity=8)
        assert set(gate.exclude_for("critical", [home, other], (), ("e1",))) == {"e2"}

    def test_a_full_home_keeps_it_only_where_its_engine_orders_by_priority(self) -> None:
        """A home at its capacity whose engine orders its queue by priority keeps a
        critical request (it starts there first, and hits); a full FCFS home does not,
        nor one whose engine has requests waiting."""
        gate = FlowGate(limits())
        queued = snap("e1", running=8, waiting=1, capacity=8)
        free = snap("e2", running=2, capacity=8)
        assert set(gate.exclude_for("critical", [queued, free], (), ("e1",), ("e1",))) == {"e1"}
        home = snap("e1", running=8, capacity=8)
        free = snap("e2", running=2, capacity=8)
        snaps = [home, free]
        assert set(gate.exclude_for("critical", snaps, (), ("e1",), ("e1",))) == {"e2"}
        assert set(gate.exclude_for("critical", snaps, (), ("e1",), ())) == {"e1"}
        assert set(gate.exclude_for("critical", snaps, ("e1",), ("e1",), ("e1",))) == {"e1"}
        assert set(gate.exclude_for("standard", snaps, (), ("e1",), ("e1",))) == set()
