"""A node drain with no room for a replacement: it waits visibly, or drains anyway when forced."""

from __future__ import annotations

from llmgw.controller.api.views import drain_waits, node_view
from llmgw.controller.fleet import commands
from tests.unit.controller_reconcile_world import World, spec


def _world(*, force: bool = False, room: int = 2) -> tuple[World, list[str]]:
    """Model m (8 GPUs per replica) serving on a; b has `room` GPUs; a drains."""
    w = World()
    w.node("a")
    w.node("b", room, op="cordoned")
    w.model(spec("m", gpus_per_node=8))
    w.tick()
    w.ready_all()
    w.set_node("b", operator_state="active")
    ids = [r.id for r in w.replicas("m")]
    batch = commands.set_operator_state(
        w.state, "a", "draining", now=w.now, grace_s=45.0, force=force
    )
    w.apply(batch.changes)
    return w, ids


class TestWaiting:
    def test_no_replacement_keeps_the_old_replica_serving(self) -> None:
        """Nothing fits: the replica keeps serving and the node's events say why."""
        w, (rid,) = _world()
        w.tick()
        assert w.state.replicas[rid].state == "ready"
        waiting = [e for e in w.events if e.startswith("node.drain_waiting a")]
        assert len(waiting) == 1
        assert f"waiting for {rid} (m): no replacement fits: needs 8" in waiting[0]
        assert rid in w.memory.drain_waiting

    def test_waiting_is_announced_once_per_reason(self) -> None:
        """Later ticks with the same reason add no event."""
        w, _ = _world()
        w.tick()
        w.tick()
        w.tick()
        assert len([e for e in w.events if e.startswith("node.drain_waiting")]) == 1

    def test_room_ends_the_wait_make_before_break(self) -> None:
        """When a node with room appears, the replacement is placed and the wait is forgotten."""
        w, (rid,) = _world()
        w.tick()
        w.node("d")
        w.tick()
        new = w.only("m", "pending")
        assert (new.replaces, new.shards[0].node) == (rid, "d")
        assert w.state.replicas[rid].state == "ready"
        assert w.memory.drain_waiting == {}

    def test_node_view_names_the_replica_and_the_reason(self) -> None:
        """The draining node's view lists the blocked replica with the model's reason."""
        w, (rid,) = _world()
        w.tick()
        unplaceable = {name: u.reason for name, u in w.memory.unplaceable.items()}
        view = node_view(
            w.state.nodes["a"],
            w.state,
            now=w.now,
            heartbeat_timeout_s=10.0,
            unplaceable=unplaceable,
        )
        (wait,) = view.drain_waiting
        assert (wait.replica, wait.model, wait.blocked) == (rid, "m", True)
        assert wait.reason.startswith("no replacement fits: needs 8")
        assert (view.drain_grace_s, view.drain_force) == (45.0, False)

    def test_node_view_says_a_replacement_is_starting(self) -> None:
        """With room, the view says the old replica serves until its replacement is ready."""
        w, (rid,) = _world(room=8)
        w.tick()
        new = w.only("m", "pending")
        (wait,) = drain_waits(w.state, {})["a"]
        assert (wait.blocked, wait.reason) == (
            False,
            f"serving until its replacement {new.id} is ready (pending)",
        )
        assert rid == wait.replica

    def test_only_draining_nodes_are_explained(self) -> None:
        """Nodes not draining have no waits, whatever runs on them."""
        w, _ = _world()
        assert list(drain_waits(w.state, {"m": "x"})) == ["a"]


class TestForce:
    def test_forced_drain_drains_without_a_replacement(self) -> None:
        """Forced: the replica drains with the node's grace, and both events say so."""
        w, (rid,) = _world(force=True)
        w.tick()
        r = w.state.replicas[rid]
        assert (r.state, r.drain_deadline) == ("draining", w.now + 45.0)
        assert any(
            e.startswith(f"replica.drain_forced {rid}: node a drain forced") for e in w.events
        )
        assert any(e.startswith(f"node.drain_forced a: {rid} (m) drains") for e in w.events)
        assert not any(e.startswith("node.drain_waiting") for e in w.events)

    def test_force_keeps_make_before_break_when_room_exists(self) -> None:
        """Force changes nothing for a replica whose replacement fits."""
        w, (rid,) = _world(force=True, room=8)
        w.tick()
        assert w.state.replicas[rid].state == "ready"
        assert w.only("m", "pending").replaces == rid

    def test_every_blocked_replica_of_a_model_is_forced(self) -> None:
        """Two replicas of one model that fit nowhere both drain (not only the first asked)."""
        w = World()
        w.node("a", 16)
        w.node("b", 2)
        w.model(spec("m", gpus_per_node=8, min_replicas=2))
        w.tick()
        w.ready_all()
        ids = [r.id for r in w.replicas("m")]
        assert {r.shards[0].node for r in w.replicas("m")} == {"a"}
        batch = commands.set_operator_state(w.state, "a", "draining", now=w.now, force=True)
        w.apply(batch.changes)
        w.tick()
        assert [w.state.replicas[rid].state for rid in ids] == ["draining", "draining"]

    def test_forcing_a_waiting_drain_moves_it_on_the_next_tick(self) -> None:
        """A drain that waits, then forced by a second drain command, drains the replica."""
        w, (rid,) = _world()
        w.tick()
        assert w.state.replicas[rid].state == "ready"
        batch = commands.set_operator_state(
            w.state, "a", "draining", now=w.now, grace_s=45.0, force=True
        )
        w.apply(batch.changes)
        w.tick()
        assert w.state.replicas[rid].state == "draining"
        assert w.memory.drain_waiting == {}
