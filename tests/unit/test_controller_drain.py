"""A node drain with no room for a replacement: it waits visibly, or drains anyway when forced."""

from __future__ import annotations

from llmgw.controller.api.views import drain_waits, node_view
from llmgw.controller.fleet import commands
from llmgw.wire.admin import DrainWait
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
    """A drain with no room waits visibly while the old replica keeps serving."""

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
    """A forced drain proceeds without a replacement, keeping make-before-break where it can."""

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


def _busy_world(
    *, x_min: int = 0, idle_s: float | None = 1_000.0, evict_idle: bool = True, force: bool = False
) -> tuple[World, str, str]:
    """m (8 GPUs) serves on a, x (8 GPUs, idle `idle_s`, None: unknown) fills b; a drains."""
    w = World()
    w.node("a")
    w.node("b", op="cordoned")
    w.model(spec("m", gpus_per_node=8))
    w.tick()
    w.ready_all()
    w.set_node("b", operator_state="active")
    w.model(spec("x", gpus_per_node=8, min_replicas=x_min), desired=1)
    w.tick()
    w.ready_all()
    rid, victim = w.only("m").id, w.only("x").id
    if idle_s is not None:
        w.report(last_used={victim: w.now - idle_s}, inflight={victim: 0})
    batch = commands.set_operator_state(
        w.state, "a", "draining", now=w.now, grace_s=45.0, force=force, evict_idle=evict_idle
    )
    w.apply(batch.changes)
    return w, rid, victim


def _waits(w: World) -> tuple[DrainWait, ...]:
    unplaceable = {name: u.reason for name, u in w.memory.unplaceable.items()}
    return drain_waits(w.state, unplaceable)["a"]


class TestEvictIdle:
    """A drain may evict an idle replica of another model to make room for the replacement."""

    def test_an_idle_replica_of_another_model_is_evicted_for_the_replacement(self) -> None:
        """x, idle past its timeout, drains; m keeps serving; the events say what and why."""
        w, rid, victim = _busy_world()
        w.tick()
        assert w.state.replicas[victim].state == "draining"
        assert w.state.replicas[rid].state == "ready"
        assert w.memory.evicting["m"].victims == {victim}
        assert any(
            e.startswith(f"replica.evicted {victim}: evicted for m:")
            and f"the replacement of {rid} (node a draining)" in e
            for e in w.events
        )
        assert any(e.startswith(f"node.drain_evicting a: evicting idle {victim}") for e in w.events)
        (wait,) = _waits(w)
        assert (wait.replica, wait.blocked) == (rid, False)
        assert wait.reason.startswith(f"making room: evicting idle {victim}")

    def test_the_replacement_lands_in_the_room_once_the_victim_stopped(self) -> None:
        """Make-before-break: the replacement is placed on b, the old replica still serves."""
        w, rid, victim = _busy_world()
        w.tick()
        w.clock.advance(5.0)
        w.touch("a", "b")
        w.report(inflight={victim: 0})
        w.tick()
        assert w.state.replicas[victim].state == "stopped"
        w.heartbeat("b", {})  # its engine exited: the cards are back
        w.tick()
        new = w.only("m", "pending")
        assert (new.replaces, new.shards[0].node) == (rid, "b")
        assert w.state.replicas[rid].state == "ready"
        assert "m" not in w.memory.evicting

    def test_unknown_idleness_is_never_evicted(self) -> None:
        """No router said x is idle: nothing is evicted and the drain says so."""
        w, rid, victim = _busy_world(idle_s=None)
        w.tick()
        assert w.state.replicas[victim].state == "ready"
        (wait,) = _waits(w)
        assert wait.blocked
        assert "nothing idle can be evicted for it" in wait.reason
        assert any(
            e.startswith(f"node.drain_waiting a: waiting for {rid} (m)")
            and "nothing idle can be evicted" in e
            for e in w.events
        )

    def test_never_below_min_replicas(self) -> None:
        """x's one replica is its min: it stays, however idle."""
        w, _, victim = _busy_world(x_min=1)
        w.tick()
        assert w.state.replicas[victim].state == "ready"
        assert "m" not in w.memory.evicting

    def test_without_the_flag_nothing_is_evicted(self) -> None:
        """A plain drain waits rather than evict, however idle the other models are."""
        w, rid, victim = _busy_world(evict_idle=False)
        w.tick()
        assert w.state.replicas[victim].state == "ready"
        assert w.state.replicas[rid].state == "ready"
        assert "(drain with force to move it anyway)" in _waits(w)[0].reason

    def test_force_applies_when_nothing_can_be_evicted(self) -> None:
        """evict_idle with force: nothing evictable, so the replica drains without one."""
        w, rid, victim = _busy_world(idle_s=None, force=True)
        w.tick()
        assert w.state.replicas[rid].state == "draining"
        assert w.state.replicas[victim].state == "ready"

    def test_eviction_is_tried_before_force(self) -> None:
        """evict_idle with force and an idle victim: room is made, capacity is kept."""
        w, rid, victim = _busy_world(force=True)
        w.tick()
        assert w.state.replicas[rid].state == "ready"
        assert w.state.replicas[victim].state == "draining"

    def test_the_option_is_kept_with_the_node_and_shown(self) -> None:
        """The node remembers evict_idle (a restart drains as told) and its view says so."""
        w, _, _ = _busy_world()
        assert w.state.nodes["a"].drain_evict_idle
        view = node_view(w.state.nodes["a"], w.state, now=w.now, heartbeat_timeout_s=10.0)
        assert (view.drain_evict_idle, view.drain_force) == (True, False)
        assert any("known-idle replicas of other models may be evicted" in e for e in w.events)
