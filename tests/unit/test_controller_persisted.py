"""What a restarted controller needs to carry on: drain options, retired specs, held room.

Each test decides with the pure code and then plays a restart the way the
leader does one: a fresh `TickMemory` whose `evicting` comes from the stored
reservations (Fleet.begin_term), and nothing else carried over.
"""

from __future__ import annotations

from llmgw.controller.fleet import commands
from llmgw.controller.fleet.agents import desired_shards
from llmgw.controller.tick.carryover import TickMemory
from tests.unit.controller_reconcile_world import World, spec


def _restart(w: World) -> None:
    """A new leadership term: only what the store holds survives."""
    w.memory = TickMemory(leader_since=w.now - 10_000, evicting=dict(w.state.reservations))


def _drain(w: World, node: str, **kw: object) -> None:
    w.apply(commands.set_operator_state(w.state, node, "draining", now=w.now, **kw).changes)  # type: ignore[arg-type]


class TestDrainOptions:
    """Drain grace and force are stored with the node and survive a restart."""

    def test_drain_stores_grace_and_force_on_the_node(self) -> None:
        """The drain's grace and force are written with the node, in the command's batch."""
        w = World()
        w.node("a")
        _drain(w, "a", grace_s=120.0, force=True)
        a = w.state.nodes["a"]
        assert (a.operator_state, a.drain_grace_s, a.drain_force) == ("draining", 120.0, True)
        assert "grace 120s, forced" in w.events[-1]

    def test_uncordon_clears_the_drain_options(self) -> None:
        """A node no longer draining keeps no grace or force for a later drain."""
        w = World()
        w.node("a")
        _drain(w, "a", grace_s=5.0, force=True, evict_idle=True)
        w.apply(commands.set_operator_state(w.state, "a", "active", now=w.now).changes)
        a = w.state.nodes["a"]
        assert (a.operator_state, a.drain_grace_s, a.drain_force) == ("active", None, False)
        assert not a.drain_evict_idle

    def test_draining_again_with_force_is_a_change(self) -> None:
        """A second drain that adds force updates the node and says what changed."""
        w = World()
        w.node("a")
        _drain(w, "a", grace_s=30.0)
        _drain(w, "a", grace_s=30.0, force=True)
        assert w.state.nodes["a"].drain_force is True
        assert w.events[-1].startswith("node.draining a: drain options changed: grace 30s, forced")
        again = commands.set_operator_state(
            w.state, "a", "draining", now=w.now, grace_s=30.0, force=True
        )
        assert not again.changes

    def test_heartbeats_keep_the_drain_options(self) -> None:
        """An agent's heartbeat never clears what the operator asked for."""
        w = World()
        w.node("a")
        _drain(w, "a", grace_s=77.0, force=True, evict_idle=True)
        w.heartbeat("a")
        a = w.state.nodes["a"]
        assert (a.drain_grace_s, a.drain_force, a.drain_evict_idle) == (77.0, True, True)

    def test_a_restart_mid_drain_uses_the_stored_grace(self) -> None:
        """The old replica drains with the operator's grace even after a restart."""
        w = World()
        w.node("a")
        w.node("b", op="cordoned")
        w.model(spec("m"))
        w.tick()
        w.ready_all()
        old = w.only("m")
        w.set_node("b", operator_state="active")
        _drain(w, "a", grace_s=120.0)
        w.tick()
        _restart(w)
        w.ready_all()
        w.tick()
        drained = w.state.replicas[old.id]
        assert (drained.state, drained.drain_deadline) == ("draining", w.now + 120.0)


class TestRetiredSpecs:
    """A deleted model's spec is kept until its last replica stops."""

    def _ready(self) -> tuple[World, str]:
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        w.ready_all()
        return w, w.only("m").id

    def test_delete_keeps_the_spec_while_replicas_drain(self) -> None:
        """Deleting a model with a serving replica stores its spec beside the delete."""
        w, _ = self._ready()
        batch = commands.delete_model(w.state, w.index, "m", now=w.now, grace_s=30.0)
        assert [s.name for s in batch.changes.retired] == ["m"]

    def test_delete_with_nothing_running_keeps_nothing(self) -> None:
        """A model whose replicas never served has nothing to drain and no spec to keep."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        batch = commands.delete_model(w.state, w.index, "m", now=w.now, grace_s=30.0)
        assert batch.changes.retired == []

    def test_heartbeat_after_a_restart_still_lists_the_draining_shards(self) -> None:
        """The stored spec describes the draining shard, so the agent keeps it running."""
        w, rid = self._ready()
        w.apply(commands.delete_model(w.state, w.index, "m", now=w.now, grace_s=30.0).changes)
        _restart(w)
        w.tick()
        assert [s.replica_id for s in desired_shards(w.state, w.index, "a")] == [rid]

    def test_spec_is_dropped_once_every_replica_stopped(self) -> None:
        """When the last replica stops, the tick deletes the retired spec."""
        w, rid = self._ready()
        w.apply(commands.delete_model(w.state, w.index, "m", now=w.now, grace_s=30.0).changes)
        w.report(inflight={rid: 0})
        w.clock.advance(3)
        w.touch("a")
        plan = w.tick()
        assert w.state.replicas[rid].state == "stopped"
        assert (plan.changes.deleted_retired, w.state.retired) == (["m"], {})

    def test_applying_the_model_again_ends_its_retirement(self) -> None:
        """A deleted model applied again is current, not retired."""
        w, _ = self._ready()
        w.apply(commands.delete_model(w.state, w.index, "m", now=w.now, grace_s=30.0).changes)
        w.apply(commands.apply_models(w.state, [spec("m")], now=w.now).changes)
        assert (list(w.state.models), w.state.retired) == (["m"], {})


class TestHeldRoom:
    """Room made by an eviction is stored so a restart evicts nothing more."""

    def _evicted(self) -> tuple[World, str, str]:
        """Two idle replicas of p fill node a; `new` evicts one of them."""
        w = World()
        w.node("a", 2)
        w.model(spec("p", min_replicas=0, max_replicas=2, idle_timeout_s=60), desired=2)
        w.tick()
        w.ready_all()
        p1, p2 = (r.id for r in w.replicas("p"))
        w.report(last_used={p1: w.now - 500, p2: w.now - 400})
        w.model(spec("new", gpus_per_node=1))
        w.tick()
        return w, p1, p2

    def test_an_eviction_stores_its_reservation(self) -> None:
        """The room an eviction makes is written in the same tick's changes."""
        w, p1, _ = self._evicted()
        held = w.state.reservations["new"]
        assert (held.victims, held.gpus) == (frozenset({p1}), (("a", (0,)),))

    def test_the_reservation_is_deleted_once_the_model_lands(self) -> None:
        """Placed into its room, the model holds nothing any more."""
        w, p1, p2 = self._evicted()
        w.report(inflight={p1: 0})
        w.clock.advance(3)
        w.touch("a")
        w.tick()
        w.heartbeat("a", {p2: "ready"})  # the agent has stopped p1's engine
        plan = w.tick()
        assert w.only("new").shards[0].gpus == (0,)
        assert (plan.changes.deleted_reservations, w.state.reservations) == (["new"], {})

    def test_a_restart_mid_eviction_evicts_nothing_more(self) -> None:
        """After a restart the stored victims still drain, so the second idle replica stays."""
        w, p1, p2 = self._evicted()
        _restart(w)
        w.report(last_used={p1: w.now - 500, p2: w.now - 400})
        w.tick()
        assert [w.state.replicas[r].state for r in (p1, p2)] == ["draining", "ready"]

    def test_without_the_stored_room_a_restart_would_evict_again(self) -> None:
        """The failure the reservation prevents: forgotten victims, a second eviction."""
        w, p1, p2 = self._evicted()
        w.memory = TickMemory(leader_since=w.now - 10_000)
        w.state.reservations.clear()
        w.report(last_used={p1: w.now - 500, p2: w.now - 400})
        w.tick()
        assert w.state.replicas[p2].state == "draining"
