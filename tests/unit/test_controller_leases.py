"""How the controller splits a key's limits among routers, and leases the shares."""

from __future__ import annotations

import math
import time

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from llmgw.controller.leasebook import LeaseBook
from llmgw.controller.leases import fair_shares, period_start
from llmgw.runtime.clock import ManualClock
from llmgw.wire.keys import ClientKey
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
    """Where a budget's period begins, in UTC."""

    def test_day_week_and_month(self) -> None:
        """Wednesday 2026-12-09 15:30 UTC: that day, Monday the 7th, the 1st of December."""
        wall = 1_796_830_200.0
        assert time.strftime("%a %Y-%m-%d %H:%M", time.gmtime(wall)) == "Wed 2026-12-09 15:30"
        assert period_start("day", wall) == 1_796_774_400
        assert period_start("week", wall) == 1_796_774_400 - 2 * 86_400
        assert period_start("month", wall) == 1_796_774_400 - 8 * 86_400
