"""How the controller splits a key's limits among routers, and leases the shares."""

from __future__ import annotations

import calendar
import math
import time

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.controller.leasebook import LeaseBook
from llmgw.controller.leases import fair_shares, period_end, period_start
from llmgw.runtime.clock import ManualClock
from llmgw.wire.keys import BudgetPeriod, ClientKey
from llmgw.wire.leases import KeyDemand, LeaseAnswer

SHA = "a" * 64


def key(**kw: object) -> ClientKey:
    return msgspec.convert({"name": "k", "sha256": SHA, **kw}, ClientKey)


def want(requests: float = 0.0, *, held: float | None = None, tokens: float = 0.0) -> KeyDemand:
    return KeyDemand(sha256=SHA, requests=requests, tokens=tokens, rpm_held=held, tpm_held=held)


def rpm(answer: LeaseAnswer) -> float:
    (lease,) = answer.leases
    assert lease.rpm is not None
    return lease.rpm


class TestFairShares:
    """Max-min fair by demand, with a floor, summing to the limit."""

    def test_one_router_gets_the_whole_limit(self) -> None:
        """Alone, a router holds all of it, whatever it asked for."""
        assert fair_shares(60, {"r1": 0.0}) == {"r1": 60.0}

    def test_no_routers_no_shares(self) -> None:
        """Nobody to lease to: nothing."""
        assert fair_shares(60, {}) == {}

    def test_skewed_demand_gets_what_it_asks_the_rest_split(self) -> None:
        """A router asking little gets its ask (above the floor); the busy ones split the rest."""
        got = fair_shares(100, {"a": 200.0, "b": 200.0, "c": 5.0}, floor_frac=0.3)
        # Floor 10 each; c wants nothing above it; a and b split the other 70.
        assert got == {"a": 45.0, "b": 45.0, "c": 10.0}

    def test_unwanted_capacity_is_split_evenly(self) -> None:
        """Demand below the limit: each gets its ask, and what is left goes evenly."""
        got = fair_shares(90, {"a": 30.0, "b": 0.0, "c": 0.0}, floor_frac=0.0)
        assert got == {"a": 50.0, "b": 20.0, "c": 20.0}

    def test_limit_smaller_than_routers_gives_fractions(self) -> None:
        """Two requests a minute over three routers: shares below one, summing to two."""
        got = fair_shares(2, {"a": 9.0, "b": 9.0, "c": 9.0})
        assert all(0 < s < 1 for s in got.values())
        assert math.isclose(sum(got.values()), 2.0)

    def test_zero_limit_gives_zero_shares(self) -> None:
        """Nothing to split (everything reserved for silent routers): every share is zero."""
        assert fair_shares(0, {"a": 5.0, "b": 1.0}) == {"a": 0.0, "b": 0.0}

    @given(
        limit=st.floats(min_value=0.001, max_value=1e9),
        wants=st.dictionaries(
            st.text(min_size=1, max_size=4), st.floats(min_value=0, max_value=1e10), max_size=8
        ),
    )
    def test_shares_never_sum_above_the_limit(self, limit: float, wants: dict[str, float]) -> None:
        """Whatever the demand, the shares add up to the limit or less, none negative."""
        got = fair_shares(limit, wants)
        assert set(got) == set(wants)
        assert sum(got.values()) <= limit
        assert all(s >= 0.0 for s in got.values())
        if wants:
            assert math.isclose(sum(got.values()), limit, rel_tol=1e-9)


class TestLeaseBook:
    """Grants that move capacity only once the previous holder let go of it."""

    def book(self, clock: ManualClock) -> LeaseBook:
        book = LeaseBook(clock=clock, lease_s=10.0, forget_s=30.0, floor_frac=0.0)
        # Past the controller's warm-up (it trusts no router holding more than it says).
        clock.advance(11.0)
        return book

    def test_one_router_holds_the_whole_limit(self) -> None:
        """A lone router is leased all of a key's rpm, and the answer carries the limits."""
        clock = ManualClock()
        answer = self.book(clock).report("r1", [want(10.0)], [key(rpm=60, tpm=1000)])
        assert answer.routers == 1
        assert answer.leases[0].rpm == 60.0
        assert (answer.leases[0].rpm_limit, answer.leases[0].tpm_limit) == (60, 1000)

    def test_a_new_router_waits_until_the_holder_lets_go(self) -> None:
        """A second router gets nothing while the first holds all; it does once the first
        has reported holding its smaller share."""
        clock, keys = ManualClock(), [key(rpm=60)]
        book = self.book(clock)
        assert rpm(book.report("r1", [want(60.0)], keys)) == 60.0
        assert rpm(book.report("r2", [want(60.0)], keys)) == 0.0
        # r1 is told 30 but still enforces 60 until its next report says otherwise.
        assert rpm(book.report("r1", [want(60.0, held=60.0)], keys)) == 30.0
        assert rpm(book.report("r2", [want(60.0, held=0.0)], keys)) == 0.0
        assert rpm(book.report("r1", [want(60.0, held=30.0)], keys)) == 30.0
        assert rpm(book.report("r2", [want(60.0, held=0.0)], keys)) == 30.0

    def test_grants_never_sum_above_the_limit(self) -> None:
        """Three routers with skewed demand reporting in turn: what is out stays under rpm."""
        clock, keys = ManualClock(), [key(rpm=100)]
        book = self.book(clock)
        held = {"a": 0.0, "b": 0.0, "c": 0.0}
        demand = {"a": 300.0, "b": 30.0, "c": 1.0}
        for _ in range(6):
            for r in held:
                granted = rpm(book.report(r, [want(demand[r], held=held[r])], keys))
                # What r enforces until its next report: the larger of old and new.
                assert sum(max(h, granted) if o == r else h for o, h in held.items()) <= 100.0
                held[r] = granted
        assert held["a"] > held["b"] > held["c"] > 0.0
        assert math.isclose(sum(held.values()), 100.0)

    def test_a_silent_router_keeps_its_share_until_forgotten(self) -> None:
        """A router cut off keeps its share reserved; after forget_s it goes to the others."""
        clock, keys = ManualClock(), [key(rpm=60)]
        book = self.book(clock)
        for r in ("r1", "r2"):
            book.report(r, [want(30.0)], keys)
        for r in ("r1", "r2"):
            assert rpm(book.report(r, [want(30.0, held=30.0)], keys)) == 30.0
        clock.advance(15.0)
        # r2 is silent past its lease: still reserved, r1 cannot take it.
        assert rpm(book.report("r1", [want(60.0, held=30.0)], keys)) == 30.0
        clock.advance(20.0)
        answer = book.report("r1", [want(60.0, held=30.0)], keys)
        assert (rpm(answer), answer.routers) == (60.0, 1)

    def test_after_a_controller_restart_no_router_gets_more_than_it_holds(self) -> None:
        """A fresh book trusts routers' held shares: for lease_s it grants none above them."""
        clock = ManualClock()
        book = LeaseBook(clock=clock, lease_s=10.0, forget_s=30.0, floor_frac=0.0)
        assert rpm(book.report("r1", [want(60.0, held=20.0)], [key(rpm=60)])) == 20.0
        assert rpm(book.report("r9", [want(60.0)], [key(rpm=60)])) == 0.0

    def test_a_revoked_key_leaves_the_book(self) -> None:
        """Keys no longer listed are answered no lease and forgotten."""
        clock = ManualClock()
        book = self.book(clock)
        book.report("r1", [want(5.0)], [key(rpm=60)])
        assert book.report("r1", [want(5.0)], []).leases == []
        assert book.held() == {"r1": {}}

    def test_keys_without_limits_get_no_lease(self) -> None:
        """A key with only a model list needs no share."""
        clock = ManualClock()
        assert self.book(clock).report("r1", [], [key(models=["m1"])]).leases == []


def budget(answer: LeaseAnswer) -> tuple[float | None, float | None]:
    (lease,) = answer.leases
    return lease.budget, lease.budget_left


class TestBudgetLeases:
    """Allowances of what is left of a budget, fleet-wide."""

    def book(self, clock: ManualClock) -> LeaseBook:
        book = LeaseBook(clock=clock, lease_s=10.0, forget_s=30.0, floor_frac=0.0)
        clock.advance(11.0)
        return book

    def test_what_the_fleet_spent_is_not_leased_again(self) -> None:
        """A lone router of a key that spent 400 of 1000 tokens may spend the other 600."""
        keys = [key(budget={"tokens": 1000, "per": "day"})]
        got = self.book(ManualClock()).report("r1", [want(tokens=50.0)], keys, {"k": 400})
        assert budget(got) == (600.0, 600.0)

    def test_a_spent_budget_leases_nothing(self) -> None:
        """Spent past the budget (requests in flight overshoot): nothing left, nothing leased."""
        keys = [key(budget={"tokens": 1000, "per": "day"})]
        got = self.book(ManualClock()).report("r1", [], keys, {"k": 1200})
        assert budget(got) == (0.0, 0.0)

    def test_allowances_never_sum_above_what_is_left(self) -> None:
        """Two routers spending in turn: the allowances out plus what was spent stay
        within the budget, and both end up with some."""
        keys = [key(budget={"tokens": 1000, "per": "day"})]
        book = self.book(ManualClock())
        spent, held = 0, {"a": 0.0, "b": 0.0}
        for _ in range(4):
            for r in held:
                d = KeyDemand(sha256=SHA, tokens=100.0, budget_held=held[r])
                grant, _ = budget(book.report(r, [d], keys, {"k": spent}))
                assert grant is not None
                out = sum(max(h, grant) if o == r else h for o, h in held.items())
                assert spent + out <= 1000
                # Each spends a tenth of what it was given before its next report.
                used = int(grant / 10)
                spent += used
                held[r] = grant - used
        assert min(held.values()) > 0


class TestPeriodStart:
    """Where a budget's period begins and ends, in UTC."""

    def test_day_week_and_month(self) -> None:
        """Wednesday 2026-12-09 15:30 UTC: that day, Monday the 7th, the 1st of December."""
        wall = 1_796_830_200.0
        assert time.strftime("%a %Y-%m-%d %H:%M", time.gmtime(wall)) == "Wed 2026-12-09 15:30"
        assert period_start("day", wall) == 1_796_774_400
        assert period_start("week", wall) == 1_796_774_400 - 2 * 86_400
        assert period_start("month", wall) == 1_796_774_400 - 8 * 86_400

    @pytest.mark.parametrize(
        ("per", "start", "end"),
        [
            ("day", "2026-12-09", "2026-12-10"),
            ("week", "2026-12-07", "2026-12-14"),
            ("month", "2026-12-01", "2027-01-01"),
            ("month", "2027-02-01", "2027-03-01"),
        ],
    )
    def test_a_period_ends_where_the_next_starts(
        self, per: BudgetPeriod, start: str, end: str
    ) -> None:
        """The end of a day, a week (from Monday) or a month is the next one's start."""
        day = calendar.timegm(time.strptime(start, "%Y-%m-%d"))
        assert calendar.timegm(time.strptime(end, "%Y-%m-%d")) == period_end(per, day)
        assert period_start(per, period_end(per, day)) == period_end(per, day)


def reference_grant(
    book: dict[str, tuple[KeyDemand | None, float]], live: set[str], me: str, limit: float
) -> float:
    """The hand-off rule of leasebook.py computed from scratch, for one key's rpm, the
    way the book computed it on every report before it kept running sums: over every
    router's (last report, granted), the silent ones' out reserved."""

    def out(r: str) -> float:
        d, granted = book[r]
        return max(granted, 0.0 if d is None or d.rpm_held is None else d.rpm_held)

    wants = dict.fromkeys(live, 0.0)
    for r in live:
        d = book[r][0]
        if d is not None:
            wants[r] = d.requests
    others = sum(out(r) for r in book if r != me)
    reserved = sum(out(r) for r in book if r != me and r not in live)
    target = fair_shares(max(0.0, limit - reserved), wants, floor_frac=0.0)
    return max(0.0, min(target.get(me, 0.0), limit - others))


class TestIncrementalLeaseBook:
    """Running sums and splits kept per key, made again only when something moved."""

    def book(self, clock: ManualClock, **kw: float) -> LeaseBook:
        book = LeaseBook(clock=clock, lease_s=10.0, forget_s=30.0, floor_frac=0.0, **kw)
        clock.advance(11.0)
        return book

    @given(
        steps=st.lists(
            st.tuples(
                st.sampled_from(["a", "b", "c"]),
                st.floats(min_value=0.0, max_value=300.0),
                st.floats(min_value=0.0, max_value=8.0),
            ),
            max_size=25,
        )
    )
    def test_split_made_at_every_move_grants_what_a_full_recount_grants(
        self, steps: list[tuple[str, float, float]]
    ) -> None:
        """With no slack and no gap, every answer equals the hand-off rule computed
        over every router from scratch, silent and forgotten routers included."""
        clock = ManualClock()
        book = self.book(clock, resplit_frac=0.0, resplit_gap_s=0.0)
        seen: dict[str, tuple[KeyDemand | None, float]] = {}
        last: dict[str, float] = {}
        held: dict[str, float] = {}
        for router, asked, wait_s in steps:
            clock.advance(wait_s)
            now = clock.monotonic()
            for gone in [r for r, at in last.items() if now - at > 30.0]:
                del seen[gone], last[gone], held[gone]
            d = want(asked, held=held.get(router))
            seen[router] = (d, seen.get(router, (None, 0.0))[1])
            last[router] = now
            live = {r for r, at in last.items() if now - at <= 10.0}
            expected = reference_grant(seen, live, router, 100.0)
            got = rpm(book.report(router, [d], [key(rpm=100)]))
            assert math.isclose(expected, got, rel_tol=1e-9, abs_tol=1e-9)
            seen[router] = (d, got)
            held[router] = got

    @given(
        steps=st.lists(
            st.tuples(
                st.sampled_from(["a", "b", "c"]),
                st.floats(min_value=0.0, max_value=300.0),
                st.floats(min_value=0.0, max_value=2.0),
            ),
            max_size=30,
        )
    )
    def test_what_routers_enforce_never_sums_above_the_limit(
        self, steps: list[tuple[str, float, float]]
    ) -> None:
        """With the default slack and gap (stale splits), routers reporting in any order
        with any asks, some silent past the lease, never enforce more than the limit."""
        clock = ManualClock()
        book = self.book(clock)
        enforced = {"a": 0.0, "b": 0.0, "c": 0.0}
        for router, asked, wait_s in steps:
            clock.advance(wait_s)
            d = want(asked, held=enforced[router])
            granted = rpm(book.report(router, [d], [key(rpm=100)]))
            # Until its next report it enforces the larger of old and new.
            enforced[router] = max(enforced[router], granted)
            assert sum(enforced.values()) <= 100.0 * (1 + 1e-12)
            enforced[router] = granted

    def converge(
        self,
        book: LeaseBook,
        clock: ManualClock,
        asks: dict[str, float],
        *,
        rounds: int = 4,
        step_s: float = 0.1,
    ) -> dict[str, float]:
        """Reports in turn, each router holding its last grant, until the grants settle."""
        got = dict.fromkeys(asks, 0.0)
        for _ in range(rounds):
            for r, a in asks.items():
                clock.advance(step_s)
                got[r] = rpm(book.report(r, [want(a, held=got[r])], [key(rpm=100)]))
        return got

    def test_a_small_move_waits_for_the_refresh(self) -> None:
        """An ask moving by less than resplit_frac of the limit leaves the split as made;
        after resplit_s it is made again and the shares follow."""
        clock = ManualClock()
        book = self.book(clock, resplit_frac=0.05, resplit_s=10.0)
        assert self.converge(book, clock, {"a": 30.0, "b": 200.0}) == {"a": 30.0, "b": 70.0}
        # a asks 33 (3 % of the limit): the split stands.
        assert self.converge(book, clock, {"a": 33.0, "b": 200.0}) == {"a": 30.0, "b": 70.0}
        # Reporting every 2 s (both stay live) for 16 s: past the refresh.
        got = self.converge(book, clock, {"a": 33.0, "b": 200.0}, rounds=8, step_s=1.0)
        assert got == {"a": 33.0, "b": 67.0}

    def test_a_large_move_is_taken_at_once(self) -> None:
        """An ask moving by more than resplit_frac of the limit remakes the split at its
        report: the shares follow within a round of reports."""
        clock = ManualClock()
        book = self.book(clock, resplit_frac=0.05, resplit_s=1000.0, resplit_gap_s=0.0)
        assert self.converge(book, clock, {"a": 30.0, "b": 200.0}) == {"a": 30.0, "b": 70.0}
        assert self.converge(book, clock, {"a": 60.0, "b": 200.0}) == {"a": 50.0, "b": 50.0}

    def test_a_split_is_made_at_most_once_a_gap(self) -> None:
        """Two large moves within resplit_gap_s: the second is taken once the gap passed."""
        clock = ManualClock()
        book = self.book(clock, resplit_s=1000.0, resplit_gap_s=5.0)
        keys = [key(rpm=100)]
        assert rpm(book.report("a", [want(10.0)], keys)) == 100.0
        clock.advance(1.0)
        # b joining remakes the split (a change of routers does not wait for the gap).
        assert rpm(book.report("b", [want(90.0)], keys)) == 0.0
        assert rpm(book.report("a", [want(10.0, held=100.0)], keys)) == 10.0
        assert rpm(book.report("a", [want(10.0, held=10.0)], keys)) == 10.0
        assert rpm(book.report("b", [want(90.0, held=0.0)], keys)) == 90.0
        # a now asks 50, within the gap: the split stands, b keeps its 90.
        clock.advance(1.0)
        assert rpm(book.report("a", [want(50.0, held=10.0)], keys)) == 10.0
        assert rpm(book.report("b", [want(90.0, held=90.0)], keys)) == 90.0
        # Past the gap it is made again: b lets go of 40, then a takes it.
        clock.advance(4.5)
        assert rpm(book.report("b", [want(90.0, held=90.0)], keys)) == 50.0
        assert rpm(book.report("b", [want(90.0, held=50.0)], keys)) == 50.0
        assert rpm(book.report("a", [want(50.0, held=10.0)], keys)) == 50.0

    def test_the_same_report_after_warming_gets_its_whole_share(self) -> None:
        """An answer capped while the book was warming is not given again after it."""
        clock = ManualClock()
        book = LeaseBook(clock=clock, lease_s=10.0, forget_s=30.0, floor_frac=0.0)
        report = [want(60.0, held=20.0)]
        clock.advance(5.0)
        assert rpm(book.report("r1", report, [key(rpm=60)])) == 20.0
        clock.advance(5.5)
        assert rpm(book.report("r1", report, [key(rpm=60)])) == 60.0

    def test_a_forgotten_router_leaves_every_sum(self) -> None:
        """Once a silent router is forgotten, its share is free in every key's split."""
        clock = ManualClock()
        book = self.book(clock)
        sha2 = "b" * 64
        keys = [key(rpm=60), msgspec.convert({"name": "k2", "sha256": sha2, "tpm": 600}, ClientKey)]
        both = [want(30.0, held=None, tokens=300.0), KeyDemand(sha256=sha2, tokens=300.0)]
        for r in ("r1", "r2", "r1", "r2"):
            book.report(r, both, keys)
        assert set(book.by_key()) == {SHA, sha2}
        clock.advance(31.0)
        answer = book.report("r1", [want(60.0, held=30.0, tokens=600.0)], keys)
        assert [(ls.rpm, ls.tpm) for ls in answer.leases] == [(60.0, None), (None, 600.0)]
        assert list(book.by_key()[SHA]) == ["r1"]
