"""What the router lets a client key do: allowlists, RPM, TPM, budgets, expiry."""

from __future__ import annotations

import json

import msgspec

from llmgw.router.http.answers import Whole
from llmgw.router.request.auth import KeyRing, hash_key
from llmgw.router.request.tenants import Charge, Tenant, Tenants, period_of
from llmgw.runtime.clock import ManualClock
from llmgw.wire.answerusage import Usage
from llmgw.wire.keys import ClientKey

DIGEST = "0" * 64


def tenant(**kw: object) -> Tenant:
    return Tenant(msgspec.convert({"name": "alice", "sha256": DIGEST, **kw}, ClientKey))


def usage(tokens: int) -> Usage:
    return Usage(prompt=tokens, completion=0, cached=0)


def error(resp: object) -> tuple[int, str, str]:
    assert isinstance(resp, Whole)
    assert isinstance(resp.body, bytes)
    err = json.loads(resp.body)["error"]
    return resp.status, err["type"], err["code"]


class TestUnguarded:
    """Keys that need no counting."""

    def test_plain_key_is_not_guarded(self) -> None:
        """A key with no list, limit or expiry skips admission altogether."""
        assert not tenant().guarded

    def test_allowlist_only_admits_without_a_charge(self) -> None:
        """A listed model passes with nothing to settle; another is 403 model_not_allowed."""
        t, tenants = tenant(models=["m1"]), Tenants(clock=ManualClock())
        assert t.guarded
        assert tenants.admit(t, "m1", 100) is None
        assert error(tenants.admit(t, "m2", 100)) == (
            403,
            "invalid_request_error",
            "model_not_allowed",
        )


class TestRpm:
    """Requests per minute."""

    def test_burst_then_refused_then_refilled(self) -> None:
        """A minute's requests pass at once, the next is 429 with Retry-After, later one passes."""
        clock = ManualClock()
        t, tenants = tenant(rpm=3), Tenants(clock=clock)
        charges = [tenants.admit(t, "m", 10) for _ in range(3)]
        assert all(isinstance(c, Charge) for c in charges)
        refused = tenants.admit(t, "m", 10)
        assert error(refused) == (429, "requests", "rate_limit_exceeded")
        assert isinstance(refused, Whole)
        assert refused.header("Retry-After") == "20"
        assert refused.header("x-ratelimit-remaining-requests") == "0"
        clock.advance(20.0)
        assert isinstance(tenants.admit(t, "m", 10), Charge)

    def test_headers_on_an_admitted_request(self) -> None:
        """An admitted request's charge carries the requests trio."""
        t, tenants = tenant(rpm=60), Tenants(clock=ManualClock())
        charge = tenants.admit(t, "m", 10)
        assert isinstance(charge, Charge)
        assert charge.headers == {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-reset-requests": "1s",
        }


class TestTpm:
    """Tokens per minute, estimated then settled."""

    def test_estimate_then_settle_with_the_engines_count(self) -> None:
        """The body's estimate is taken first; the engine's larger count is paid back."""
        clock = ManualClock()
        t, tenants = tenant(tpm=1000), Tenants(clock=clock)
        charge = tenants.admit(t, "m", 400)  # estimated 100 tokens
        assert isinstance(charge, Charge)
        assert charge.headers["x-ratelimit-remaining-tokens"] == "900"
        charge.settle(usage(950))
        charge.settle(usage(950))  # once only
        refused = tenants.admit(t, "m", 400)
        assert error(refused) == (429, "tokens", "rate_limit_exceeded")
        assert isinstance(refused, Whole)
        # 50 left, 100 needed at 1000/min: 3 s.
        assert refused.header("Retry-After") == "3"

    def test_counting_tokens_passes_an_overdrawn_bucket(self) -> None:
        """A request that costs no tokens (body 0: /tokenize, count_tokens) is not refused
        on tokens per minute, even with the bucket overdrawn by a long answer; it still
        takes its request (docs/tenants.md: "one request against RPM")."""
        t, tenants = tenant(tpm=1000, rpm=60), Tenants(clock=ManualClock())
        charge = tenants.admit(t, "m", 400)
        assert isinstance(charge, Charge)
        charge.settle(usage(3000))
        assert error(tenants.admit(t, "m", 400)) == (429, "tokens", "rate_limit_exceeded")
        free = tenants.admit(t, "m", 0)
        assert isinstance(free, Charge), free
        assert free.headers["x-ratelimit-remaining-requests"] == "58"

    def test_a_request_larger_than_the_bucket_waits_for_a_full_one(self) -> None:
        """A body estimated above the whole minute still passes on a full bucket."""
        t, tenants = tenant(tpm=10), Tenants(clock=ManualClock())
        assert isinstance(tenants.admit(t, "m", 4000), Charge)


class TestResetFormat:
    """The x-ratelimit-reset-* headers in OpenAI's duration format."""

    def test_a_reset_past_an_hour_names_its_hours(self) -> None:
        """A bucket an answer overdrew by 99,000 tokens, at 1,000 a minute, is full again
        in 6,000 s: `1h40m0s`, as OpenAI (Go's durations) writes it, not `100m0s`."""
        t, tenants = tenant(tpm=1000), Tenants(clock=ManualClock())
        charge = tenants.admit(t, "m", 400)  # estimated 100 tokens
        assert isinstance(charge, Charge)
        charge.settle(usage(100_000))
        refused = tenants.admit(t, "m", 400)
        assert isinstance(refused, Whole)
        assert refused.header("x-ratelimit-reset-tokens") == "1h40m0s"
        assert refused.header("Retry-After") == "5946"


class TestRefund:
    """A charge given back: the request reached no engine."""

    def test_refund_gives_back_the_request_and_estimate_once(self) -> None:
        """The buckets get their request and estimate back, never past full, and once."""
        t, tenants = tenant(rpm=2, tpm=1000), Tenants(clock=ManualClock())
        charge = tenants.admit(t, "m", 400)
        assert isinstance(charge, Charge)
        charge.refund()
        charge.refund()
        charge.settle(usage(900))  # settled already: nothing more
        assert charge.headers["x-ratelimit-remaining-requests"] == "2"
        assert charge.headers["x-ratelimit-remaining-tokens"] == "1000"


class TestBudget:
    """Token budgets per calendar period."""

    def test_spent_budget_is_insufficient_quota_until_the_next_period(self) -> None:
        """Usage past the budget refuses with 429 insufficient_quota; a new day starts afresh."""
        clock = ManualClock(start_wall=1_800_000_000.0)
        t = tenant(budget={"tokens": 100, "per": "day"})
        tenants = Tenants(clock=clock)
        charge = tenants.admit(t, "m", 8)
        assert isinstance(charge, Charge)
        charge.settle(usage(100))
        assert error(tenants.admit(t, "m", 8)) == (429, "insufficient_quota", "insufficient_quota")
        clock.advance(86400.0)
        assert isinstance(tenants.admit(t, "m", 8), Charge)

    def test_periods(self) -> None:
        """Day, ISO week and month in UTC."""
        wall = 1_796_601_600.0  # 2026-12-07 00:00 UTC, a Monday
        assert [period_of(p, wall) for p in ("day", "week", "month")] == [  # type: ignore[arg-type]
            "2026-12-07",
            "2026-W50",
            "2026-12",
        ]


class TestKeyRingAndCounts:
    """The ring's expiry and the counts across list updates."""

    def test_expired_key_is_refused_like_an_unknown_one(self) -> None:
        """A key past expires_at is None from the ring."""
        clock = ManualClock(start_wall=1000.0)
        key = ClientKey(name="a", sha256=hash_key("k"), expires_at=1010.0)
        ring = KeyRing([key], clock=clock)
        assert ring.check("Bearer k") is not None
        clock.advance(10.0)
        assert ring.check("Bearer k") is None

    def test_counts_survive_a_new_list_and_go_with_a_revoke(self) -> None:
        """The same key in a new list keeps its counts; a key dropped from it loses them."""
        key = ClientKey(name="a", sha256=DIGEST, rpm=1)
        tenants = Tenants(clock=ManualClock())
        assert isinstance(tenants.admit(Tenant(key), "m", 1), Charge)
        tenants.retain([key])
        assert isinstance(tenants.admit(Tenant(key), "m", 1), Whole)
        tenants.retain([])
        assert isinstance(tenants.admit(Tenant(key), "m", 1), Charge)


class TestLimitsChanged:
    """A key whose limits change (a reload, the controller's list) keeps what it spent."""

    def test_a_lower_rpm_keeps_the_spent_budget(self) -> None:
        """Lowering a key's RPM leaves its spent budget spent: its counts were started
        afresh, so the stricter file gave the key a whole new budget."""
        clock = ManualClock(start_wall=1_800_000_000.0)
        tenants = Tenants(clock=clock)
        charge = tenants.admit(tenant(rpm=10, budget={"tokens": 100, "per": "day"}), "m", 8)
        assert isinstance(charge, Charge)
        charge.settle(usage(100))
        new = tenant(rpm=5, budget={"tokens": 100, "per": "day"})
        got = error(tenants.admit(new, "m", 8))
        assert got == (429, "insufficient_quota", "insufficient_quota")

    def test_a_lower_rpm_keeps_the_minute_spent(self) -> None:
        """A key that spent its minute and has its RPM lowered is still refused, not
        handed a full bucket of the new size."""
        tenants = Tenants(clock=ManualClock())
        for _ in range(10):
            assert isinstance(tenants.admit(tenant(rpm=10), "m", 8), Charge)
        assert error(tenants.admit(tenant(rpm=5), "m", 8))[2] == "rate_limit_exceeded"

    def test_a_request_in_flight_settles_into_the_changed_account(self) -> None:
        """The tokens of a request admitted before the change count after it."""
        clock = ManualClock(start_wall=1_800_000_000.0)
        tenants = Tenants(clock=clock)
        charge = tenants.admit(tenant(budget={"tokens": 100, "per": "day"}), "m", 8)
        assert isinstance(charge, Charge)
        new = tenant(rpm=60, budget={"tokens": 100, "per": "day"})
        assert isinstance(tenants.admit(new, "m", 8), Charge)
        charge.settle(usage(100))
        assert error(tenants.admit(new, "m", 8))[1] == "insufficient_quota"
