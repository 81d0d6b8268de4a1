"""The memory store and leadership fakes: what app unit tests rely on beyond the shared contract.

The full store contract (round trips, atomicity, event filters) runs against the
fake as well as SQLite and PostgreSQL in tests/integration/test_controller_store.py.
"""

from __future__ import annotations

import msgspec
import pytest

from llmgw.controller.fleet.records import Changes, Event, Node, Replica, Shard
from llmgw.controller.store import (
    FencedStore,
    MemoryLeadership,
    MemoryStore,
    NotLeader,
    StoreError,
    open_leadership,
    open_store,
)
from llmgw.controller.store.codec import SCHEMA_VERSION


def node(name: str = "n1", **kw: object) -> Node:
    return Node(name=name, address="10.0.0.1", **kw)  # type: ignore[arg-type]


def replica(rid: str = "r1", state: str = "pending") -> Replica:
    return Replica(
        id=rid,
        model="m",
        state=state,  # type: ignore[arg-type]
        shards=(Shard(node="n1", rank=0, gpus=(0,)),),
        created_at=1.0,
        state_since=1.0,
        updated_at=1.0,
    )


def event(subject_id: str = "r1") -> Event:
    return Event(
        id=0, at=1.0, kind="replica.placed", subject="replica", subject_id=subject_id,
        model="m", message="placed",
    )  # fmt: skip


class TestMemoryStore:
    """The memory store behaves like the database store where app tests rely on it."""

    def test_open_memory_url(self) -> None:
        """memory:// opens a fresh, empty MemoryStore at the current schema version."""
        s = open_store("memory://")
        assert isinstance(s, MemoryStore)
        assert (s.load().nodes, s.schema_version()) == ({}, SCHEMA_VERSION)

    def test_load_is_a_copy(self) -> None:
        """Mutating a loaded FleetState does not change the store."""
        s = MemoryStore()
        s.apply(Changes(nodes=[node()]))
        s.load().nodes.clear()
        assert list(s.load().nodes) == ["n1"]

    def test_apply_returns_events_with_ids(self) -> None:
        """Events come back in order with ids 1, 2, … assigned."""
        s = MemoryStore()
        assert [e.id for e in s.apply(Changes(events=[event(), event()]))] == [1, 2]
        assert [e.id for e in s.apply(Changes(events=[event()]))] == [3]

    def test_constraint_refusal_applies_nothing(self) -> None:
        """A state the database's CHECK would refuse raises StoreError and writes nothing."""
        s = MemoryStore()
        with pytest.raises(StoreError, match="bogus"):
            s.apply(Changes(nodes=[node()], replicas=[replica(state="bogus")], events=[event()]))
        assert (s.load().nodes, s.events()) == ({}, [])

    def test_values_round_trip_like_the_database(self) -> None:
        """Labels that are not strings fail in the fake as they would on load from SQL."""
        s = MemoryStore()
        with pytest.raises(msgspec.ValidationError):
            s.apply(Changes(nodes=[node(labels={"gpu-count": 8})]))
        assert s.load().nodes == {}

    def test_fail_next_apply_hook(self) -> None:
        """The failure hook refuses one apply, applies nothing, then clears itself."""
        s = MemoryStore()
        s.fail_next_apply = StoreError("database went away")
        with pytest.raises(StoreError, match="went away"):
            s.apply(Changes(nodes=[node()]))
        assert s.load().nodes == {}
        s.apply(Changes(nodes=[node()]))
        assert list(s.load().nodes) == ["n1"]

    def test_closed_store_refuses(self) -> None:
        """After close every call raises StoreError."""
        s = MemoryStore()
        s.close()
        with pytest.raises(StoreError, match="closed"):
            s.load()

    def test_unknown_url(self) -> None:
        """An unsupported URL scheme is a StoreError."""
        with pytest.raises(StoreError, match="unsupported"):
            open_store("redis://x")


class TestMemoryLeadership:
    """The memory leadership fake's terms and its lose hook."""

    def test_plain_memory_url_always_leads(self) -> None:
        """Each memory:// leadership leads alone: memory:// means one controller."""
        a, b = open_leadership("memory://"), open_leadership("memory://")
        try:
            assert (a.try_acquire(), b.try_acquire()) == (True, True)
        finally:
            a.release()
            b.release()

    def test_named_instances_exclude_each_other(self) -> None:
        """Two leaderships with one name behave like two controllers on one database."""
        a, b = MemoryLeadership("shared-x"), MemoryLeadership("shared-x")
        try:
            assert a.try_acquire()
            assert not b.try_acquire()
            assert a.holder() is not None
            a.release()
            assert b.try_acquire()
            assert not a.still_leader()
        finally:
            a.release()
            b.release()

    def test_lose_hook(self) -> None:
        """lose() drops leadership as a dead database connection would."""
        a = MemoryLeadership("lose-x")
        assert a.try_acquire()
        a.lose()
        assert (a.still_leader(), a.holder()) == (False, None)


class TestFencedStore:
    """The fenced store writes only while it leads."""

    def test_writes_need_leadership(self) -> None:
        """A FencedStore refuses apply without leadership and passes reads through."""
        lead = MemoryLeadership("fence-x")
        s = FencedStore(MemoryStore(), lead)
        with pytest.raises(NotLeader):
            s.apply(Changes(nodes=[node()]))
        assert lead.try_acquire()
        try:
            s.apply(Changes(nodes=[node()], events=[event()]))
            assert (list(s.load().nodes), len(s.events(replica="r1"))) == (["n1"], 1)
            lead.lose()
            with pytest.raises(NotLeader):
                s.apply(Changes(deleted_nodes=["n1"]))
        finally:
            lead.release()
            s.close()


class TestFleetLosingLeadership:
    """A refused write ends the fleet's term at once."""

    async def test_a_refused_write_ends_the_term_at_once(self) -> None:
        """A write fenced off (lock lost) makes the fleet a standby now, not at the next tick."""
        from llmgw.controller.config import ControllerConfig
        from llmgw.controller.errors import NotLeading, StoreUnavailable
        from llmgw.controller.fleet.live import Fleet
        from llmgw.runtime.clock import ManualClock
        from llmgw.wire.agent import Heartbeat

        lead = MemoryLeadership("fence-fleet")
        assert lead.try_acquire()
        fleet = Fleet(
            FencedStore(MemoryStore(), lead), clock=ManualClock(), config=ControllerConfig()
        )
        fleet.begin_term()
        try:
            await fleet.heartbeat(Heartbeat(node="a", address="10.0.0.1", gpus=()))
            lead.lose()
            with pytest.raises((NotLeading, StoreUnavailable)):
                await fleet.heartbeat(
                    Heartbeat(node="a", address="10.0.0.1", gpus=(), labels={"x": "y"})
                )
            assert not fleet.leading
            # A heartbeat that changes nothing writes nothing: it must not be
            # answered from a term that is over.
            with pytest.raises(NotLeading):
                await fleet.heartbeat(Heartbeat(node="a", address="10.0.0.1", gpus=()))
        finally:
            lead.release()


class _FailingStore(MemoryStore):
    """A MemoryStore whose writes fail while `down` is set (database unreachable)."""

    down = False

    def apply(self, changes: Changes) -> list[Event]:
        if self.down:
            raise StoreError("connection refused")
        return super().apply(changes)


class TestFleetHeartbeatWhileTheStoreIsDown:
    """A heartbeat keeps a node alive while the store is down."""

    async def test_a_heartbeat_that_cannot_be_stored_still_proves_the_node_alive(self) -> None:
        """The write fails (503), but the node's last heartbeat moves on in memory."""
        from llmgw.controller.config import ControllerConfig
        from llmgw.controller.errors import StoreUnavailable
        from llmgw.controller.fleet.live import Fleet
        from llmgw.runtime.clock import ManualClock
        from llmgw.wire.agent import GPU, Heartbeat

        clock = ManualClock()
        store = _FailingStore()
        fleet = Fleet(store, clock=clock, config=ControllerConfig())
        fleet.begin_term()
        gpu = GPU(index=0, uuid="g0", name="H100", gpu_class="H100-80G", memory_mib=1)
        await fleet.heartbeat(Heartbeat(node="a", address="10.0.0.1", gpus=(gpu,)))
        store.down = True
        clock.advance(30)
        sick = msgspec.structs.replace(gpu, healthy=False, reason="xid 79")
        with pytest.raises(StoreUnavailable):
            await fleet.heartbeat(Heartbeat(node="a", address="10.0.0.1", gpus=(sick,)))
        node = fleet.state.nodes["a"]
        assert node.last_heartbeat_at == clock.wall()
        assert node.gpus == (gpu,)  # nothing else of the failed write reached memory
