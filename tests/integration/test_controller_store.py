"""The controller store's contract, run for real on SQLite and PostgreSQL (and the memory fake).

Every test in the contract classes runs once per backend; the fake runs the
same contract so app tests written against it mean what they would in
production. PostgreSQL tests use a fresh schema each and are skipped, saying
why, only when the server cannot be reached.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from llmgw.controller.fleet.records import Changes, Event, Model, Node, Replica, Reservation, Shard
from llmgw.controller.store import (
    FencedStore,
    Leadership,
    NotLeader,
    SchemaTooNew,
    Store,
    StoreError,
    open_leadership,
    open_store,
)
from llmgw.controller.store import tables as store_tables
from llmgw.controller.store.codec import SCHEMA_VERSION
from llmgw.controller.store.postgres import open_postgres_store, pg_url
from llmgw.testing.wait import wait_until
from llmgw.wire.agent import GPU
from llmgw.wire.models import ModelSpec
from tests.integration import pg
from tests.integration.pg import PgSchema, fresh_schema

# Shared fixtures live in pg.py (there is no integration conftest); a module sees a
# fixture by having it as a global.
pg_schema = pg.pg_schema


@dataclass
class Backend:
    """One database to run the contract on, and how to reach it."""

    name: str
    url: str
    schema: str | None = None
    pg: PgSchema | None = None

    @property
    def persistent(self) -> bool:
        return self.name != "memory"

    def open(self) -> Store:
        return open_store(self.url, schema=self.schema)

    def leadership(self) -> Leadership:
        return open_leadership(self.url, schema=self.schema)

    def engine(self) -> sa.Engine:
        """A plain SQLAlchemy engine on the same database, to play an older or newer llmgw."""
        if self.pg is not None:
            return sa.create_engine(
                pg_url(self.url), connect_args={"options": f"-csearch_path={self.schema}"}
            )
        Path(self.url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        return sa.create_engine(self.url)

    def at_version(self, conn: sa.Connection, version: int) -> None:
        """Make the database (through `conn`, of `engine()`) as llmgw's schema `version`
        left it: its schema (PostgreSQL), the migrations up to it, and its version row."""
        if self.pg is not None:
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        for v, step in store_tables.MIGRATIONS:
            if v <= version:
                step(conn)
        conn.exec_driver_sql(
            f"INSERT INTO meta (key, value) VALUES ('schema_version', '{version}')"
        )


@contextmanager
def _backend(name: str, tmp_path: Path) -> Iterator[Backend]:
    if name == "sqlite":
        yield Backend(name, f"sqlite:///{tmp_path}/state/controller.db")
    elif name == "postgres":
        with fresh_schema() as pg:
            yield Backend(name, pg.url, pg.schema, pg)
    else:
        # A name of its own, so two leadership objects in one test share a lock.
        yield Backend(name, f"memory://test-{uuid.uuid4().hex}")


ALL = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
SQL = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=ALL)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with _backend(request.param, tmp_path) as b:
        yield b


@pytest.fixture(params=SQL)
def sql_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with _backend(request.param, tmp_path) as b:
        yield b


@pytest.fixture
def store(backend: Backend) -> Iterator[Store]:
    s = backend.open()
    try:
        yield s
    finally:
        s.close()


# ---- values -------------------------------------------------------------------------------


def gpu(i: int, *, healthy: bool = True) -> GPU:
    return GPU(
        index=i,
        uuid=f"GPU-{i:04d}",
        name="NVIDIA H100 80GB HBM3",
        gpu_class="H100-80G",
        memory_mib=81_559,
        healthy=healthy,
        reason=None if healthy else "XID 79: fell off the bus",
    )


def node(name: str = "n1", **kw: object) -> Node:
    base = Node(
        name=name,
        address="10.0.0.7",
        fabrics=("ib0", "eth0"),
        labels={"zone": "eu-1", "rack": "r7 «β»"},
        gpus=(gpu(0), gpu(1, healthy=False)),
        operator_state="cordoned",
        last_heartbeat_at=1_700_000_000.25,
        agent_started_at=1_699_999_000.5,
        port_range=(30000, 30099),
        drain_grace_s=45.5,
        drain_force=True,
        drain_evict_idle=True,
        host_memory_mib=2_097_152,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def held(name: str = "llama", victims: tuple[str, ...] = ("r2", "r1")) -> Reservation:
    return Reservation(model=name, victims=frozenset(victims), gpus=(("n1", (0, 1)), ("n2", (4,))))


def model(name: str = "llama", **kw: object) -> Model:
    spec = ModelSpec(
        name=name,
        engine="vllm",
        gpu_classes=("H100-80G", "H200-141G"),
        aliases=(f"{name}-alias",),
        gpus_per_node=4,
        nodes=2,
        min_replicas=1,
        max_replicas=3,
        idle_timeout_s=123.5,
        priority=-2,
        source="meta-llama/Llama-3-70B",
        args=("--max-model-len", "8192"),
        env={"VLLM_X": "1"},
    )
    base = Model(spec=spec, created_at=1.5, updated_at=2.5, desired_replicas=2)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def replica(rid: str = "r1", **kw: object) -> Replica:
    base = Replica(
        id=rid,
        model="llama",
        state="draining",
        shards=(
            Shard(
                node="n1",
                rank=0,
                gpus=(0, 1, 2, 3),
                port=21001,
                state="ready",
                pid=4242,
                exit_code=None,
                log_tail=("loading", "ready ✓"),
            ),
            Shard(node="n2", rank=1, gpus=(4, 5, 6, 7), state="failed", exit_code=137),
        ),
        created_at=10.0,
        state_since=11.0,
        updated_at=12.0,
        reason="node n1 drained",
        endpoint_url="http://10.0.0.7:21001",
        restarts=3,
        pool="ib0/H100-80G",
        weight=1.75,
        capacity_tok_s=812.5,
        replaces="r0",
        retry_at=99.5,
        drain_deadline=130.0,
        master_port=29500,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def event(
    kind: str = "replica.placed",
    *,
    subject: str = "replica",
    subject_id: str = "r1",
    model: str | None = "llama",
    at: float = 5.0,
) -> Event:
    return Event(
        id=0,
        at=at,
        kind=kind,
        subject=subject,  # type: ignore[arg-type]
        subject_id=subject_id,
        model=model,
        message=f"{kind} on {subject_id}: 'quoted' ünïcode",
    )


def without_ids(events: list[Event]) -> list[Event]:
    return [dataclasses.replace(e, id=0) for e in events]


# ---- contract -----------------------------------------------------------------------------


class TestRoundTrip:
    """Every record's fields round-trip through the store."""

    def test_node_every_field(self, store: Store) -> None:
        """A node with every field set comes back equal."""
        n = node()
        store.apply(Changes(nodes=[n]))
        assert {"n1": n} == store.load().nodes

    def test_node_defaults(self, store: Store) -> None:
        """A node with defaults (no GPUs, never heartbeated) keeps its Nones and empties."""
        n = Node(name="bare", address="h")
        store.apply(Changes(nodes=[n]))
        assert n == store.load().nodes["bare"]

    def test_model_every_field(self, store: Store) -> None:
        """A model's whole spec and bookkeeping come back equal."""
        m = model()
        store.apply(Changes(models=[m]))
        assert {"llama": m} == store.load().models

    def test_replica_every_field(self, store: Store) -> None:
        """A replica with every field and multi-node shards comes back equal."""
        r = replica()
        store.apply(Changes(replicas=[r]))
        assert {"r1": r} == store.load().replicas

    def test_replica_unknowns_stay_none(self, store: Store) -> None:
        """Unknown values (port, url, deadlines) come back None, never 0."""
        r = Replica(
            id="p", model="m", state="pending", shards=(Shard(node="n", rank=0, gpus=(0,)),),
            created_at=1.0, state_since=1.0, updated_at=1.0,
        )  # fmt: skip
        store.apply(Changes(replicas=[r]))
        assert r == store.load().replicas["p"]

    def test_retired_spec_every_field(self, store: Store) -> None:
        """A deleted model's spec kept for its draining replicas comes back equal."""
        spec = model().spec
        store.apply(Changes(retired=[spec]))
        assert {"llama": spec} == store.load().retired

    def test_reservation_every_field(self, store: Store) -> None:
        """Room held for an evicting model (victims and cards) comes back equal."""
        store.apply(Changes(reservations=[held()]))
        assert {"llama": held()} == store.load().reservations

    def test_event_every_field(self, store: Store) -> None:
        """Events come back with every field, and the model may be None."""
        given = [event(), event("node.unreachable", subject="node", subject_id="n1", model=None)]
        written = store.apply(Changes(events=given))
        assert given == without_ids(written)
        assert written == store.events()


class TestApply:
    """Applying changes is atomic, ordered and refused whole."""

    def test_upsert_replaces(self, store: Store) -> None:
        """Writing a key again replaces the stored value."""
        store.apply(Changes(nodes=[node()], replicas=[replica()]))
        store.apply(Changes(nodes=[node(operator_state="active")], replicas=[replica(restarts=4)]))
        state = store.load()
        assert state.nodes["n1"].operator_state == "active"
        assert state.replicas["r1"].restarts == 4

    def test_last_value_wins_within_one_apply(self, store: Store) -> None:
        """The same key twice in one apply stores the last value."""
        store.apply(Changes(replicas=[replica(state="starting"), replica(state="ready")]))
        assert store.load().replicas["r1"].state == "ready"

    def test_deletes(self, store: Store) -> None:
        """Deleted nodes, models and replicas are gone; the others stay."""
        store.apply(
            Changes(
                nodes=[node("a"), node("b")],
                models=[model("x"), model("y")],
                replicas=[replica("r1"), replica("r2")],
            )
        )
        store.apply(Changes(deleted_nodes=["a"], deleted_models=["x"], deleted_replicas=["r1"]))
        state = store.load()
        assert (
            list(state.nodes),
            list(state.models),
            list(state.replicas),
        ) == (["b"], ["y"], ["r2"])

    def test_retired_and_reservations_upsert_and_delete(self, store: Store) -> None:
        """Retired specs and reservations are replaced by key and deleted by name."""
        store.apply(
            Changes(
                retired=[model("x").spec, model("y").spec],
                reservations=[held("x"), held("y")],
            )
        )
        store.apply(
            Changes(
                reservations=[held("y", victims=("r9",))],
                deleted_retired=["x"],
                deleted_reservations=["x", "ghost"],
            )
        )
        state = store.load()
        assert (["y"], {"y": held("y", victims=("r9",))}) == (
            list(state.retired),
            state.reservations,
        )

    def test_delete_after_upsert_in_one_apply(self, store: Store) -> None:
        """A key upserted and deleted in one apply ends deleted."""
        store.apply(Changes(replicas=[replica()], deleted_replicas=["r1"]))
        assert store.load().replicas == {}

    def test_deleting_absent_is_not_an_error(self, store: Store) -> None:
        """Deleting keys that do not exist changes nothing and does not fail."""
        store.apply(Changes(nodes=[node()]))
        store.apply(Changes(deleted_nodes=["ghost"], deleted_replicas=["ghost"] * 2))
        assert list(store.load().nodes) == ["n1"]

    def test_empty_changes(self, store: Store) -> None:
        """An empty change set writes nothing and returns no events."""
        assert store.apply(Changes()) == []

    def test_event_ids_ascend_across_applies(self, store: Store) -> None:
        """Ids are assigned in order, strictly ascending across transactions."""
        first = store.apply(Changes(events=[event(at=1), event(at=2)]))
        second = store.apply(Changes(events=[event(at=3)]))
        ids = [e.id for e in first + second]
        assert sorted(set(ids)) == ids
        assert [e.at for e in first + second] == [1.0, 2.0, 3.0]

    def test_constraint_violation_applies_nothing(self, store: Store) -> None:
        """One row breaking a constraint rolls back every other part of the change."""
        store.apply(Changes(nodes=[node("keep")], replicas=[replica("old")]))
        bad = Changes(
            nodes=[node("new")],
            models=[model()],
            replicas=[replica("r2"), replica("r3", state="bogus")],
            deleted_nodes=["keep"],
            deleted_replicas=["old"],
            events=[event()],
        )
        with pytest.raises(StoreError):
            store.apply(bad)
        state = store.load()
        assert (
            list(state.nodes),
            list(state.models),
            list(state.replicas),
            store.events(),
        ) == (["keep"], [], ["old"], [])

    def test_bad_event_subject_applies_nothing(self, store: Store) -> None:
        """An event refused after the rows were written takes the rows with it."""
        with pytest.raises(StoreError):
            store.apply(Changes(nodes=[node()], events=[event(subject="planet")]))
        assert (store.load().nodes, store.events()) == ({}, [])

    def test_exception_midway_applies_nothing(self, store: Store) -> None:
        """A value that cannot be encoded, met after other rows, leaves nothing applied."""
        broken = Shard(node="n1", rank=0, gpus=(0,), log_tail=(object(),))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.apply(
                Changes(nodes=[node()], models=[model()], replicas=[replica(shards=(broken,))])
            )
        state = store.load()
        assert (state.nodes, state.models, state.replicas) == ({}, {}, {})

    def test_a_tick_of_a_thousand_replicas(self, store: Store) -> None:
        """A thousand replica upserts and events go in one apply, quickly even on a busy machine."""
        rs = [replica(f"r{i:04d}") for i in range(1000)]
        evs = [event(subject_id=r.id) for r in rs]
        t0 = time.perf_counter()
        written = store.apply(Changes(replicas=rs, events=evs))
        elapsed = time.perf_counter() - t0
        assert len(store.load().replicas) == 1000
        assert len({e.id for e in written}) == 1000
        assert elapsed < 5.0, f"apply of 1,000 replicas took {elapsed:.2f} s"

    def test_loads_overlap_writes_and_see_whole_transactions(self, store: Store) -> None:
        """Loads in other threads during writes never fail and never see half a transaction."""
        stop = threading.Event()
        seen: list[tuple[float | None, set[float]]] = []
        errors: list[Exception] = []

        def read() -> None:
            while not stop.is_set():
                try:
                    state = store.load()
                except Exception as exc:  # noqa: BLE001 -- asserted empty below, with the error
                    errors.append(exc)
                    return
                if state.nodes:
                    seen.append(
                        (
                            state.nodes["n1"].last_heartbeat_at,
                            {r.updated_at for r in state.replicas.values()},
                        )
                    )

        reader = threading.Thread(target=read)
        reader.start()
        try:
            for n in range(1, 21):
                at = float(n)
                store.apply(
                    Changes(
                        nodes=[node(last_heartbeat_at=at)],
                        replicas=[replica(f"r{i:03d}", updated_at=at) for i in range(200)],
                    )
                )
        finally:
            stop.set()
            reader.join()
        assert errors == []
        assert seen, "the reader never saw a committed state"
        assert all({hb} == ats for hb, ats in seen)

    def test_closed_store_refuses(self, backend: Backend) -> None:
        """After close every call raises StoreError instead of quietly reconnecting."""
        s = backend.open()
        s.close()
        with pytest.raises(StoreError):
            s.load()
        with pytest.raises(StoreError):
            s.apply(Changes(nodes=[node()]))


class TestEvents:
    """Event queries by subject, order and limit."""

    @pytest.fixture
    def written(self, store: Store) -> list[Event]:
        return store.apply(
            Changes(
                events=[
                    event("model.applied", subject="model", subject_id="llama", at=1),
                    event("replica.placed", subject_id="r1", at=2),
                    event("node.cordoned", subject="node", subject_id="n1", model=None, at=3),
                    event("replica.placed", subject_id="r2", model="qwen", at=4),
                    event("replica.ready", subject_id="r1", at=5),
                    event("controller.leader", subject="controller", subject_id="c1", model=None),
                ]
            )
        )

    def test_all_oldest_first(self, store: Store, written: list[Event]) -> None:
        """Without filters every event comes back, oldest first."""
        assert written == store.events()

    def test_by_model(self, store: Store, written: list[Event]) -> None:
        """The model filter matches the event's model, whatever its subject."""
        assert [written[0], written[1], written[4]] == store.events(model="llama")

    def test_by_replica(self, store: Store, written: list[Event]) -> None:
        """The replica filter matches events about that replica only."""
        assert [written[1], written[4]] == store.events(replica="r1")

    def test_by_node(self, store: Store, written: list[Event]) -> None:
        """The node filter matches events about that node, not replicas named alike."""
        assert [written[2]] == store.events(node="n1")

    def test_filters_combine(self, store: Store, written: list[Event]) -> None:
        """Several filters must all match."""
        assert store.events(model="qwen", replica="r1") == []
        assert [written[3]] == store.events(model="qwen", replica="r2")

    def test_limit_keeps_the_newest(self, store: Store, written: list[Event]) -> None:
        """A limit returns the last N matching, still oldest first."""
        assert written[-2:] == store.events(limit=2)
        assert [written[4]] == store.events(replica="r1", limit=1)

    def test_limit_zero(self, store: Store, written: list[Event]) -> None:
        """A limit of zero returns nothing."""
        assert store.events(limit=0) == []


class TestReopen:
    """A reopened store keeps everything."""

    def test_reopen_keeps_everything(self, backend: Backend) -> None:
        """Closing and reopening loses nothing, and new event ids continue after the old."""
        if not backend.persistent:
            pytest.skip("memory:// keeps nothing by design")
        s = backend.open()
        old = s.apply(
            Changes(
                nodes=[node()],
                models=[model()],
                replicas=[replica()],
                events=[event()],
                retired=[model("gone").spec],
                reservations=[held()],
            )
        )
        s.close()
        s = backend.open()
        try:
            state = s.load()
            assert (node(), model(), replica(), model("gone").spec, held()) == (
                state.nodes["n1"],
                state.models["llama"],
                state.replicas["r1"],
                state.retired["gone"],
                state.reservations["llama"],
            )
            assert old == s.events()
            new = s.apply(Changes(events=[event()]))
            assert new[0].id > old[0].id
        finally:
            s.close()


class TestSchema:
    """Schema creation and upgrades from every older version."""

    def test_fresh_database_is_current(self, sql_backend: Backend) -> None:
        """A new database is created at the current schema version."""
        s = sql_backend.open()
        try:
            assert s.schema_version() == SCHEMA_VERSION
        finally:
            s.close()

    def test_v1_database_upgrades_without_losing_rows(self, sql_backend: Backend) -> None:
        """A v1 database is migrated in place: its rows survive, new columns take defaults."""
        engine = sql_backend.engine()
        try:
            with engine.begin() as conn:
                if sql_backend.pg is not None:
                    conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{sql_backend.schema}"')
                version, create_v1 = store_tables.MIGRATIONS[0]
                assert version == 1
                create_v1(conn)
                conn.exec_driver_sql("INSERT INTO meta (key, value) VALUES ('schema_version', '1')")
                conn.exec_driver_sql(
                    "INSERT INTO nodes (name, address, fabrics, labels, gpus, operator_state,"
                    " last_heartbeat_at, agent_started_at)"
                    """ VALUES ('old', 'h', '["ib0"]', '{"a":"b"}', '[]', 'active', 7.0, NULL)"""
                )
                conn.exec_driver_sql(
                    "INSERT INTO replicas (id, model, state, shards, created_at, state_since,"
                    " updated_at, reason, endpoint_url, restarts, pool, weight, replaces,"
                    " retry_at, drain_deadline) VALUES ('r-old', 'm', 'ready',"
                    """ '[{"node":"old","rank":0,"gpus":[0]}]', 1, 2, 3, NULL,"""
                    " 'http://h:1', 0, 'ib0/X', 1.0, NULL, NULL, NULL)"
                )
                conn.exec_driver_sql(
                    "INSERT INTO events (at, kind, subject, subject_id, model, message)"
                    " VALUES (1.0, 'replica.ready', 'replica', 'r-old', 'm', 'was ready')"
                )
        finally:
            engine.dispose()
        s = sql_backend.open()
        try:
            assert s.schema_version() == SCHEMA_VERSION
            state = s.load()
            assert (
                Node(
                    name="old",
                    address="h",
                    fabrics=("ib0",),
                    labels={"a": "b"},
                    last_heartbeat_at=7.0,
                    port_range=(21000, 21999),
                )
                == state.nodes["old"]
            )
            r = state.replicas["r-old"]
            assert (None, (Shard(node="old", rank=0, gpus=(0,)),)) == (r.master_port, r.shards)
            assert [e.message for e in s.events(replica="r-old")] == ["was ready"]
        finally:
            s.close()

    def test_v3_database_upgrades_to_v4(self, sql_backend: Backend) -> None:
        """A v3 database mid-drain gains the drain options (defaults) and empty new tables."""
        engine = sql_backend.engine()
        try:
            with engine.begin() as conn:
                sql_backend.at_version(conn, 3)
                conn.exec_driver_sql(
                    "INSERT INTO nodes (name, address, fabrics, labels, gpus, operator_state,"
                    " last_heartbeat_at, agent_started_at, port_lo, port_hi)"
                    """ VALUES ('d', 'h', '[]', '{}', '[]', 'draining', 7.0, NULL, 100, 199)"""
                )
                conn.exec_driver_sql(
                    "INSERT INTO replicas (id, model, state, shards, created_at, state_since,"
                    " updated_at, reason, endpoint_url, restarts, pool, weight, replaces,"
                    " retry_at, drain_deadline, master_port, capacity_tok_s) VALUES ('r3', 'm',"
                    """ 'draining', '[{"node":"d","rank":0,"gpus":[0]}]', 1, 2, 3, 'x', NULL,"""
                    " 0, 'p', 1.0, NULL, NULL, 60.0, NULL, 512.0)"
                )
        finally:
            engine.dispose()
        s = sql_backend.open()
        try:
            assert s.schema_version() == SCHEMA_VERSION
            state = s.load()
            n = state.nodes["d"]
            assert (
                n.operator_state,
                n.drain_grace_s,
                n.drain_force,
                n.port_range,
            ) == ("draining", None, False, (100, 199))
            assert not n.drain_evict_idle
            r = state.replicas["r3"]
            assert (r.drain_deadline, r.capacity_tok_s) == (60.0, 512.0)
            assert (state.retired, state.reservations) == ({}, {})
            s.apply(Changes(retired=[model("m").spec], reservations=[held("m")]))
            after = s.load()
            assert (list(after.retired), list(after.reservations)) == (["m"], ["m"])
        finally:
            s.close()

    def test_v5_database_upgrades_to_v6_and_takes_sleeping_replicas(
        self, sql_backend: Backend
    ) -> None:
        """A v5 database keeps its replicas and then stores sleeping ones with their level."""
        engine = sql_backend.engine()
        try:
            with engine.begin() as conn:
                sql_backend.at_version(conn, 5)
                conn.exec_driver_sql(
                    "INSERT INTO replicas (id, model, state, shards, created_at, state_since,"
                    " updated_at, reason, endpoint_url, restarts, pool, weight, replaces,"
                    " retry_at, drain_deadline, master_port, capacity_tok_s) VALUES ('r5', 'm',"
                    """ 'ready', '[{"node":"d","rank":0,"gpus":[0]}]', 1, 2, 3, 'x', NULL,"""
                    " 0, 'p', 1.0, NULL, NULL, NULL, NULL, NULL)"
                )
        finally:
            engine.dispose()
        s = sql_backend.open()
        try:
            assert s.schema_version() == SCHEMA_VERSION
            r = s.load().replicas["r5"]
            assert (r.state, r.sleep_level) == ("ready", None)
            s.apply(Changes(replicas=[replica("r6", state="sleeping", sleep_level=1)]))
            s.apply(Changes(replicas=[replica("r7", state="waking")]))
            after = s.load().replicas
            assert (after["r6"].state, after["r6"].sleep_level) == ("sleeping", 1)
            assert after["r7"].state == "waking"
        finally:
            s.close()

    def test_newer_schema_is_refused_and_untouched(self, sql_backend: Backend) -> None:
        """A database from a newer llmgw raises SchemaTooNew and keeps its version and rows."""
        s = sql_backend.open()
        s.apply(Changes(nodes=[node()]))
        s.close()
        engine = sql_backend.engine()
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
            with pytest.raises(SchemaTooNew) as info:
                sql_backend.open()
            assert (info.value.found, info.value.known) == (99, SCHEMA_VERSION)
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT value FROM meta").scalar() == "99"
                assert conn.exec_driver_sql("SELECT count(*) FROM nodes").scalar() == 1
        finally:
            engine.dispose()

    def test_concurrent_opens_migrate_once(self, sql_backend: Backend) -> None:
        """Two controllers opening a new database at once both succeed on one schema."""
        opened: list[Store] = []
        errors: list[BaseException] = []

        def open_one() -> None:
            try:
                opened.append(sql_backend.open())
            except Exception as exc:  # noqa: BLE001 -- asserted empty below, with the error shown
                errors.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            assert errors == []
            assert [s.schema_version() for s in opened] == [SCHEMA_VERSION] * 2
        finally:
            for s in opened:
                s.close()


class TestSqlite:
    """The SQLite store's file and refusals."""

    def test_one_private_file_in_a_new_directory(self, tmp_path: Path) -> None:
        """The URL's missing directory is created; the database is one 0600 file with a
        rollback journal (no -shm file to map) and no memory-mapped pages."""
        path = tmp_path / "a" / "b" / "c.db"
        s = open_store(f"sqlite:///{path}")
        try:
            with s.engine.connect() as conn:  # type: ignore[attr-defined]
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"
                assert conn.exec_driver_sql("PRAGMA mmap_size").scalar() == 0
            assert sorted(p.name for p in path.parent.iterdir()) == ["c.db"]
            assert path.stat().st_mode & 0o777 == 0o600
        finally:
            s.close()

    def test_in_memory_sqlite_is_refused(self) -> None:
        """sqlite:// without a file is refused, pointing at memory://."""
        with pytest.raises(StoreError, match="memory://"):
            open_store("sqlite://")

    def test_unknown_url_is_refused(self) -> None:
        """An unsupported URL scheme raises StoreError naming the supported ones."""
        with pytest.raises(StoreError, match="postgresql"):
            open_store("mysql://x/y")


@pytest.mark.postgres
class TestPostgres:
    """The PostgreSQL store's schema and refusals."""

    def test_schema_is_created_and_holds_every_table(self) -> None:
        """A missing schema is created and every table lives in it."""
        with fresh_schema() as pg:
            name = f"{pg.schema}_new"
            try:
                s = open_store(pg.url, schema=name)
                s.close()
                with pg.connect() as conn:
                    rows = conn.execute(
                        "SELECT table_name FROM information_schema.tables"
                        " WHERE table_schema = %s ORDER BY table_name",
                        (name,),
                    ).fetchall()
                assert [r[0] for r in rows] == [
                    "api_keys",
                    "events",
                    "leader",
                    "meta",
                    "models",
                    "nodes",
                    "replicas",
                    "reservations",
                    "retired_models",
                    "token_usage",
                ]
            finally:
                with pg.connect() as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

    def test_schema_from_url_options(self, pg_schema: PgSchema) -> None:
        """A search_path in the URL's options picks the schema, as --database URLs do."""
        s = open_store(pg_schema.url_with_schema)
        try:
            s.apply(Changes(nodes=[node()]))
        finally:
            s.close()
        with pg_schema.connect() as conn:
            assert conn.execute("SELECT count(*) FROM nodes").fetchone()[0] == 1  # type: ignore[index]

    def test_sessions_bound_their_host_going_silent(self, pg_schema: PgSchema) -> None:
        """The store's sessions carry short server-side keepalives, whatever
        postgresql.conf says: a silent leader's write held the fence for hours."""
        s = open_postgres_store(pg_schema.url, schema=pg_schema.schema)
        try:
            with s.engine.connect() as conn:
                got = {
                    name: conn.exec_driver_sql(f"SHOW {name}").scalar()
                    for name in ("tcp_keepalives_idle", "tcp_keepalives_count", "tcp_user_timeout")
                }
        finally:
            s.close()
        assert got == {"tcp_keepalives_idle": "5", "tcp_keepalives_count": "3",
                       "tcp_user_timeout": "5000"}  # fmt: skip

    def test_bad_schema_name_is_refused(self) -> None:
        """A schema name that is not a plain identifier is refused before any SQL runs."""
        with pytest.raises(StoreError, match="identifier"):
            open_store("postgresql://root@127.0.0.1:5432/test", schema='x"; DROP')

    def test_unreachable_server_is_a_store_error(self) -> None:
        """A server that cannot be reached raises StoreError, not a driver error."""
        with pytest.raises(StoreError):
            open_store("postgresql://root@127.0.0.1:1/test")


# ---- leadership ---------------------------------------------------------------------------


@pytest.fixture
def two(backend: Backend) -> Iterator[tuple[Leadership, Leadership]]:
    a, b = backend.leadership(), backend.leadership()
    try:
        yield a, b
    finally:
        a.release()
        b.release()


class TestLeadership:
    """Leadership between two controllers on one store."""

    def test_one_leads_the_other_waits(self, two: tuple[Leadership, Leadership]) -> None:
        """The first to try leads; the second is refused until the first releases."""
        a, b = two
        assert a.try_acquire()
        assert not b.try_acquire()
        assert (a.still_leader(), b.still_leader()) == (True, False)
        assert a.holder() is not None
        a.release()
        assert not a.still_leader()
        # PostgreSQL frees a closed session's lock once its backend has ended, a moment
        # after release returns (SQLite's flock goes at once): b's next tries win.
        wait_until(b.try_acquire, timeout_s=10, every_s=0.05, what="b leads after a released")
        assert not a.try_acquire()

    def test_acquire_is_idempotent_for_the_leader(self, two: tuple[Leadership, Leadership]) -> None:
        """A leader trying again still leads; releasing twice is harmless."""
        a, _ = two
        assert a.try_acquire()
        assert a.try_acquire()
        a.release()
        a.release()
        assert not a.still_leader()

    def test_fenced_store_refuses_writes_without_leadership(
        self, backend: Backend, two: tuple[Leadership, Leadership]
    ) -> None:
        """Writes through a FencedStore need leadership; reads do not."""
        a, b = two
        assert a.try_acquire()
        fenced = FencedStore(backend.open(), b)
        try:
            with pytest.raises(NotLeader):
                fenced.apply(Changes(nodes=[node()]))
            assert fenced.load().nodes == {}
            a.release()
            assert b.try_acquire()
            fenced.apply(Changes(nodes=[node()]))
            assert list(fenced.load().nodes) == ["n1"]
        finally:
            fenced.close()


_HOLD = """
import sys
from llmgw.controller.store import open_leadership
lead = open_leadership(sys.argv[1], schema=sys.argv[2] or None)
print("leading" if lead.try_acquire() else "refused", flush=True)
sys.stdin.read()
"""


class TestLeaderDies:
    """Leadership passes on when the leader dies, and its late writes are refused."""

    def test_sigkilled_leader_lock_passes_on(self, sql_backend: Backend) -> None:
        """Another process's lock refuses us; once it is SIGKILLed we take over."""
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD, sql_backend.url, sql_backend.schema or ""],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        lead = sql_backend.leadership()
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "leading"
            assert not lead.try_acquire()
            holder = lead.holder()
            assert holder is not None
            if sql_backend.pg is None:
                assert f"pid {proc.pid}" in holder
            proc.kill()
            proc.wait(timeout=10)
            wait_until(lead.try_acquire, every_s=0.1, what="the lock")
        finally:
            lead.release()
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            for f in (proc.stdin, proc.stdout):
                if f is not None:
                    f.close()

    @pytest.mark.postgres
    def test_a_write_after_the_lock_passed_on_is_refused_in_its_transaction(self) -> None:
        """Fenced inside the write itself: a deposed leader's write fails even when its
        own connection check has not noticed yet (the window between check and commit)."""
        with fresh_schema() as pg:
            store = open_store(pg.url, schema=pg.schema)
            a = open_leadership(pg.url, schema=pg.schema)
            b = open_leadership(pg.url, schema=pg.schema)
            try:
                assert a.try_acquire()
                fenced = FencedStore(store, a)
                fenced.apply(Changes(nodes=[node("n1")]))
                assert pg.terminate_leader() == 1
                wait_until(b.try_acquire, every_s=0.1, what="the lock passed on")
                # Straight to the store, as a write that passed FencedStore's check
                # just before the lock went would.
                with pytest.raises(NotLeader):
                    store.apply(Changes(nodes=[node("n2")]))
                assert list(store.load().nodes) == ["n1"]
            finally:
                a.release()
                b.release()
                store.close()

    @pytest.mark.postgres
    def test_dropped_connection_loses_leadership(self) -> None:
        """When the leader's session is terminated it is no longer leader and a standby leads."""
        with fresh_schema() as pg:
            a = open_leadership(pg.url, schema=pg.schema)
            b = open_leadership(pg.url, schema=pg.schema)
            try:
                assert a.try_acquire()
                assert not b.try_acquire()
                assert pg.terminate_leader() == 1
                wait_until(lambda: not a.still_leader(), every_s=0.1, what="a losing leadership")
                assert b.try_acquire()
            finally:
                a.release()
                b.release()
