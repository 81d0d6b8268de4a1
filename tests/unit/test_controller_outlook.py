"""The outlook routers read for models with no ready replica: its state, reason text and times."""

from __future__ import annotations

import dataclasses

import pytest

from llmgw.controller.fleet.endpoints import CANNOT_PLACE_RETRY_S, coarse_s, outlook, say_s
from llmgw.controller.fleet.starts import StartHistory
from llmgw.controller.placement.requests import ETA_REFRESH_S
from llmgw.wire.endpoints import ModelOutlook
from tests.unit.controller_reconcile_world import World, spec


def look(w: World, name: str, starts: StartHistory | None = None) -> ModelOutlook:
    mem = w.memory
    found = [
        o
        for o in outlook(
            w.state,
            w.index,
            unplaceable={n: u.reason for n, u in mem.unplaceable.items()},
            evicting=mem.evicting,
            lasting={n for n, u in mem.unplaceable.items() if u.lasting},
            now=w.now,
            idle_enough_at=mem.idle_enough_at,
            starts=starts,
        )
        if o.models[0] == name
    ]
    assert len(found) == 1, found
    return found[0]


def _full(*, x_min: int = 0, idle_s: float | None = 180.0) -> tuple[World, str]:
    """Node a (8 cards) is full with x (idle `idle_s` of its 600 s timeout); big is asked for."""
    w = World()
    w.node("a")
    w.model(spec("x", gpus_per_node=8, min_replicas=x_min), desired=1)
    w.tick()
    w.ready_all()
    x = w.only("x").id
    if idle_s is not None:
        w.report(last_used={x: w.now - idle_s}, inflight={x: 0})
    w.model(spec("big", gpus_per_node=8, min_replicas=0))
    w.report(demand={"big": 1})
    w.tick()
    return w, x


class TestCannotPlace:
    """The outlook for a model that cannot be placed yet, and when room is expected."""

    def test_says_when_the_first_candidate_is_idle_enough(self) -> None:
        """x idle 3 of its 10 min: the reason says 7 min, and so does retry_after_s."""
        w, _ = _full()
        o = look(w, "big")
        assert o.state == "cannot_place"
        assert o.reason.startswith("needs 8 free H100-80G GPUs")
        assert o.reason.endswith(
            "; nothing idle long enough to evict; the first candidate is idle enough in "
            "7 min (if unused until then)"
        )
        assert o.retry_after_s == 420.0

    def test_the_time_counts_down_and_then_the_eviction_starts(self) -> None:
        """Later ticks say less time; once x is idle enough it is evicted (making room)."""
        w, x = _full()
        w.clock.advance(300.0)
        w.touch("a")
        w.report(demand={"big": 1})
        w.tick()
        assert look(w, "big").retry_after_s == 120.0
        assert "idle enough in 2 min" in look(w, "big").reason
        w.clock.advance(121.0)
        w.touch("a")
        w.report(demand={"big": 1})
        w.tick()
        assert w.state.replicas[x].state == "draining"
        assert look(w, "big").state == "making_room"
        assert "big" not in w.memory.idle_enough_at

    def test_the_time_is_worked_out_again_only_every_refresh(self) -> None:
        """x used again: the time stays until the refresh, then says the full timeout."""
        w, x = _full()
        w.report(last_used={x: w.now}, inflight={x: 0})
        w.report(demand={"big": 1})
        w.tick()
        assert look(w, "big").retry_after_s == 420.0  # a few plans a tick is too dear
        w.clock.advance(ETA_REFRESH_S)
        w.touch("a")
        w.report(demand={"big": 1})
        w.tick()
        assert look(w, "big").retry_after_s == coarse_s(600.0 - ETA_REFRESH_S)

    def test_unknown_idleness_gives_no_time(self) -> None:
        """No router reported x: waiting would not help, so no time is promised."""
        w, _ = _full(idle_s=None)
        o = look(w, "big")
        assert o.reason.endswith("; nothing can be evicted for it now")
        assert o.retry_after_s == CANNOT_PLACE_RETRY_S

    def test_a_replica_kept_by_min_replicas_gives_no_time(self) -> None:
        """x at its min_replicas is never evicted, however idle it becomes."""
        w, _ = _full(x_min=1)
        assert look(w, "big").reason.endswith("nothing can be evicted for it now")
        assert w.memory.idle_enough_at == {}

    def test_a_higher_priority_replica_gives_no_time(self) -> None:
        """Eviction never takes a higher priority: no time either."""
        w = World()
        w.node("a")
        w.model(spec("x", gpus_per_node=8, min_replicas=0, priority=9), desired=1)
        w.tick()
        w.ready_all()
        x = w.only("x").id
        w.report(last_used={x: w.now - 100}, inflight={x: 0})
        w.model(spec("big", gpus_per_node=8, min_replicas=0, priority=1))
        w.report(demand={"big": 1})
        w.tick()
        assert look(w, "big").retry_after_s == CANNOT_PLACE_RETRY_S


class TestNeverFits:
    """A model no node or fabric of the fleet could ever hold: no eviction, no wait."""

    @pytest.mark.parametrize(
        ("kw", "starts"),
        [
            ({"gpus_per_node": 16}, "needs 16 H100-80G GPUs on one node"),
            ({"gpu_classes": ("L40S",)}, "no node has GPU class L40S"),
        ],
    )
    def test_says_so_and_plans_no_eviction(self, kw: dict[str, object], starts: str) -> None:
        """The reason says nothing frees room for it, and no eviction is planned."""
        w, x = _full()
        w.model(spec("huge", min_replicas=0, **kw))  # type: ignore[arg-type]
        w.report(demand={"huge": 1})
        w.tick()
        o = look(w, "huge")
        assert o.state == "cannot_place"
        assert o.reason.startswith(starts)
        assert o.reason.endswith("; no eviction or wait makes room for it on this fleet")
        assert o.retry_after_s == CANNOT_PLACE_RETRY_S
        assert "huge" not in w.memory.idle_eta_checked
        assert "huge" not in w.memory.evicting
        assert w.state.replicas[x].state == "ready"


class TestScaledToZero:
    """A model with max_replicas 0 is refused at once, not held for a replica never coming."""

    def test_max_replicas_zero_cannot_be_placed_and_says_why(self) -> None:
        """Asked for with room to spare, it is cannot_place, naming max_replicas."""
        w = World()
        w.node("a")
        w.model(spec("off", min_replicas=0, max_replicas=0))
        w.report(demand={"off": 1})
        w.tick()
        assert w.replicas("off") == []
        o = look(w, "off")
        assert (o.state, o.retry_after_s) == ("cannot_place", CANNOT_PLACE_RETRY_S)
        assert o.reason == "its max_replicas is 0: no replica is ever started for it"

    def test_a_replica_still_draining_is_not_ready(self) -> None:
        """Scaled to 0 while serving: once its replica stops being ready, it is refused."""
        w = World()
        w.node("a")
        w.model(spec("off", min_replicas=1, max_replicas=1))
        w.tick()
        w.ready_all()
        assert [o.models for o in outlook(w.state, w.index, unplaceable={}, evicting={})] == []
        w.model(spec("off", min_replicas=0, max_replicas=0), desired=1)
        w.clock.advance(200.0)
        w.touch("a")
        w.tick()
        assert w.only("off").state == "draining"
        assert look(w, "off").state == "cannot_place"


class TestStarting:
    """The start-time estimate for a model whose replica is starting."""

    def _starting(self) -> World:
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        return w

    def test_without_history_there_is_no_estimate(self) -> None:
        """Nothing started here before: no made-up time."""
        w = self._starting()
        o = look(w, "m", StartHistory())
        assert (o.state, o.reason, o.retry_after_s) == ("starting", "a replica is starting", None)

    def test_the_models_own_starts_give_the_median(self) -> None:
        """Starts of 30, 40 and 200 s: about 40 s, the median of 3 starts of m."""
        w = self._starting()
        starts = StartHistory()
        for took in (30.0, 200.0, 40.0):
            r = dataclasses.replace(w.only("m"), state="ready", created_at=0.0, state_since=took)
            starts.changed(w.state, None, r)
        o = look(w, "m", starts)
        assert o.reason == (
            "a replica is starting; starts take about 40 s (median of the last 3 starts of m)"
        )
        assert o.retry_after_s == 40.0

    def test_a_new_model_borrows_its_engine_kinds_starts(self) -> None:
        """m never started; another sim model took 95 s: about 2 min, of sim models."""
        w = self._starting()
        w.model(spec("other"))
        starts = StartHistory()
        other = dataclasses.replace(
            w.only("m"), id="o-1", model="other", state="ready", created_at=5.0, state_since=100.0
        )
        starts.changed(w.state, None, other)
        o = look(w, "m", starts)
        assert o.reason.endswith(
            "starts take about 2 min (median of the last 1 start of sim models)"
        )

    def test_seeded_from_the_replicas_ready_at_load(self) -> None:
        """A new leader learns the starts it can still see: ready replicas' own."""
        w = self._starting()
        w.clock.advance(25.0)
        w.ready_all()
        starts = StartHistory()
        starts.seed(w.state)
        est = starts.estimate("m", "sim")
        assert est is not None
        assert (est.seconds, est.starts, est.of) == (25.0, 1, "m")

    def test_only_becoming_ready_is_a_start(self) -> None:
        """A ready replica changing again (weight, drain) records nothing more."""
        w = self._starting()
        starts = StartHistory()
        r = dataclasses.replace(w.only("m"), state="ready", created_at=0.0, state_since=10.0)
        starts.changed(w.state, None, r)
        starts.changed(w.state, r, dataclasses.replace(r, weight=2.0))
        starts.changed(w.state, r, dataclasses.replace(r, state="draining"))
        est = starts.estimate("m", "sim")
        assert est is not None
        assert est.starts == 1


class TestOutlookWords:
    """Outlook times in words."""

    @pytest.mark.parametrize(
        ("seconds", "coarse", "said"),
        [(0.0, 10.0, "10 s"), (41.0, 50.0, "50 s"), (60.0, 60.0, "1 min"), (61.0, 120.0, "2 min"),
         (419.5, 420.0, "7 min"), (7_500.0, 7_500.0, "2 h 5 min"), (7_200.0, 7_200.0, "2 h")],
    )  # fmt: skip
    def test_times_are_rounded_up_and_said_in_words(
        self, seconds: float, coarse: float, said: str
    ) -> None:
        """Coarse (stable between ticks), never earlier than the real moment."""
        assert coarse_s(seconds) == coarse
        assert say_s(coarse) == said
