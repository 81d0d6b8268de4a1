"""The hold-or-refuse rule with the controller's outlook (holding.hold_until)."""

from __future__ import annotations

import math

import pytest

from llmgw.router.request.holding import (
    REFUSED_DEMAND_S,
    UNPLACEABLE_RETRY_DEFAULT_S,
    UNPLACEABLE_RETRY_MAX_S,
    Holding,
    held_too_long,
    hold_until,
    unplaceable_retry_after_s,
)
from llmgw.runtime.clock import ManualClock
from llmgw.wire.endpoints import ModelOutlook


def look(state: str) -> ModelOutlook:
    return ModelOutlook(models=("m",), state=state, reason="why")  # type: ignore[arg-type]


class TestHoldUntilOutlook:
    """The hold-or-refuse rule follows the controller's outlook."""

    def test_no_replica_and_cannot_place_is_refused_now(self) -> None:
        """No replica and cannot place is refused now."""
        assert (
            hold_until([], now=1.0, deadline=31.0, opened={}, outlook=look("cannot_place")) is None
        )

    def test_no_replica_but_starting_or_making_room_is_held_to_the_deadline(self) -> None:
        """No replica but starting or making room is held to the deadline."""
        for state in ("starting", "making_room"):
            assert hold_until([], now=1.0, deadline=31.0, opened={}, outlook=look(state)) == 31.0
        # Idle at zero (no outlook): held, which is the demand that makes the controller try.
        assert hold_until([], now=1.0, deadline=31.0, opened={}) == 31.0

    def test_a_refused_request_stays_demand_for_a_while(self) -> None:
        """A refused request stays demand for a while."""
        clock = ManualClock()
        h = Holding(clock=clock)
        assert h.demand() == {}
        h.refused("m")
        assert h.demand() == {"m": 1}
        with h.hold("m"), h.hold("m"):
            assert h.demand() == {"m": 2}
        clock.advance(REFUSED_DEMAND_S + 0.1)
        assert h.demand() == {}

    @pytest.mark.parametrize(
        ("said", "retry"),
        [
            (420.0, UNPLACEABLE_RETRY_MAX_S),  # 7 min: capped, capacity may come back sooner
            (120.0, 120),
            (9.2, 10),  # rounded up: never before the controller's moment
            (0.0, 1),
            (-5.0, 1),
            (None, UNPLACEABLE_RETRY_DEFAULT_S),  # the controller gave no time
            (math.inf, UNPLACEABLE_RETRY_DEFAULT_S),
        ],
    )
    def test_retry_after_of_a_refusal_follows_the_controller_within_bounds(
        self, said: float | None, retry: int
    ) -> None:
        """Retry-After is the outlook's retry_after_s, rounded up and kept within 1..300 s."""
        look = ModelOutlook(models=("m",), state="cannot_place", reason="why", retry_after_s=said)
        assert unplaceable_retry_after_s(look) == retry

    def test_a_hold_that_times_out_says_what_the_controller_said(self) -> None:
        """A start longer than the hold: the 503 names the controller's reason."""
        starting = ModelOutlook(
            models=("m",), state="starting", reason="a replica is starting; starts take about 3 min"
        )
        assert held_too_long(120.0, starting) == (
            "none became available within 120s "
            "(the controller: a replica is starting; starts take about 3 min)"
        )
        assert held_too_long(120.0, None) == "none became available within 120s"
