"""The hold-or-refuse rule with the controller's outlook (holding.hold_until)."""

from __future__ import annotations

from llmgw.router.holding import REFUSED_DEMAND_S, Holding, hold_until
from llmgw.runtime.clock import ManualClock
from llmgw.wire.endpoints import ModelOutlook


def look(state: str) -> ModelOutlook:
    return ModelOutlook(models=("m",), state=state, reason="why")  # type: ignore[arg-type]


def test_no_replica_and_cannot_place_is_refused_now() -> None:
    assert hold_until([], now=1.0, deadline=31.0, opened={}, outlook=look("cannot_place")) is None


def test_no_replica_but_starting_or_making_room_is_held_to_the_deadline() -> None:
    for state in ("starting", "making_room"):
        assert hold_until([], now=1.0, deadline=31.0, opened={}, outlook=look(state)) == 31.0
    # Idle at zero (no outlook): held, which is the demand that makes the controller try.
    assert hold_until([], now=1.0, deadline=31.0, opened={}) == 31.0


def test_a_refused_request_stays_demand_for_a_while() -> None:
    clock = ManualClock()
    h = Holding(clock=clock)
    assert h.demand() == {}
    h.refused("m")
    assert h.demand() == {"m": 1}
    with h.hold("m"), h.hold("m"):
        assert h.demand() == {"m": 2}
    clock.advance(REFUSED_DEMAND_S + 0.1)
    assert h.demand() == {}
