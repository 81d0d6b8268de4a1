"""The agent protocol decided purely (controller/fleet/agents.py): heartbeats in, shards out."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from llmgw.controller.fleet.agents import Backoff, HeartbeatOrder, absorb_heartbeat, desired_shards
from llmgw.controller.fleet.index import FleetIndex
from llmgw.wire.agent import Heartbeat, ShardStatus
from tests.unit.controller_reconcile_world import World, gpus, spec


def _hb(w: World, node: str, **kw: object) -> Heartbeat:
    n = w.state.nodes.get(node)
    base: dict[str, object] = {
        "node": node,
        "address": n.address if n else f"{node}.lan",
        "gpus": n.gpus if n else gpus(8),
        "fabrics": n.fabrics if n else ("ib0",),
    }
    base.update(kw)
    return Heartbeat(**base)  # type: ignore[arg-type]


BACKOFF = Backoff(base_s=5.0, cap_s=40.0)


class TestRegistration:
    """A node's first heartbeat registers it, and later ones write only changes."""

    def test_first_heartbeat_registers_the_node(self) -> None:
        """An unknown node is stored with its GPUs and a registered event."""
        w = World()
        out = absorb_heartbeat(w.state, w.index, _hb(w, "a"), now=w.now, backoff=BACKOFF)
        assert out.node_changed
        assert [n.name for n in out.batch.changes.nodes] == ["a"]
        assert out.batch.changes.events[0].kind == "node.registered"

    def test_unchanged_heartbeat_writes_nothing(self) -> None:
        """Only the timestamp moved: nothing for the store, the fresh node for memory."""
        w = World()
        w.node("a")
        w.clock.advance(2)
        out = absorb_heartbeat(w.state, w.index, _hb(w, "a"), now=w.now, backoff=BACKOFF)
        assert not out.batch.changes
        assert out.node.last_heartbeat_at == w.now

    def test_operator_state_survives_heartbeats(self) -> None:
        """A cordoned node stays cordoned whatever its agent reports."""
        w = World()
        w.node("a", op="cordoned")
        out = absorb_heartbeat(
            w.state, w.index, _hb(w, "a", labels={"rack": "r1"}), now=w.now, backoff=BACKOFF
        )
        assert out.node.operator_state == "cordoned"
        assert out.node_changed

    def test_a_fabric_named_twice_is_one_fabric(self) -> None:
        """`--fabric ib0 --fabric ib0` registers the node on ib0 once, in the order given
        (the summary counted the node twice on ib0, and /metrics joined the repeats)."""
        w = World()
        hb = _hb(w, "a", fabrics=("ib1", "ib0", "ib1", "ib0"))
        out = absorb_heartbeat(w.state, w.index, hb, now=w.now, backoff=BACKOFF)
        assert out.node.fabrics == ("ib1", "ib0")

    def test_gpu_turning_unhealthy_is_an_event(self) -> None:
        """A GPU the agent now reports unhealthy is logged with its reason."""
        w = World()
        w.node("a")
        hb = _hb(w, "a", gpus=gpus(8, unhealthy=[3]))
        out = absorb_heartbeat(w.state, w.index, hb, now=w.now, backoff=BACKOFF)
        kinds = [(e.kind, e.message) for e in out.batch.changes.events]
        assert kinds == [("node.gpu_unhealthy", "GPU 3: xid 79")]


class TestShardStatus:
    """Shard reports from heartbeats move replicas between states."""

    def test_desired_shards_are_the_node_s_live_replicas(self) -> None:
        """The answer lists pending, starting, ready and draining shards, sorted, with the spec."""
        w = World()
        w.node("a")
        w.model(spec("m", min_replicas=2, gpus_per_node=2))
        w.tick()
        shards = w.heartbeat("a")
        assert [s.replica_id for s in shards] == ["r-001", "r-002"]
        assert shards[0].served_names == ("m",)
        assert shards[0].gpu_indices == (0, 1)
        assert shards[1].gpu_indices == (2, 3)

    def test_repeated_heartbeat_is_idempotent(self) -> None:
        """The same report twice changes nothing the second time and answers the same."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        first = w.heartbeat("a", {rid: "ready"})
        before = w.state.replicas[rid]
        again = w.heartbeat("a", {rid: "ready"})
        assert again == first
        assert w.state.replicas[rid] == before

    def test_unknown_replica_reports_are_ignored(self) -> None:
        """A shard the controller never placed is not adopted: the answer omits it."""
        w = World()
        w.node("a")
        hb = _hb(w, "a", shards=(ShardStatus(replica_id="r-zzz", rank=0, state="ready", port=1),))
        out = absorb_heartbeat(w.state, w.index, hb, now=w.now, backoff=BACKOFF)
        assert not out.batch.changes
        assert desired_shards(w.state, w.index, "a", retired={}) == ()

    def test_agent_that_lost_a_ready_shard_sends_it_back_to_starting(self) -> None:
        """A ready replica whose shard the agent no longer reports leaves the ready state."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        w.heartbeat("a", {rid: "ready"})
        w.heartbeat("a", {})
        r = w.state.replicas[rid]
        assert (r.state, r.endpoint_url) == ("starting", None)

    def test_draining_replica_whose_engine_exited_is_stopped(self) -> None:
        """A draining replica reported stopped is stopped, not failed and restarted."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        w.heartbeat("a", {rid: "ready"})
        w.state.replicas[rid] = dataclasses.replace(w.state.replicas[rid], state="draining")
        w.index = FleetIndex.build(w.state)
        w.heartbeat("a", {rid: "stopped"})
        assert w.state.replicas[rid].state == "stopped"

    def test_multi_node_replica_is_ready_only_when_every_shard_is(self) -> None:
        """Rank 1 ready alone is not enough; the URL is rank 0's; both get master addr and port."""
        w = World()
        w.node("a")
        w.node("b")
        w.model(spec("wide", gpus_per_node=8, nodes=2))
        w.tick()
        r = w.only("wide")
        head, tail = r.shards[0].node, r.shards[1].node
        w.heartbeat(tail, {r.id: "ready"})
        assert w.state.replicas[r.id].state == "starting"
        shards = w.heartbeat(head, {r.id: "ready"}, port=21005)
        ready = w.state.replicas[r.id]
        assert (ready.state, ready.endpoint_url) == ("ready", f"http://{head}.lan:21005")
        assert shards[0].master_addr == f"{head}.lan"
        assert shards[0].master_port == r.master_port
        assert shards[0].world_size == 2

    def test_deleted_model_s_draining_shards_use_the_retired_spec(self) -> None:
        """While a deleted model's replicas drain, the answer still describes their shards."""
        w = World()
        w.node("a")
        m = w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        w.heartbeat("a", {rid: "ready"})
        del w.state.models["m"]
        assert desired_shards(w.state, w.index, "a", retired={}) == ()
        kept = desired_shards(w.state, w.index, "a", retired={"m": m.spec})
        assert [s.replica_id for s in kept] == [rid]


class TestNulInAgentText:
    """A NUL in what an agent quotes (log lines, a GPU's reason) reaches no record."""

    def test_a_nul_in_a_failed_engine_s_log_is_replaced(self) -> None:
        """A log tail with NULs (a file's zero-filled end after a crash) fails the replica
        with U+FFFD in its place: PostgreSQL's text holds no NUL, and the heartbeat that
        carried it was a 503, again on every heartbeat, until the node went unreachable."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        st = ShardStatus(
            replica_id=rid, rank=0, state="failed", exit_code=1, log_tail=("boom", "\0\0x")
        )
        out = absorb_heartbeat(
            w.state, w.index, _hb(w, "a", shards=(st,)), now=w.now, backoff=BACKOFF
        )
        texts = [r.reason or "" for r in out.batch.changes.replicas]
        texts += [line for r in out.batch.changes.replicas for s in r.shards for line in s.log_tail]
        texts += [e.message for e in out.batch.changes.events]
        assert "boom | \ufffd\ufffdx" in out.batch.changes.replicas[0].reason
        assert [t for t in texts if "\0" in t] == []

    def test_a_nul_in_a_gpu_s_reason_is_replaced(self) -> None:
        """A GPU turning unhealthy with a NUL in its reason is kept and told with U+FFFD."""
        w = World()
        w.node("a")
        sick = msgspec.structs.replace(gpus(8)[0], healthy=False, reason="xid\0 79")
        hb = _hb(w, "a", gpus=(sick, *gpus(8)[1:]))
        out = absorb_heartbeat(w.state, w.index, hb, now=w.now, backoff=BACKOFF)
        assert out.node.gpus[0].reason == "xid\ufffd 79"
        assert [e.message for e in out.batch.changes.events] == ["GPU 0: xid\ufffd 79"]


class TestHeartbeatOrder:
    """Heartbeats are applied in sequence order within one agent process."""

    def test_late_heartbeat_does_not_demote_a_ready_replica(self) -> None:
        """A 'starting' report delivered after a newer 'ready' one is answered, not applied."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        w.heartbeat("a", {rid: "starting"}, seq=1, started_at=100.0)
        answer = w.heartbeat("a", {rid: "ready"}, seq=3, started_at=100.0)
        ready = w.state.replicas[rid]
        assert ready.state == "ready"
        late = w.heartbeat("a", {rid: "starting"}, seq=2, started_at=100.0)
        assert w.state.replicas[rid] == ready
        assert late == answer
        # The same seq again (a retried send) is as stale as an older one.
        w.heartbeat("a", {rid: "starting"}, seq=3, started_at=100.0)
        assert w.state.replicas[rid].state == "ready"

    def test_order_compares_seq_within_one_agent_process(self) -> None:
        """Stale means same agent_started_at and seq at most the last applied; forget resets."""
        order = HeartbeatOrder()
        hb = Heartbeat(node="a", address="a.lan", gpus=(), agent_started_at=100.0, seq=5)
        assert not order.is_stale(hb)
        order.applied(hb)
        assert order.is_stale(msgspec.structs.replace(hb, seq=4))
        assert order.is_stale(hb)
        assert not order.is_stale(msgspec.structs.replace(hb, seq=6))
        assert not order.is_stale(msgspec.structs.replace(hb, seq=1, agent_started_at=101.0))
        assert not order.is_stale(msgspec.structs.replace(hb, node="b", seq=1))
        order.forget("a")
        assert not order.is_stale(msgspec.structs.replace(hb, seq=1))

    def test_restarted_agent_s_low_seq_is_applied(self) -> None:
        """A new agent_started_at starts the count again, even when the clock went back."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        w.heartbeat("a", {rid: "ready"}, seq=50, started_at=100.0)
        w.heartbeat("a", {rid: "starting"}, seq=1, started_at=200.0)
        assert w.state.replicas[rid].state == "starting"
        w.heartbeat("a", {rid: "ready"}, seq=2, started_at=200.0)
        assert w.state.replicas[rid].state == "ready"
        # A wall clock stepped back across a restart must not silence the agent.
        w.heartbeat("a", {rid: "starting"}, seq=1, started_at=150.0)
        assert w.state.replicas[rid].state == "starting"

    def test_seq_zero_is_always_applied(self) -> None:
        """An agent that does not number heartbeats is applied as before seq existed."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        w.heartbeat("a", {rid: "ready"}, seq=7, started_at=100.0)
        w.heartbeat("a", {rid: "starting"}, seq=0, started_at=100.0)
        assert w.state.replicas[rid].state == "starting"
        w.heartbeat("a", {rid: "ready"})
        w.heartbeat("a", {rid: "starting"})
        assert w.state.replicas[rid].state == "starting"

    async def test_fleet_answers_a_stale_heartbeat_without_applying_it(self) -> None:
        """The leader replies to a late heartbeat with the desired set; a new term applies it."""
        from llmgw.controller.config import ControllerConfig
        from llmgw.controller.fleet.live import Fleet
        from llmgw.controller.store import MemoryStore
        from llmgw.runtime.clock import ManualClock

        fleet = Fleet(MemoryStore(), clock=ManualClock(), config=ControllerConfig())
        fleet.begin_term()
        fresh = Heartbeat(node="a", address="10.0.0.1", gpus=gpus(2), agent_started_at=9.0, seq=2)
        late = msgspec.structs.replace(fresh, gpus=gpus(2, unhealthy=[1]), seq=1)
        await fleet.heartbeat(fresh)
        reply = await fleet.heartbeat(late)
        assert reply.shards == ()
        assert fleet.state.nodes["a"].gpus == gpus(2)
        # Memory only: after a takeover the first heartbeat is applied whatever its seq.
        fleet.end_term()
        fleet.begin_term()
        await fleet.heartbeat(late)
        assert fleet.state.nodes["a"].gpus == gpus(2, unhealthy=[1])


class TestNodeNameClaims:
    """A second agent claiming a live node's name from another address is refused."""

    def test_pure_rule(self) -> None:
        """name_claimed names the claimant and the last heartbeat; the same address passes."""
        from llmgw.controller.fleet.agents import name_claimed
        from llmgw.controller.fleet.records import Node

        old = Node(name="a", address="10.0.0.1", last_heartbeat_at=100.0)
        other = Heartbeat(node="a", address="10.0.0.9", gpus=())
        same = Heartbeat(node="a", address="10.0.0.1", gpus=())
        why = name_claimed(old, other, now=105.0, timeout_s=10.0)
        assert why is not None
        assert "10.0.0.9 claims node 'a'" in why
        assert "agent at 10.0.0.1 heartbeated 5s ago" in why
        assert name_claimed(old, same, now=105.0, timeout_s=10.0) is None
        # Silent past the timeout: the node may move (a replaced host, a new address).
        assert name_claimed(old, other, now=111.0, timeout_s=10.0) is None
        assert name_claimed(None, other, now=105.0, timeout_s=10.0) is None

    async def test_fleet_refuses_with_409_and_one_event(self) -> None:
        """Fleet refuses with 409 and one event."""
        from llmgw.controller.api.http import http_status
        from llmgw.controller.config import ControllerConfig
        from llmgw.controller.errors import Conflict
        from llmgw.controller.fleet.live import Fleet
        from llmgw.controller.store import MemoryStore
        from llmgw.runtime.clock import ManualClock

        clock = ManualClock()
        store = MemoryStore()
        fleet = Fleet(store, clock=clock, config=ControllerConfig(heartbeat_timeout_s=10.0))
        fleet.begin_term()
        first = Heartbeat(node="a", address="10.0.0.1", gpus=gpus(2), agent_started_at=1.0, seq=1)
        await fleet.heartbeat(first)
        before = fleet.state.nodes["a"]
        impostor = Heartbeat(
            node="a", address="10.0.0.9", gpus=gpus(8), agent_started_at=2.0, seq=1
        )
        for _ in range(3):
            clock.advance(1)
            with pytest.raises(Conflict) as err:
                await fleet.heartbeat(impostor)
            assert err.value.param == "node"
            assert http_status(err.value)[0] == 409
        # The first node's record is untouched (address, GPUs, heartbeat time).
        assert fleet.state.nodes["a"] == before
        events = [e for e in store.events(limit=50) if e.kind == "node.name_conflict"]
        assert len(events) == 1
        assert "10.0.0.9" in events[0].message
        # The rightful agent keeps heartbeating, unaffected.
        await fleet.heartbeat(msgspec.structs.replace(first, seq=2))
        assert fleet.state.nodes["a"].address == "10.0.0.1"
        # Once it has been silent past the timeout, the name may move.
        clock.advance(11)
        await fleet.heartbeat(msgspec.structs.replace(impostor, seq=2))
        assert fleet.state.nodes["a"].address == "10.0.0.9"
