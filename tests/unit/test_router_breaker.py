"""Circuit breaker and failure classification."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.router.replicas.breaker import (
    Breaker,
    BreakerConfig,
    BreakerState,
    Outcome,
    classify_status,
)
from llmgw.testing import ManualClock

CFG = BreakerConfig(failure_threshold=3, cooldown_s=10.0, max_cooldown_s=35.0)


def opened(clock: ManualClock, cfg: BreakerConfig = CFG) -> Breaker:
    b = Breaker(cfg, clock=clock)
    for _ in range(cfg.failure_threshold):
        b.failure()
    return b


class TestBreaker:
    """The circuit breaker's states, probes and cooldowns."""

    def test_starts_closed_and_allows(self) -> None:
        """A new breaker is closed and admits requests."""
        b = Breaker(CFG, clock=ManualClock())
        assert (b.state(), b.allow()) == (BreakerState.CLOSED, True)

    def test_opens_after_consecutive_failures(self) -> None:
        """The threshold-th consecutive failure opens it, and it refuses."""
        b = Breaker(CFG, clock=ManualClock())
        b.failure()
        b.failure()
        assert b.state() is BreakerState.CLOSED
        b.failure()
        assert (b.state(), b.allow(), b.opened_total) == (BreakerState.OPEN, False, 1)

    def test_success_resets_the_consecutive_count(self) -> None:
        """Failures must be consecutive: one success in between starts over."""
        b = Breaker(CFG, clock=ManualClock())
        for _ in range(2):
            b.failure()
        b.success()
        for _ in range(2):
            b.failure()
        assert b.state() is BreakerState.CLOSED

    def test_state_reads_half_open_after_cooldown_without_side_effects(self) -> None:
        """state() reports half-open once cooled down, and reading it twice changes nothing."""
        clock = ManualClock()
        b = opened(clock)
        clock.advance(9.9)
        assert b.state() is BreakerState.OPEN
        clock.advance(0.1)
        assert [b.state(), b.state()] == [BreakerState.HALF_OPEN] * 2
        assert b.allow()  # the probe is still there: state() did not take it

    def test_half_open_admits_exactly_one_probe(self) -> None:
        """Half-open lets one request through and refuses the rest until it reports."""
        clock = ManualClock()
        b = opened(clock)
        clock.advance(10)
        assert [b.allow(), b.allow(), b.allow()] == [True, False, False]

    def test_probe_success_closes(self) -> None:
        """A successful probe closes the breaker and resets the cooldown."""
        clock = ManualClock()
        b = opened(clock)
        clock.advance(10)
        b.allow()
        b.success()
        assert (b.state(), b.cooldown_s) == (BreakerState.CLOSED, 10.0)

    def test_cooldown_doubles_while_failures_continue_capped(self) -> None:
        """Each failed probe doubles the cooldown, up to max_cooldown_s."""
        clock = ManualClock()
        b = opened(clock)
        seen = []
        for _ in range(4):
            clock.advance(b.cooldown_s)
            assert b.allow()
            b.failure()
            seen.append(b.cooldown_s)
        assert seen == [20.0, 35.0, 35.0, 35.0]
        assert b.opened_total == 5

    def test_reopened_breaker_waits_the_doubled_cooldown(self) -> None:
        """After a failed probe, the next probe waits the new, longer cooldown."""
        clock = ManualClock()
        b = opened(clock)
        clock.advance(10)
        b.allow()
        b.failure()
        clock.advance(19)
        assert (b.state(), b.allow()) == (BreakerState.OPEN, False)
        clock.advance(1)
        assert b.allow()

    def test_failures_while_open_do_not_extend_the_cooldown(self) -> None:
        """Stragglers admitted before opening that fail later do not push the probe back."""
        clock = ManualClock()
        b = opened(clock)
        clock.advance(5)
        b.failure()
        clock.advance(5)
        assert (b.cooldown_s, b.allow()) == (10.0, True)

    def test_abandoned_probe_lets_the_next_request_probe(self) -> None:
        """A probe that ends without a verdict gives the probe slot back."""
        clock = ManualClock()
        b = opened(clock)
        clock.advance(10)
        assert b.allow()
        b.record(Outcome.ABANDONED, probe=True)
        assert (b.state(), b.allow()) == (BreakerState.HALF_OPEN, True)

    def test_abandoned_non_probe_changes_nothing(self) -> None:
        """An abandoned request that was not the probe is no evidence either way."""
        clock = ManualClock()
        b = opened(clock)
        clock.advance(10)
        assert b.allow()
        b.record(Outcome.ABANDONED)
        assert not b.allow()

    def test_client_error_counts_as_success(self) -> None:
        """A request-caused 4xx means the endpoint answered: it closes a half-open breaker."""
        clock = ManualClock()
        b = opened(clock)
        clock.advance(10)
        b.allow()
        b.record(Outcome.CLIENT_ERROR)
        assert b.state() is BreakerState.CLOSED

    @given(st.lists(st.sampled_from(["allow", "ok", "fail", "abandon", "tick"]), max_size=60))
    def test_never_admits_two_probes_per_half_open_period(self, ops: list[str]) -> None:
        """Whatever happens, at most one request is admitted between entering half-open
        and the next verdict."""
        clock = ManualClock()
        b = Breaker(
            BreakerConfig(failure_threshold=2, cooldown_s=1.0, max_cooldown_s=4.0), clock=clock
        )
        probes_out = 0
        for op in ops:
            if op == "tick":
                clock.advance(1.5)
            elif op == "allow":
                was = b.state()
                if b.allow() and was is BreakerState.HALF_OPEN:
                    probes_out += 1
                    assert probes_out == 1
            else:
                b.record(
                    {"ok": Outcome.OK, "fail": Outcome.ENDPOINT_FAILURE}.get(op, Outcome.ABANDONED),
                    probe=probes_out > 0,
                )
                probes_out = 0

    def test_admits_reads_no_while_the_probe_is_out(self) -> None:
        """Half-open with its probe taken, it reads half-open but admits no one."""
        clock = ManualClock()
        b = opened(clock)
        clock.advance(10)
        assert (b.admits(), b.allow()) == (True, True)
        assert (b.state(), b.admits(), b.allow()) == (BreakerState.HALF_OPEN, False, False)

    @given(st.lists(st.sampled_from(["allow", "ok", "fail", "abandon", "tick"]), max_size=60))
    def test_admits_foretells_allow(self, ops: list[str]) -> None:
        """Whatever happened before, `admits()` says what the next `allow()` answers."""
        clock = ManualClock()
        b = Breaker(
            BreakerConfig(failure_threshold=2, cooldown_s=1.0, max_cooldown_s=4.0), clock=clock
        )
        for op in ops:
            if op == "tick":
                clock.advance(1.5)
            elif op == "allow":
                assert b.admits() == b.allow()
            else:
                outcome = {"ok": Outcome.OK, "fail": Outcome.ENDPOINT_FAILURE}.get(op)
                b.record(outcome or Outcome.ABANDONED, probe=True)


class TestClassifyStatus:
    """Which answer statuses count as the endpoint's failure."""

    @pytest.mark.parametrize("status", [200, 201, 204, 301, 304])
    def test_success_statuses_are_ok(self, status: int) -> None:
        """2xx and 3xx are the endpoint answering."""
        assert Outcome.OK is classify_status(status)

    @pytest.mark.parametrize("status", [400, 404, 409, 413, 415, 422])
    def test_request_caused_4xx_is_not_the_endpoints_failure(self, status: int) -> None:
        """Bad input, unknown model, too long a prompt: every replica would say the same."""
        assert Outcome.CLIENT_ERROR is classify_status(status)

    @pytest.mark.parametrize("status", [408, 429, 424, 401, 403, 500, 502, 503, 504])
    def test_overload_timeout_and_5xx_are_endpoint_failures(self, status: int) -> None:
        """Timeouts, overload, server errors and a replica refusing the router count."""
        assert Outcome.ENDPOINT_FAILURE is classify_status(status)
