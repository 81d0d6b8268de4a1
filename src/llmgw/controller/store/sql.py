"""The SQL `Store`, shared by SQLite and PostgreSQL; sqlite.py and postgres.py build its engine.

A tick writes tens to about a thousand replica rows. Each table's rows go in one
executemany of `INSERT … ON CONFLICT DO UPDATE` (both backends speak it), so a
tick is a handful of statements whatever its size, not one round trip per row.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from llmgw.controller.fleet.records import Adapter, Changes, Event, FleetState, Model
from llmgw.controller.store import codec, sqlevents, sqlusage, tables
from llmgw.controller.store.base import StoreError
from llmgw.controller.store.readrows import RowReader
from llmgw.wire.usage import TokenUsage, UsageBy, UsageRow

log = logging.getLogger(__name__)

# Keys per DELETE … WHERE key IN (…): well under SQLite's bound-parameter limit.
_DELETE_CHUNK = 500


def _upsert(dialect: str, table: sa.Table) -> sa.Insert:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(table)
    key = [c.name for c in table.primary_key]
    return stmt.on_conflict_do_update(
        index_elements=key,
        set_={c.name: stmt.excluded[c.name] for c in table.c if not c.primary_key},
    )


class SqlStore:
    """A `Store` over a SQLAlchemy engine whose database `migrate` already brought up to date.

    `read_options` and `write_options` are execution options for the engine: the
    backends use them to make a read one snapshot (PostgreSQL REPEATABLE READ) and
    a write take the write lock up front (SQLite BEGIN IMMEDIATE).
    """

    def __init__(
        self,
        engine: sa.Engine,
        *,
        describe: str,
        read_options: Mapping[str, Any] | None = None,
        write_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.describe = describe
        self._closed = False
        # Decodes what load() reads; an unreadable row is refused or skipped by table.
        self._rows = RowReader()
        # Run first in every write transaction (FencedStore sets it from the
        # leadership when that can fence inside the database): raises NotLeader
        # to roll the write back.
        self.write_guard: Callable[[sa.Connection], None] | None = None
        self._read = engine.execution_options(**(read_options or {}))
        self._write = engine.execution_options(**(write_options or {}))
        d = engine.dialect.name
        self._upsert_nodes = _upsert(d, tables.nodes)
        self._upsert_models = _upsert(d, tables.models)
        self._upsert_replicas = _upsert(d, tables.replicas)
        self._upsert_retired = _upsert(d, tables.retired_models)
        self._upsert_reservations = _upsert(d, tables.reservations)
        self._upsert_keys = _upsert(d, tables.api_keys)
        # Ids come back in the order the rows were given, whatever batches the
        # driver splits them into.
        self._insert_events = sa.insert(tables.events).returning(
            tables.events.c.id, sort_by_parameter_order=True
        )

    def __repr__(self) -> str:
        return f"SqlStore({self.describe})"

    @contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        if self._closed:
            # A disposed engine would quietly open new connections; a closed
            # store should fail like the memory store does.
            raise StoreError(f"{what} on a closed store ({self.describe})")
        try:
            yield
        except sa.exc.SQLAlchemyError as exc:
            # The driver's message names the constraint or the connection failure.
            raise StoreError(f"{what} failed on {self.describe}: {exc.__cause__ or exc}") from exc

    def migrate(self, *, prepare: Callable[[sa.Connection], None] | None = None) -> int:
        """Bring the database to the current schema in one write transaction (at open).

        `prepare` runs first in that transaction: PostgreSQL takes a lock there so
        two controllers starting together do not both migrate, and creates the schema.
        """
        with self._translate("open"), self._write.begin() as conn:
            if prepare is not None:
                prepare(conn)
            return tables.migrate(conn)

    def load(self) -> FleetState:
        t, read = tables, self._rows.read
        with self._translate("load"), self._read.begin() as conn:
            models = read("models", conn.execute(sa.select(t.models)).mappings(), _model_or_adapter)
            return FleetState(
                nodes=read("nodes", conn.execute(sa.select(t.nodes)).mappings(), codec.node_from),
                models={k: m for k, m in models.items() if isinstance(m, Model)},
                adapters={k: a for k, a in models.items() if isinstance(a, Adapter)},
                replicas=read(
                    "replicas", conn.execute(sa.select(t.replicas)).mappings(), codec.replica_from
                ),
                retired=read(
                    "retired_models",
                    conn.execute(sa.select(t.retired_models)).mappings(),
                    codec.retired_from,
                ),
                reservations=read(
                    "reservations",
                    conn.execute(sa.select(t.reservations)).mappings(),
                    codec.reservation_from,
                ),
                keys=read(
                    "api_keys", conn.execute(sa.select(t.api_keys)).mappings(), codec.key_from
                ),
            )

    def apply(self, changes: Changes) -> list[Event]:
        t = tables
        with self._translate("apply"), self._write.begin() as conn:
            if self.write_guard is not None:
                self.write_guard(conn)
            # Rows are encoded table by table inside the transaction; anything that
            # raises part-way rolls back what was already written.
            if changes.nodes:
                rows = [codec.node_row(n) for n in codec.last_by_key(changes.nodes, "name")]
                conn.execute(self._upsert_nodes, rows)
            if changes.models:
                rows = [codec.model_row(m) for m in codec.last_by_key(changes.models, "name")]
                conn.execute(self._upsert_models, rows)
            if changes.adapters:
                rows = [codec.adapter_row(a) for a in codec.last_by_key(changes.adapters, "name")]
                conn.execute(self._upsert_models, rows)
            if changes.replicas:
                rows = [codec.replica_row(p) for p in codec.last_by_key(changes.replicas, "id")]
                conn.execute(self._upsert_replicas, rows)
            if changes.retired:
                rows = [codec.retired_row(m) for m in codec.last_by_key(changes.retired, "name")]
                conn.execute(self._upsert_retired, rows)
            if changes.reservations:
                held = codec.last_by_key(changes.reservations, "model")
                conn.execute(self._upsert_reservations, [codec.reservation_row(h) for h in held])
            if changes.keys:
                rows = [codec.key_row(k) for k in codec.last_by_key(changes.keys, "name")]
                conn.execute(self._upsert_keys, rows)
            _delete(conn, t.nodes.c.name, changes.deleted_nodes)
            _delete(conn, t.models.c.name, changes.deleted_models)
            _delete(conn, t.models.c.name, changes.deleted_adapters)
            _delete(conn, t.replicas.c.id, changes.deleted_replicas)
            _delete(conn, t.retired_models.c.name, changes.deleted_retired)
            _delete(conn, t.reservations.c.model, changes.deleted_reservations)
            _delete(conn, t.api_keys.c.name, changes.deleted_keys)
            if not changes.events:
                return []
            ids = conn.execute(
                self._insert_events, [codec.event_row(e) for e in changes.events]
            ).scalars()
            return [dataclasses.replace(e, id=i) for e, i in zip(changes.events, ids, strict=True)]

    def events(
        self,
        *,
        model: str | None = None,
        replica: str | None = None,
        node: str | None = None,
        limit: int = 200,
        event_id: int | None = None,
    ) -> list[Event]:
        if limit <= 0:
            return []
        e = tables.events
        q = sa.select(e).order_by(e.c.id.desc()).limit(limit)
        if model is not None:
            q = q.where(e.c.model == model)
        if replica is not None:
            q = q.where(e.c.subject == "replica", e.c.subject_id == replica)
        if node is not None:
            q = q.where(e.c.subject == "node", e.c.subject_id == node)
        if event_id is not None:
            q = q.where(e.c.id == event_id)
        with self._translate("events"), self._read.begin() as conn:
            newest_first = [codec.event_from(r) for r in conn.execute(q).mappings()]
        newest_first.reverse()
        return newest_first

    def record_usage(self, router_id: str, rows: Sequence[TokenUsage]) -> None:
        if not rows:
            return
        with self._translate("record_usage"), self._write.begin() as conn:
            sqlusage.record(conn, router_id, rows)

    def usage(self, *, since: int, by: UsageBy, limit: int | None = None) -> list[UsageRow]:
        with self._translate("usage"), self._read.begin() as conn:
            return sqlusage.query(conn, since=since, by=by, limit=limit)

    def spent(self, *, keys: Sequence[str], since: int, until: int) -> dict[str, int]:
        if not keys:
            return {}
        with self._translate("spent"), self._read.begin() as conn:
            return sqlusage.spent(conn, keys=keys, since=since, until=until)

    def prune_usage(self, *, before: int, limit: int) -> int:
        with self._translate("prune_usage"), self._write.begin() as conn:
            return sqlusage.prune(conn, before=before, limit=limit)

    def prune_events(self, *, before: float | None, keep: int | None, limit: int) -> int:
        with self._translate("prune_events"), self._write.begin() as conn:
            return sqlevents.prune(conn, before=before, keep=keep, limit=limit)

    def events_pruned_through(self) -> int:
        with self._translate("events_pruned_through"), self._read.begin() as conn:
            return sqlevents.pruned_through(conn)

    def set_leader_url(self, url: str | None) -> None:
        t = tables.leader
        with self._translate("set_leader_url"), self._write.begin() as conn:
            if self.write_guard is not None:
                self.write_guard(conn)
            conn.execute(sa.delete(t))
            conn.execute(sa.insert(t).values(id=1, url=url))

    def leader_url(self) -> str | None:
        t = tables.leader
        with self._translate("leader_url"), self._read.begin() as conn:
            url = conn.execute(sa.select(t.c.url).where(t.c.id == 1)).scalar()
        return None if url is None else str(url)

    def schema_version(self) -> int:
        with self._translate("schema_version"), self._read.begin() as conn:
            return tables.read_version(conn)

    def close(self) -> None:
        self._closed = True
        self.engine.dispose()


def _model_or_adapter(r: codec.Row) -> Model | Adapter:
    # Adapters share the models table (codec module docstring).
    return codec.adapter_from(r) if codec.is_adapter_row(r) else codec.model_from(r)


def _delete(conn: sa.Connection, key: sa.Column[Any], values: Sequence[str]) -> None:
    unique = list(dict.fromkeys(values))
    for i in range(0, len(unique), _DELETE_CHUNK):
        conn.execute(sa.delete(key.table).where(key.in_(unique[i : i + _DELETE_CHUNK])))
