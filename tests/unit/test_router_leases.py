"""A router's lease of limited keys: the demand it reports, the shares it enforces."""

from __future__ import annotations

import json
import math

import msgspec

from llmgw.router.control.leases import DEMAND_TAU_S, LeaseKeeper, add_demand
from llmgw.router.http.answers import Whole
from llmgw.router.request.tenants import Charge, Tenant, Tenants
from llmgw.runtime.clock import ManualClock
from llmgw.wire.answerusage import Usage
from llmgw.wire.keys import ClientKey
from llmgw.wire.leases import KeyDemand, KeyLease, LeaseAnswer

SHA = "b" * 64
FILE_SHA = "c" * 64


def key(sha: str = SHA, **kw: object) -> ClientKey:
    return msgspec.convert({"name": "k", "sha256": sha, "rpm": 60, **kw}, ClientKey)


def answer(rpm: float, *, routers: int = 3, lease_s: float = 10.0) -> LeaseAnswer:
    lease = KeyLease(sha256=SHA, rpm=rpm, rpm_limit=60)
    return LeaseAnswer(leases=[lease], lease_s=lease_s, routers=routers)


def admitted(tenants: Tenants, k: ClientKey, n: int) -> int:
    t = Tenant(k)
    return sum(isinstance(tenants.admit(t, "m", 40), Charge) for _ in range(n))


def leased(clock: ManualClock, share: float) -> tuple[Tenants, LeaseKeeper]:
    tenants, keeper = Tenants(clock=clock), LeaseKeeper(clock=clock)
    tenants.retain([key()], leased=[key()])
    tenants.leasing = True
    keeper.answer(answer(share))
    tenants.reshare(dict(keeper.shares()))
    return tenants, keeper


class TestShares:
    """What Tenants enforces of a leased key."""

    def test_no_share_yet_is_429_with_a_retry(self) -> None:
        """Before the controller's first answer a leased key is refused, never unlimited."""
        tenants = Tenants(clock=ManualClock())
        tenants.retain([key()], leased=[key()])
        resp = tenants.admit(Tenant(key()), "m", 40)
        assert isinstance(resp, Whole)
        assert resp.status == 429
        assert resp.header("Retry-After") == "2"
        assert resp.body is not None
        assert json.loads(resp.body)["error"]["code"] == "rate_limit_exceeded"

    def test_the_share_is_the_bucket(self) -> None:
        """A share of 10 rpm admits 10 at once and then one every six seconds."""
        clock = ManualClock()
        tenants, _ = leased(clock, 10.0)
        assert admitted(tenants, key(), 20) == 10
        clock.advance(6.0)
        assert admitted(tenants, key(), 5) == 1

    def test_headers_show_the_whole_limit(self) -> None:
        """x-ratelimit-limit-requests is the key's limit, not this router's share."""
        tenants, _ = leased(ManualClock(), 10.0)
        got = tenants.admit(Tenant(key()), "m", 40)
        assert isinstance(got, Charge)
        assert got.headers["x-ratelimit-limit-requests"] == "60"
        assert got.headers["x-ratelimit-remaining-requests"] == "9"

    def test_a_smaller_share_spills_a_larger_fills_at_its_rate(self) -> None:
        """Shrinking empties what the new bucket cannot hold; growing adds no burst."""
        clock = ManualClock()
        tenants, _ = leased(clock, 30.0)
        tenants.reshare({SHA: (5.0, 0.0)})
        assert admitted(tenants, key(), 20) == 5
        tenants.reshare({SHA: (60.0, 0.0)})
        assert admitted(tenants, key(), 5) == 0
        clock.advance(1.0)
        assert admitted(tenants, key(), 5) == 1

    def test_a_share_below_one_still_admits_at_its_rate(self) -> None:
        """Half a request a minute: nothing at first, one after two minutes."""
        clock = ManualClock()
        tenants, _ = leased(clock, 0.5)
        assert admitted(tenants, key(), 3) == 0
        clock.advance(120.0)
        assert admitted(tenants, key(), 3) == 1

    def test_file_keys_and_old_controllers_enforce_the_whole_limit(self) -> None:
        """A key from the router's file is not leased; nor is any once the controller
        answers without leases."""
        clock = ManualClock()
        tenants = Tenants(clock=clock)
        tenants.retain([key(), key(FILE_SHA)], leased=[key()])
        assert admitted(tenants, key(FILE_SHA), 70) == 60
        tenants.leasing = False
        assert admitted(tenants, key(), 70) == 60

    def test_a_key_counted_before_an_answer_without_leases_gets_its_whole_limit(self) -> None:
        """A key asked of before the first answer (no share yet, refused) is enforced at its
        whole limit once the controller answers without leases, refilling at its rate from
        where its count stood: it kept the share of zero, which never refills, and was
        refused for good."""
        clock = ManualClock()
        tenants, keeper = Tenants(clock=clock), LeaseKeeper(clock=clock)
        tenants.retain([key()], leased=[key()])
        assert admitted(tenants, key(), 1) == 0
        shares = keeper.answer(None)
        tenants.leasing = keeper.leasing
        tenants.reshare(dict(shares))
        clock.advance(60.0)
        assert admitted(tenants, key(), 70) == 60


def budgeted() -> ClientKey:
    return msgspec.convert(
        {"name": "k", "sha256": SHA, "budget": {"tokens": 1000, "per": "day"}}, ClientKey
    )


def spend(tenants: Tenants, tokens: int) -> object:
    got = tenants.admit(Tenant(budgeted()), "m", 40)
    if isinstance(got, Charge):
        got.settle(Usage(prompt=tokens, completion=0, cached=0))
    return got


def code(resp: object) -> str:
    assert isinstance(resp, Whole)
    assert resp.body is not None
    return str(json.loads(resp.body)["error"]["code"])


class TestBudgetAllowance:
    """A leased budget: this router spends its allowance, no more."""

    def tenants(self) -> Tenants:
        tenants = Tenants(clock=ManualClock())
        tenants.retain([budgeted()], leased=[budgeted()])
        tenants.leasing = True
        return tenants

    def test_no_allowance_yet_is_a_retry_not_a_spent_budget(self) -> None:
        """Before the first lease: 429 rate_limit_exceeded, never insufficient_quota."""
        assert code(spend(self.tenants(), 10)) == "rate_limit_exceeded"

    def test_allowance_spent_here_but_not_elsewhere_is_a_retry(self) -> None:
        """100 tokens here, more held elsewhere: once 100 are spent, retry (rate limit)."""
        tenants = self.tenants()
        tenants.reallow({SHA: (100.0, 500.0)})
        assert isinstance(spend(tenants, 60), Charge)
        assert isinstance(spend(tenants, 60), Charge)
        assert code(spend(tenants, 60)) == "rate_limit_exceeded"

    def test_allowance_spent_everywhere_is_insufficient_quota(self) -> None:
        """Nothing left elsewhere either: the budget is spent."""
        tenants = self.tenants()
        tenants.reallow({SHA: (50.0, 0.0)})
        assert isinstance(spend(tenants, 60), Charge)
        assert code(spend(tenants, 1)) == "insufficient_quota"

    def test_a_new_allowance_counts_from_the_report(self) -> None:
        """Tokens spent after the report was built come off the allowance it answered."""
        tenants = self.tenants()
        tenants.reallow({SHA: (500.0, 0.0)})
        spend(tenants, 10)
        assert tenants.asked()[SHA][2] == 490.0
        spend(tenants, 70)
        tenants.reallow({SHA: (100.0, 0.0)})
        assert tenants.asked()[SHA][2] == 30.0


class TestKeeper:
    """Demand out, leases in, the fallback once a lease runs out."""

    def test_demand_is_smoothed_per_minute_and_says_what_is_held(self) -> None:
        """Ten requests in a 2 s report are 300 a minute, smoothed from zero over DEMAND_TAU_S."""
        clock = ManualClock()
        keeper = LeaseKeeper(clock=clock)
        keeper.answer(answer(12.0))
        clock.advance(2.0)
        (d,) = keeper.demand({SHA: (10, 400, None)})
        weight = 1.0 - math.exp(-2.0 / DEMAND_TAU_S)
        assert math.isclose(d.requests, 300.0 * weight, rel_tol=1e-5)
        assert math.isclose(d.tokens, 12_000.0 * weight, rel_tol=1e-5)
        assert d.rpm_held == 12.0

    def test_a_cut_off_router_keeps_its_share_then_falls_back(self) -> None:
        """Within the lease nothing changes; after it min(share, limit / routers)."""
        clock = ManualClock()
        _, keeper = leased(clock, 40.0)
        clock.advance(9.0)
        assert keeper.expire() is None
        clock.advance(2.0)
        assert keeper.expire() == {SHA: (20.0, 0.0)}
        assert keeper.expire() is None
        # A small share stays as it is: the fallback never raises one.
        keeper.answer(answer(5.0))
        clock.advance(11.0)
        assert keeper.expire() == {SHA: (5.0, 0.0)}

    def test_workers_share_the_rate_and_the_budget(self) -> None:
        """Each worker takes the router's whole share and allowance (spent from the row
        they share, test_router_keytable.py), and their demands add up."""
        keeper = LeaseKeeper(clock=ManualClock())
        assert keeper.answer(answer(40.0)) == {SHA: (40.0, 0.0)}
        budget = KeyLease(sha256=SHA, rpm=40.0, rpm_limit=60, budget=800.0, budget_left=1000.0)
        keeper.answer(LeaseAnswer(leases=[budget], lease_s=10.0, routers=3))
        assert keeper.allowances() == {SHA: (800.0, 200.0)}
        a = KeyDemand(sha256=SHA, requests=1.0, tokens=2.0, rpm_held=40.0, budget_held=5.0)
        b = KeyDemand(sha256=SHA, requests=3.0, tokens=4.0, rpm_held=40.0, budget_held=7.0)
        assert add_demand(a, b) == KeyDemand(
            sha256=SHA, requests=4.0, tokens=6.0, rpm_held=40.0, budget_held=12.0
        )

    def test_a_controller_without_leases_turns_leasing_off(self) -> None:
        """An answer without a body (a controller from before leases): no shares, no leasing."""
        keeper = LeaseKeeper(clock=ManualClock())
        assert keeper.answer(None) == {}
        assert keeper.leasing is False
