"""The reconcile tick's decisions, on plain state with a manual clock."""

from __future__ import annotations

import msgspec

from llmgw.controller.placement.capacity import gpus_in_use
from llmgw.controller.tick.carryover import TickMemory
from llmgw.controller.tick.per_model import desired_count
from llmgw.controller.tick.plan import plan_tick
from llmgw.wire.usage import ModelLoad
from tests.unit.controller_reconcile_world import World, gpus, spec


def _desired(**kw: object) -> int:
    args: dict[str, object] = {
        "min_replicas": 1,
        "max_replicas": 4,
        "current": 1,
        "demand": 0,
        "busy": None,
        "target_per_replica": 10.0,
        "cooling": False,
    }
    args.update(kw)
    return desired_count(**args)  # type: ignore[arg-type]


class TestDesiredCount:
    """How many replicas a model should have, from its bounds and load."""

    def test_min_is_the_floor(self) -> None:
        """With no demand and no load the model keeps its minimum."""
        assert _desired(min_replicas=2, current=2, busy=0) == 2

    def test_held_requests_scale_from_zero(self) -> None:
        """A request held for a model with min 0 asks for one replica."""
        assert _desired(min_replicas=0, current=0, demand=3) == 1

    def test_load_scales_up_at_once(self) -> None:
        """35 requests busy at 10 per replica want 4, even while cooling down."""
        assert _desired(busy=35, cooling=True) == 4

    def test_max_caps(self) -> None:
        """Load beyond max replicas stops at max."""
        assert _desired(busy=1000) == 4

    def test_unknown_load_never_scales_down(self) -> None:
        """No router reported the model: the current count stays."""
        assert _desired(current=3, busy=None) == 3

    def test_known_low_load_scales_down_after_cooldown(self) -> None:
        """Zero load drops to the minimum once the cool-down is over, not before."""
        assert _desired(current=3, busy=0, cooling=True) == 3
        assert _desired(current=3, busy=0, cooling=False) == 1

    def test_max_below_current_applies_at_once(self) -> None:
        """An operator lowering max is obeyed even during the cool-down."""
        assert _desired(current=4, max_replicas=2, busy=None, cooling=True) == 2


class TestPlacing:
    """Missing replicas are placed, by priority, without double-booking a card."""

    def test_missing_replicas_are_placed_pending(self) -> None:
        """A model with min 2 gets two pending replicas with shards and an event each."""
        w = World()
        w.node("a")
        w.model(spec("m", min_replicas=2, gpus_per_node=2))
        w.tick()
        placed = w.replicas("m", "pending")
        assert len(placed) == 2
        assert [len(r.shards[0].gpus) for r in placed] == [2, 2]
        assert sum("replica.placed" in e for e in w.events) == 2

    def test_no_gpu_is_given_twice_in_one_tick(self) -> None:
        """Two models placed in the same tick never share a card."""
        w = World()
        w.node("a", 4)
        w.model(spec("x", min_replicas=2, gpus_per_node=1))
        w.model(spec("y", min_replicas=1, gpus_per_node=2))
        w.tick()
        cards = [g for r in w.replicas() for s in r.shards for g in s.gpus]
        assert sorted(cards) == [0, 1, 2, 3]

    def test_unplaceable_is_remembered_and_logged_once(self) -> None:
        """A model that does not fit gets a reason, and the event is not repeated every tick."""
        w = World()
        w.node("a", 2)
        w.model(spec("big", gpus_per_node=4))
        w.tick()
        w.clock.advance(1)
        w.tick()
        assert "needs 4" in w.memory.unplaceable["big"].reason
        assert sum("model.unplaceable" in e for e in w.events) == 1
        assert w.replicas("big") == []

    def test_higher_priority_is_placed_first(self) -> None:
        """With room for one, the higher-priority model gets it."""
        w = World()
        w.node("a", 1)
        w.model(spec("low", priority=0))
        w.model(spec("high", priority=5))
        w.tick()
        assert [r.model for r in w.replicas()] == ["high"]

    def test_multi_node_replica_gets_a_rendezvous_port(self) -> None:
        """A two-node replica spans two whole nodes of one fabric with a master port."""
        w = World()
        w.node("a")
        w.node("b")
        w.model(spec("wide", gpus_per_node=8, nodes=2))
        w.tick()
        r = w.only("wide")
        assert sorted(s.node for s in r.shards) == ["a", "b"]
        assert r.master_port is not None


class TestScaleFromZero:
    """Held requests and traffic bring a model up from zero replicas."""

    def test_held_requests_place_a_replica(self) -> None:
        """Routers holding requests for a model with min 0 get it one replica."""
        w = World()
        w.node("a")
        w.model(spec("m", min_replicas=0, max_replicas=2))
        w.report(demand={"m": 3})
        w.tick()
        assert len(w.replicas("m", "pending")) == 1

    def test_held_requests_under_an_alias_count_for_the_model(self) -> None:
        """Routers report the name clients used; an alias's held requests scale its model."""
        w = World()
        w.node("a")
        w.model(
            msgspec.structs.replace(spec("m", min_replicas=0, max_replicas=2), aliases=("m-chat",))
        )
        w.report(demand={"m-chat": 3})
        w.tick()
        assert len(w.replicas("m", "pending")) == 1

    def test_load_under_an_alias_sizes_the_model(self) -> None:
        """In-flight requests reported under the model's name and an alias add up."""
        w = World()
        w.node("a")
        w.model(
            msgspec.structs.replace(spec("m", min_replicas=1, max_replicas=4), aliases=("m-chat",))
        )
        w.report(load={"m": ModelLoad(inflight=10), "m-chat": ModelLoad(inflight=15)})
        w.tick()
        assert w.state.models["m"].desired_replicas == 3

    def test_traffic_with_nothing_in_flight_keeps_one_replica(self) -> None:
        """Requests started this interval but none in flight at report time is not "no load"."""
        # Otherwise a model with sparse traffic drains its only replica, holds the
        # next request, scales from zero again, and flaps with a cold start each time.
        w = World()
        w.node("a")
        w.model(spec("m", min_replicas=0, max_replicas=2), desired=1)
        w.tick()
        w.ready_all()
        w.tick()
        w.report(load={"m": ModelLoad(inflight=0, requests=5, interval_s=1.0)})
        w.tick()
        assert w.state.models["m"].desired_replicas == 1
        assert [r.state for r in w.replicas("m")] == ["ready"]


class TestReadiness:
    """A ready heartbeat makes a replica ready with its URL."""

    def test_ready_heartbeat_makes_replica_ready_with_url(self) -> None:
        """All shards reported ready: the replica is ready at rank 0's address and port."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        r = w.only("m")
        w.heartbeat("a", {r.id: "starting"})
        assert w.only("m").state == "starting"
        w.heartbeat("a", {r.id: "ready"}, port=21001)
        ready = w.only("m")
        assert (ready.state, ready.endpoint_url) == ("ready", "http://a.lan:21001")


class TestDeadlinesAndRestarts:
    """Stuck and failed replicas are failed and restarted with backoff."""

    def test_stuck_starting_is_failed(self) -> None:
        """A replica starting past the deadline is failed with a retry time, not left starting."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        w.heartbeat("a", {w.only("m").id: "starting"})
        w.clock.advance(61)
        w.touch("a")
        w.tick()
        failed = w.only("m", "failed")
        assert "deadline" in (failed.reason or "")
        assert failed.retry_at == w.now + 5.0

    def test_a_restarted_controller_counts_the_deadline_from_its_start(self) -> None:
        """After a long controller outage a starting replica gets the deadline anew, not a fail."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        w.heartbeat("a", {rid: "starting"})
        w.clock.advance(1000)
        w.memory = TickMemory(leader_since=w.now)  # the new leader's first tick
        w.touch("a")
        w.tick()
        assert w.state.replicas[rid].state == "starting"
        w.clock.advance(61)
        w.touch("a")
        w.tick()
        assert w.state.replicas[rid].state == "failed"

    def test_failed_restarts_after_backoff_as_a_new_replica(self) -> None:
        """Not before retry_at; then the old one stops and a new one carries restarts + 1."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        first = w.only("m")
        w.heartbeat("a", {first.id: "failed"})
        failed = w.only("m", "failed")
        assert "exited with code 1: CUDA out of memory" in (failed.reason or "")
        w.clock.advance(2)
        w.touch("a")
        w.tick()
        assert w.replicas("m", "pending") == []
        w.clock.advance(4)
        w.touch("a")
        w.tick()
        again = w.only("m", "pending")
        assert again.id != first.id
        assert again.restarts == 1
        assert w.state.replicas[first.id].state == "stopped"

    def test_cards_of_an_engine_still_exiting_are_not_given_again(self) -> None:
        """A failed replica's engine the agent still reports keeps its cards until it is gone."""
        w = World()
        w.node("a", 1)
        w.model(spec("m"))
        w.tick()
        first = w.only("m")
        w.heartbeat("a", {first.id: "starting"})
        w.clock.advance(61)
        w.touch("a")
        w.tick()
        assert w.only("m", "failed").id == first.id
        w.clock.advance(6)
        # Told to stop it, the agent is still waiting for the engine to exit.
        w.heartbeat("a", {first.id: "starting"})
        w.tick()
        assert w.replicas("m", "pending") == []
        w.heartbeat("a", {})
        w.tick()
        again = w.only("m", "pending")
        assert again.shards[0].gpus == (0,)

    def test_only_the_shards_still_running_keep_their_cards(self) -> None:
        """Rank 1 exited on b, rank 0 still runs on a: b's cards are free, a's are not."""
        w = World()
        w.node("a")
        w.node("b")
        w.model(spec("wide", gpus_per_node=8, nodes=2))
        w.tick()
        w.ready_all()
        old = w.only("wide", "ready")
        w.heartbeat("b", {old.id: "failed"})
        assert gpus_in_use(w.state) == {"a": set(range(8))}
        w.heartbeat("a", {})
        assert gpus_in_use(w.state) == {}

    def test_backoff_doubles_and_caps(self) -> None:
        """Each failure waits twice as long as the previous, up to the cap."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        waits = []
        for _ in range(5):
            w.tick()
            r = w.only("m", "pending")
            w.heartbeat("a", {r.id: "failed"})
            failed = w.state.replicas[r.id]
            assert failed.retry_at is not None
            waits.append(failed.retry_at - w.now)
            w.clock.advance(failed.retry_at - w.now)
            w.touch("a")
        assert waits == [5.0, 10.0, 20.0, 40.0, 40.0]

    def test_late_heartbeat_does_not_revive_a_failed_replica(self) -> None:
        """A report of ready for a replica already failed changes nothing and is not desired."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        w.heartbeat("a", {rid: "failed"})
        desired = w.heartbeat("a", {rid: "ready"})
        assert w.state.replicas[rid].state == "failed"
        assert desired == ()


class TestUnreachable:
    """Replicas on an unreachable node are kept for a grace, then replaced."""

    def test_unreachable_node_keeps_its_replicas_during_the_grace(self) -> None:
        """After the timeout the node is announced unreachable; its replica stays ready."""
        w = World()
        w.node("a")
        w.node("b")
        w.model(spec("m"))
        w.tick()
        w.ready_all()
        node = w.only("m").shards[0].node
        other = "b" if node == "a" else "a"
        w.clock.advance(15)
        w.touch(other)
        w.tick()
        assert any(e.startswith(f"node.unreachable {node}") for e in w.events)
        assert w.only("m").state == "ready"

    def test_replicas_are_replaced_after_the_grace(self) -> None:
        """Past timeout + grace the replica fails and a replacement lands on the other node."""
        w = World()
        w.node("a")
        w.node("b")
        w.model(spec("m"))
        w.tick()
        w.ready_all()
        lost = w.only("m")
        node = lost.shards[0].node
        other = "b" if node == "a" else "a"
        w.clock.advance(41)
        w.touch(other)
        w.tick()
        assert w.state.replicas[lost.id].state == "stopped"
        new = w.only("m", "pending")
        assert new.shards[0].node == other

    def test_replaced_in_the_same_tick_when_only_changed_models_are_decided(self) -> None:
        """As the leader ticks (dirty models only): the failed replica is re-placed at once."""
        w = World()
        w.node("a")
        w.node("b")
        w.model(spec("m"))
        w.tick()
        w.ready_all()
        lost = w.only("m")
        other = "b" if lost.shards[0].node == "a" else "a"
        w.clock.advance(41)
        w.touch(other)
        plan = plan_tick(
            w.state, w.index, w.usage, w.memory, now=w.now, config=w.config,
            new_id=w.new_id, dirty=set(),
        )  # fmt: skip
        w.apply(plan.changes)
        assert w.state.replicas[lost.id].state == "stopped"
        assert w.only("m", "pending").shards[0].node == other

    def test_a_restarted_controller_gives_every_node_a_grace(self) -> None:
        """Old stored heartbeats do not make nodes unreachable on the first tick after start."""
        w = World()
        w.node("a", silent_s=3_600)
        w.memory.leader_since = w.now
        w.model(spec("m"))
        w.tick()
        assert not any("node.unreachable" in e for e in w.events)
        w.clock.advance(11)
        w.tick()
        assert any("node.unreachable a" in e for e in w.events)

    def test_returning_node_is_announced(self) -> None:
        """A node that heartbeats again after being unreachable gets a reachable event."""
        w = World()
        w.node("a")
        w.clock.advance(11)
        w.tick()
        w.touch("a")
        w.tick()
        assert any(e.startswith("node.reachable a") for e in w.events)


class TestDraining:
    """A draining replica stops once nothing is in flight, or after the grace."""

    def test_draining_replica_stops_when_inflight_is_zero(self) -> None:
        """A reported zero in flight stops a draining replica once the drain has settled."""
        w = World()
        w.node("a")
        w.model(spec("m", min_replicas=2, max_replicas=2))
        w.tick()
        w.ready_all()
        w.state.models["m"] = w.state.models["m"].__class__(
            spec=spec("m", min_replicas=1),
            created_at=w.now,
            updated_at=w.now - 1,
            desired_replicas=1,
        )
        w.tick()
        draining = w.only("m", "draining")
        w.report(inflight={draining.id: 0})
        w.tick()
        assert w.state.replicas[draining.id].state == "draining"
        w.clock.advance(2)
        w.touch("a")
        w.tick()
        assert w.state.replicas[draining.id].state == "stopped"

    def test_unknown_inflight_waits_for_the_grace(self) -> None:
        """Nobody reported in-flight requests: the replica drains until its grace ends."""
        w = World()
        w.node("a")
        w.model(spec("m", min_replicas=2, max_replicas=2))
        w.tick()
        w.ready_all()
        w.state.models["m"] = w.state.models["m"].__class__(
            spec=spec("m", min_replicas=1),
            created_at=w.now,
            updated_at=w.now - 1,
            desired_replicas=1,
        )
        w.tick()
        rid = w.only("m", "draining").id
        w.clock.advance(29)
        w.touch("a")
        w.tick()
        assert w.state.replicas[rid].state == "draining"
        w.clock.advance(2)
        w.touch("a")
        w.tick()
        assert w.state.replicas[rid].state == "stopped"


class TestSurplus:
    """Which surplus replica goes first."""

    def _two_ready(self) -> World:
        w = World()
        w.node("a")
        w.model(spec("m", min_replicas=3, max_replicas=3))
        w.tick()
        w.ready_all()
        return w

    def _lower_to_one(self, w: World) -> None:
        m = w.state.models["m"]
        w.state.models["m"] = m.__class__(
            spec=spec("m", min_replicas=1, max_replicas=3),
            created_at=m.created_at,
            updated_at=m.updated_at,
            desired_replicas=3,
        )
        w.report(load={"m": ModelLoad(inflight=0)})
        w.clock.advance(200)
        w.touch("a")

    def test_known_idle_longest_goes_first_and_unknown_last(self) -> None:
        """Of three ready replicas, the two known idle drain; the unknown one stays."""
        w = self._two_ready()
        a, b, c = (r.id for r in w.replicas("m"))
        w.report(last_used={a: w.now - 100, b: w.now - 50})
        self._lower_to_one(w)
        w.tick()
        assert w.only("m", "ready").id == c
        assert {r.id for r in w.replicas("m", "draining")} == {a, b}

    def test_not_yet_serving_replicas_go_before_ready_ones(self) -> None:
        """A pending replica is dropped before any ready one, even a known-idle one."""
        w = World()
        w.node("a")
        w.model(spec("m", min_replicas=2, max_replicas=2))
        w.tick()
        first, second = w.replicas("m")
        w.heartbeat("a", {first.id: "ready"})
        w.report(last_used={first.id: w.now - 1_000})
        m = w.state.models["m"]
        w.state.models["m"] = m.__class__(
            spec=spec("m", min_replicas=1, max_replicas=2),
            created_at=m.created_at,
            updated_at=m.updated_at,
            desired_replicas=1,
        )
        w.tick()
        assert w.state.replicas[second.id].state == "stopped"
        assert w.state.replicas[first.id].state == "ready"


class TestNodeDrain:
    """Replicas on a draining node are replaced make-before-break."""

    def test_make_before_break(self) -> None:
        """The replacement is placed first; the old one serves until it is ready, then drains."""
        w = World()
        w.node("a")
        w.node("b", op="cordoned")
        w.model(spec("m"))
        w.tick()
        w.ready_all()
        old = w.only("m")
        assert old.shards[0].node == "a"
        w.set_node("a", operator_state="draining")
        w.set_node("b", operator_state="active")
        w.tick()
        new = w.only("m", "pending")
        assert (new.shards[0].node, new.replaces) == ("b", old.id)
        assert w.state.replicas[old.id].state == "ready"
        w.ready_all()
        w.tick()
        assert w.state.replicas[old.id].state == "draining"
        assert w.only("m", "ready").id == new.id
        w.report(inflight={old.id: 0})
        w.clock.advance(3)
        w.touch("a", "b")
        w.tick()
        assert w.state.replicas[old.id].state == "stopped"
        w.heartbeat("a", {})  # the agent has stopped its engine
        w.tick()
        assert any(e.startswith("node.drained a") for e in w.events)

    def test_a_replacement_whose_node_drains_too_is_replaced_as_a_replacement(self) -> None:
        """The pending replacement's node drains as well: the next one still replaces the old."""
        w = World()
        w.node("a")
        w.node("b", op="cordoned")
        w.node("c", op="cordoned")
        w.model(spec("m"))
        w.tick()
        w.ready_all()
        old = w.only("m")
        w.set_node("a", operator_state="draining")
        w.set_node("b", operator_state="active")
        w.tick()
        first = w.only("m", "pending")
        assert (first.shards[0].node, first.replaces) == ("b", old.id)
        w.set_node("b", operator_state="draining")
        w.set_node("c", operator_state="active")
        w.tick()
        second = w.only("m", "pending")
        assert (second.shards[0].node, second.replaces) == ("c", old.id)
        w.tick()
        assert w.only("m", "pending").id == second.id
        assert w.state.replicas[old.id].state == "ready"

    def test_pending_replica_on_draining_node_moves_at_once(self) -> None:
        """Nothing to protect: a replica not yet serving is stopped and placed elsewhere."""
        w = World()
        w.node("a")
        w.node("b", op="cordoned")
        w.model(spec("m"))
        w.tick()
        old = w.only("m")
        w.set_node("a", operator_state="draining")
        w.set_node("b", operator_state="active")
        w.tick()
        assert w.state.replicas[old.id].state == "stopped"
        assert w.only("m", "pending").shards[0].node == "b"


class TestUnhealthyGpu:
    """Replicas on a card gone unhealthy are placed again or replaced."""

    def test_pending_replica_on_a_gpu_gone_unhealthy_is_placed_again(self) -> None:
        """A card that turns unhealthy before its engine starts: the replica goes elsewhere."""
        w = World()
        w.node("a", 2)
        w.model(spec("m"))
        w.tick()
        first = w.only("m", "pending")
        assert first.shards[0].gpus == (0,)
        w.set_node("a", gpus=gpus(2, unhealthy=[0]))
        w.heartbeat("a")
        w.tick()
        assert w.state.replicas[first.id].state == "stopped"
        assert w.only("m", "pending").shards[0].gpus == (1,)

    def test_ready_replica_on_a_gpu_gone_unhealthy_is_replaced_before_it_leaves(self) -> None:
        """Serving on a card that turned unhealthy: make-before-break onto healthy cards."""
        w = World()
        w.node("a", 2)
        w.model(spec("m"))
        w.tick()
        w.ready_all()
        old = w.only("m", "ready")
        w.set_node("a", gpus=gpus(2, unhealthy=[0]))
        w.heartbeat("a", {old.id: "ready"})
        w.tick()
        new = w.only("m", "pending")
        assert (new.shards[0].gpus, new.replaces) == ((1,), old.id)
        assert w.state.replicas[old.id].state == "ready"


class TestEviction:
    """Idle replicas are evicted, one set at a time, for an unplaceable model."""

    def _full(self) -> tuple[World, str]:
        w = World()
        w.node("a", 2)
        w.model(spec("old", min_replicas=0, max_replicas=1, idle_timeout_s=60), desired=1)
        w.tick()
        w.ready_all()
        return w, w.only("old").id

    def test_known_idle_replica_is_evicted_for_an_unplaceable_model(self) -> None:
        """Idle past its timeout, the replica drains, and the new model lands when it stops."""
        w, rid = self._full()
        w.report(last_used={rid: w.now - 120}, inflight={rid: 0})
        w.model(spec("new", gpus_per_node=2))
        w.tick()
        assert w.state.replicas[rid].state == "draining"
        assert "evicted for new" in (w.state.replicas[rid].reason or "")
        w.clock.advance(3)
        w.touch("a")
        w.tick()
        assert w.state.replicas[rid].state == "stopped"
        w.heartbeat("a", {})  # the agent has stopped its engine
        w.tick()
        assert w.only("new").state == "pending"

    def test_the_room_made_is_held_for_the_model_that_made_it(self) -> None:
        """Another model cannot take the cards an eviction is freeing, free ones included."""
        w, rid = self._full()
        w.report(last_used={rid: w.now - 120}, inflight={rid: 0})
        w.model(spec("new", gpus_per_node=2))
        w.model(spec("other"))
        w.tick()
        w.clock.advance(3)
        w.touch("a")
        w.tick()
        w.heartbeat("a", {})  # the agent has stopped its engine
        w.tick()
        assert w.only("new").shards[0].gpus == (0, 1)
        assert w.replicas("other") == []
        assert w.state.models["old"].desired_replicas == 0

    def test_unknown_idle_replica_is_never_evicted(self) -> None:
        """No router has reported the replica: the new model stays unplaceable."""
        w, rid = self._full()
        w.model(spec("new", gpus_per_node=2))
        w.tick()
        assert w.state.replicas[rid].state == "ready"
        assert "new" in w.memory.unplaceable

    def test_no_second_eviction_while_the_first_frees_its_cards(self) -> None:
        """While evicted replicas drain, the model does not evict more."""
        w = World()
        w.node("a", 2)
        w.model(spec("p", min_replicas=0, max_replicas=2, idle_timeout_s=60), desired=2)
        w.tick()
        w.ready_all()
        p1, p2 = (r.id for r in w.replicas("p"))
        w.report(last_used={p1: w.now - 500, p2: w.now - 400})
        w.model(spec("new", gpus_per_node=1))
        w.tick()
        assert [w.state.replicas[r].state for r in (p1, p2)] == ["draining", "ready"]
        w.tick()
        assert w.state.replicas[p2].state == "ready"

    def test_a_victim_stuck_on_an_unreachable_node_does_not_block_evicting_another(self) -> None:
        """The first victim's node went silent before its engine was seen to exit: its
        cards will not come back soon, so the model may evict elsewhere."""
        w = World()
        w.node("a", 1)
        w.node("b", 1)
        w.model(spec("old1", min_replicas=0, max_replicas=1, idle_timeout_s=60), desired=1)
        w.model(spec("old2", min_replicas=0, max_replicas=1, idle_timeout_s=60), desired=1)
        w.tick()
        w.ready_all()
        r1, r2 = w.only("old1").id, w.only("old2").id
        w.report(last_used={r1: w.now - 500, r2: w.now - 120}, inflight={r1: 0, r2: 0})
        w.model(spec("new"))
        w.tick()
        victim = r1 if w.state.replicas[r1].state == "draining" else r2
        other = r2 if victim == r1 else r1
        w.clock.advance(3)
        w.touch("a", "b")
        w.tick()
        assert w.state.replicas[victim].state == "stopped"
        lost = w.state.replicas[victim].shards[0].node
        w.clock.advance(11)
        w.touch("b" if lost == "a" else "a")
        w.tick()
        assert w.state.replicas[other].state == "draining"


class TestModelDelete:
    """A deleted model's replicas drain and are forgotten after retention."""

    def test_replicas_of_a_deleted_model_drain(self) -> None:
        """A model gone from the state has its live replicas drained by the next tick."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        w.ready_all()
        del w.state.models["m"]
        w.tick()
        assert w.only("m").state == "draining"

    def test_stopped_replicas_are_forgotten_after_retention(self) -> None:
        """Stopped replicas are deleted from the store after the retention period."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        del w.state.models["m"]
        w.tick()
        assert w.state.replicas[rid].state == "stopped"
        w.clock.advance(601)
        plan = w.tick()
        assert plan.forgotten == [rid]
        assert rid not in w.state.replicas
