"""Flow control's fair order kept indexed (flowtenants.py): the same grants, push-outs,
refusals and waits as the walk of every tenant it replaced, kept here as the oracle."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.request.flow import (
    BANDS,
    GONE,
    GRANTED,
    PUSHED_OUT,
    WAITING,
    BandLimits,
    FlowQueue,
    Refusal,
    Ticket,
    _take,
)
from llmgw.router.request.flowtenants import TenantIndex


class ScanBand:
    """flow.py's `_Band` as it was at e26e514: the head found by walking every tenant."""

    def __init__(self, limits: BandLimits) -> None:
        self.limits = limits
        self.queues: dict[str, deque[Ticket]] = {}
        self.count = 0
        self.counts: dict[str, int] = {}
        self.last_finish: dict[str, float] = {}
        self.vtime = 0.0

    def head(self) -> Ticket | None:
        best: Ticket | None = None
        for tenant in list(self.queues):
            q = self.queues[tenant]
            while q and q[0].state != WAITING:
                q.popleft()
            if not q:
                del self.queues[tenant]
                continue
            t = q[0]
            if best is None or (t.finish, self.counts[t.tenant], t.tenant) < (
                best.finish,
                self.counts[best.tenant],
                best.tenant,
            ):
                best = t
        return best

    def forget(self, t: Ticket) -> None:
        self.count -= 1
        left = self.counts[t.tenant] - 1
        if left:
            self.counts[t.tenant] = left
        else:
            del self.counts[t.tenant]


class ScanQueue:
    """flow.py's `FlowQueue` as it was at e26e514, its order, bounds and waits only (an
    arrival's bound is its band's max_wait_s: no turnovers)."""

    def __init__(self, limits: Mapping[str, BandLimits]) -> None:
        self._bands = {b: ScanBand(limits[b]) for b in BANDS}
        self._interval_s: float | None = None
        self._last_grant: float | None = None

    def push(
        self, band: str, tenant: str, now: float, *, weight: float, home: tuple[str, ...]
    ) -> tuple[Ticket, Ticket | None] | float | None:
        """Its ticket and the one pushed out, or the refused arrival's wait (None: full)."""
        b = self._bands[band]
        wait_s = self.expected_wait_s(band, tenant)
        if wait_s is not None and wait_s > b.limits.max_wait_s:
            return wait_s
        pushed: Ticket | None = None
        if b.count >= b.limits.max_queued:
            pushed = self._push_out(b, tenant)
            if pushed is None:
                return None
        start = max(b.vtime, b.last_finish.get(tenant, b.vtime))
        finish = start + 1.0 / (weight if weight > 0 else 1.0)
        b.last_finish[tenant] = finish
        t = Ticket(band, tenant, start, finish, now, home=home)
        q = b.queues.get(tenant)
        if q is None:
            q = b.queues[tenant] = deque()
        q.append(t)
        b.count += 1
        b.counts[tenant] = b.counts.get(tenant, 0) + 1
        return t, pushed

    def _push_out(self, b: ScanBand, tenant: str) -> Ticket | None:
        if not b.counts:
            return None
        most = max(b.counts.items(), key=lambda kv: (kv[1], kv[0]))
        if most[1] <= b.counts.get(tenant, 0) + 1:
            return None
        q = b.queues[most[0]]
        for i in range(len(q) - 1, -1, -1):
            t = q[i]
            if t.state == WAITING:
                del q[i]
                t.state = PUSHED_OUT
                b.forget(t)
                b.last_finish[t.tenant] = t.start
                return t
        raise AssertionError("counts say a waiting ticket exists")

    def pop(self, now: float, room: Collection[str]) -> Ticket | None:
        for band in BANDS:
            b = self._bands[band]
            if not b.count:
                continue
            t = b.head()
            assert t is not None
            t = _take(b.queues[t.tenant], room)
            t.state = GRANTED
            b.vtime = max(b.vtime, t.start)
            b.forget(t)
            self._granted(now)
            if len(b.last_finish) > 2 * len(b.counts) + 64:
                b.last_finish = {k: v for k, v in b.last_finish.items() if v > b.vtime}
            return t
        return None

    def peek(self) -> Ticket | None:
        for band in BANDS:
            b = self._bands[band]
            if b.count:
                return b.head()
        return None

    def remove(self, t: Ticket) -> None:
        if t.state != WAITING:
            return
        t.state = GONE
        self._bands[t.band].forget(t)

    def _granted(self, now: float) -> None:
        if self._last_grant is not None:
            gap = now - self._last_grant
            prev = self._interval_s
            self._interval_s = gap if prev is None else 0.8 * prev + 0.2 * gap
        self._last_grant = now

    def expected_wait_s(self, band: str, tenant: str) -> float | None:
        interval = self._interval_s
        if interval is None:
            return None
        ahead = 0
        for name in BANDS:
            if name == band:
                break
            ahead += self._bands[name].count
        b = self._bands[band]
        turns = b.counts.get(tenant, 0) + 1
        ahead += turns
        for other, n in b.counts.items():
            if other != tenant:
                ahead += min(n, turns)
        return ahead * interval

    def depth(self) -> dict[tuple[str, str], int]:
        return {(band, t): n for band in BANDS for t, n in self._bands[band].counts.items()}


@dataclass
class Lockstep:
    """A FlowQueue and the oracle driven alike, each ticket known by its arrival's serial."""

    new: FlowQueue
    old: ScanQueue
    tenants: tuple[str, ...]
    now: float = 0.0

    def __post_init__(self) -> None:
        self.serial_new: dict[Ticket, int] = {}
        self.serial_old: dict[Ticket, int] = {}
        self.pushed: list[tuple[Ticket, Ticket]] = []

    def push(self, band: str, tenant: str, weight: float, home: tuple[str, ...]) -> None:
        got = self.new.push(band, tenant, self.now, weight=weight, home=home)
        want = self.old.push(band, tenant, self.now, weight=weight, home=home)
        if isinstance(got, Refusal):
            assert not isinstance(want, tuple)
            assert got.wait_s == want
            return
        assert isinstance(want, tuple)
        (t, out), (t_old, out_old) = got, want
        assert (t.start, t.finish) == (t_old.start, t_old.finish)
        self.serial_new[t] = self.serial_old[t_old] = len(self.pushed)
        self.pushed.append((t, t_old))
        assert self._serial(out, self.serial_new) == self._serial(out_old, self.serial_old)

    def pop(self, room: frozenset[str]) -> None:
        got = self.new.pop(self.now, room)
        want = self.old.pop(self.now, room)
        assert self._serial(got, self.serial_new) == self._serial(want, self.serial_old)
        if got is not None and want is not None:
            assert (got.start, got.finish) == (want.start, want.finish)

    def remove(self, i: int) -> None:
        if self.pushed:
            t, t_old = self.pushed[i % len(self.pushed)]
            self.new.remove(t)
            self.old.remove(t_old)

    def check(self) -> None:
        """Everything observable alike: the next grant, every ticket's state and tags,
        the counts, and each tenant's expected wait."""
        got, want = self.new.peek(), self.old.peek()
        assert self._serial(got, self.serial_new) == self._serial(want, self.serial_old)
        assert [(t.state, t.start, t.finish, t.passed) for t, _ in self.pushed] == [
            (t.state, t.start, t.finish, t.passed) for _, t in self.pushed
        ]
        assert self.new.depth() == self.old.depth()
        assert len(self.new) == sum(self.old.depth().values())
        for band in BANDS:
            for tenant in self.tenants:
                got_s = self.new.expected_wait_s(band, tenant)
                assert got_s == self.old.expected_wait_s(band, tenant)

    @staticmethod
    def _serial(t: Ticket | None, serials: dict[Ticket, int]) -> int | None:
        return None if t is None else serials[t]


def lockstep(max_queued: int, max_wait_s: float, tenants: tuple[str, ...]) -> Lockstep:
    limits = {b: BandLimits(max_queued=max_queued, max_wait_s=max_wait_s) for b in BANDS}
    return Lockstep(FlowQueue(limits), ScanQueue(limits), tenants)


@dataclass(frozen=True)
class Push:
    band: str
    tenant: str
    weight: float
    home: tuple[str, ...]


@dataclass(frozen=True)
class Pop:
    room: frozenset[str]


@dataclass(frozen=True)
class Remove:
    # Which ticket pushed so far, modulo their number.
    i: int


TENANTS = ("a", "b", "c", "d", "e")
HOMES = ("e1", "e2", "e3")
OPS = st.one_of(
    st.builds(
        Push,
        st.sampled_from(("standard", "standard", "critical", "batch")),
        st.sampled_from(TENANTS),
        st.sampled_from((1.0, 1.0, 1.0, 0.5, 2.0, 3.0)),
        st.lists(st.sampled_from(HOMES), max_size=2, unique=True).map(tuple),
    ),
    st.builds(Pop, st.frozensets(st.sampled_from(HOMES))),
    st.builds(Remove, st.integers(0, 1_000)),
)


class TestSameOrderAsTheScan:
    """The indexed band grants, pushes out, refuses and estimates as the walk of every
    tenant did."""

    @settings(max_examples=300, deadline=None)
    @given(
        st.integers(1, 14),
        st.sampled_from((1e9, 0.05, 0.2)),
        st.lists(OPS, max_size=150),
    )
    def test_random_pushes_pops_and_removals(
        self, max_queued: int, max_wait_s: float, ops: list[Push | Pop | Remove]
    ) -> None:
        """Over any sequence of arrivals (any band, weight and homes), grants (any room)
        and removals, every result and every ticket's state and tags match the oracle."""
        ls = lockstep(max_queued, max_wait_s, TENANTS)
        for op in ops:
            ls.now += 0.01
            if isinstance(op, Push):
                ls.push(op.band, op.tenant, op.weight, op.home)
            elif isinstance(op, Pop):
                ls.pop(op.room)
            else:
                ls.remove(op.i)
            ls.check()

    def test_many_tenants_passing_through(self) -> None:
        """Hundreds of tenants with one request or a few, the virtual time mostly still
        and the band often full: the same grants over thousands of steps (the sweep of
        last tags and the index's rebuilds run many times)."""
        rng = random.Random(7)
        tenants = tuple(f"u{i:03d}" for i in range(300))
        ls = lockstep(120, 1e9, tenants[:4])
        for _ in range(6_000):
            ls.now += 0.01
            r = rng.random()
            if r < 0.5:
                tenant = rng.choice(tenants[:20] if rng.random() < 0.3 else tenants)
                ls.push("standard", tenant, 1.0, ())
            elif r < 0.9:
                ls.pop(frozenset())
            else:
                ls.remove(rng.randrange(1_000_000))
        ls.check()
        assert ls.new.peek() is not None or len(ls.new) == 0


CHANGES = st.lists(
    st.tuples(st.sampled_from(TENANTS), st.sampled_from((1, 1, -1)), st.integers(0, 6)),
    max_size=200,
)


class TestTenantIndex:
    """The index answers as a walk of its tenants would."""

    @settings(max_examples=300, deadline=None)
    @given(CHANGES)
    def test_first_most_and_turns_match_a_walk(self, changes: list[tuple[str, int, int]]) -> None:
        """After any changes of counts and first tags, first() is the least (tag, count,
        name), most() the greatest (count, name), turns(k) Σ min(count, k)."""
        index = TenantIndex()
        counts: dict[str, int] = {}
        heads: dict[str, float] = {}
        for tenant, delta, tag in changes:
            n = counts.get(tenant, 0) + delta
            if n < 0:
                continue
            counts[tenant] = n
            heads[tenant] = float(tag)
            index.changed(tenant, delta, float(tag) if n else None)
            live = {t: k for t, k in counts.items() if k}
            assert index.counts == live
            assert index.count == sum(live.values())
            want_first = min(((heads[t], k, t) for t, k in live.items()), default=None)
            assert index.first() == (None if want_first is None else want_first[2])
            want_most = max(((k, t) for t, k in live.items()), default=None)
            assert index.most() == (None if want_most is None else (want_most[1], want_most[0]))
            for k in range(0, 12):
                assert index.turns(k) == sum(min(c, k) for c in live.values())

    def test_counts_past_the_tree_grow_it(self) -> None:
        """A tenant far past the tree's first size is summed as one with few."""
        index = TenantIndex()
        for i in range(100):
            index.changed("flood", 1, 0.0)
            index.changed(f"quiet{i % 3}", 1 if i < 3 else 0, 1.0)
        assert [index.turns(k) for k in (0, 1, 50, 100, 1_000)] == [0, 4, 53, 103, 103]
        assert index.most() == ("flood", 100)
