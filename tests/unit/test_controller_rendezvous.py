"""Multi-node rendezvous ports: never one another replica on the node uses, nor an engine's."""

from __future__ import annotations

from llmgw.controller.fleet.records import Replica, Shard
from tests.unit.controller_reconcile_world import World, spec


def _wide(w: World) -> Replica:
    """A two-node model on a and b (whole nodes), placed and ready."""
    w.model(spec("wide", gpus_per_node=8, nodes=2))
    w.tick()
    w.ready_all()
    _small_range(w)  # heartbeats bring the agent's own range (the wire default)
    return w.only("wide", "ready")


def _stopped(w: World, rid: str, port: int) -> Replica:
    """A replica that left node a, whose engine reported `port` there."""
    return Replica(
        id=rid,
        model="gone",
        state="stopped",
        shards=(Shard(node="a", rank=0, gpus=(0,), port=port),),
        created_at=w.now,
        state_since=w.now,
        updated_at=w.now,
    )


def _small_range(w: World) -> None:
    w.set_node("a", port_range=(21000, 21003))


def _fleet() -> World:
    w = World()
    w.node("a")
    w.node("b")
    _small_range(w)
    return w


class TestRendezvousPort:
    """The rendezvous port chosen for a multi-node replica avoids ports in use."""

    def test_top_of_the_head_node_s_range(self) -> None:
        """The first rendezvous port is the top of rank 0's agent range."""
        w = _fleet()
        r = _wide(w)
        assert (r.shards[0].node, r.master_port) == ("a", 21003)

    def test_restart_while_the_old_rank0_may_listen_takes_another_port(self) -> None:
        """A replica failed on rank 1 is restarted on the same nodes with a different port."""
        w = _fleet()
        old = _wide(w)
        w.heartbeat("b", {old.id: "failed"})
        w.clock.advance(6)
        w.touch("a", "b")
        w.heartbeat("a", {})  # rank 0's engine has exited: its cards are free again
        _small_range(w)
        w.tick()
        new = w.only("wide", "pending")
        assert new.shards[0].node == "a"
        assert (old.master_port, new.master_port) == (21003, 21002)

    def test_ports_of_stopped_engines_are_avoided(self) -> None:
        """An engine port a stopped replica reported on the head node is not the rendezvous."""
        w = _fleet()
        old = _stopped(w, "r-old", 21003)
        w.state.replicas[old.id] = old
        w.index.put(None, old)
        assert _wide(w).master_port == 21002

    def test_a_range_full_of_stopping_engines_still_yields_a_port(self) -> None:
        """When gone replicas hold every port, one is reused rather than placing nothing."""
        w = _fleet()
        for i, port in enumerate(range(21000, 21004)):
            gone = _stopped(w, f"r-gone{i}", port)
            w.state.replicas[gone.id] = gone
            w.index.put(None, gone)
        assert _wide(w).master_port == 21003
