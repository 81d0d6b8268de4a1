"""The SQL schema and its migrations (SQLAlchemy 2 Core, no ORM).

Every database, new or old, reaches the current schema the same way: the
migrations after its recorded version run in order, inside the one transaction
that opens the store, and the version is written with them. A fresh database
is just one at version 0, so the upgrade path is the path every test takes, not
a branch nobody runs. A database whose version is newer than `SCHEMA_VERSION`
is refused (`SchemaTooNew`): opening it would misread, or worse rewrite, what a
newer controller stored.

To change the schema: append a migration, bump `codec.SCHEMA_VERSION`, update
the current tables below and the codec; never edit a migration that shipped.

History:
  1  nodes, models, replicas, events, meta
  2  nodes.port_lo/port_hi (the agent's engine port range), replicas.master_port
     (multi-node rendezvous), indexes for event lookups by model and subject
  3  replicas.capacity_tok_s (what `ctl bench` measured behind the weight)
  4  nodes.drain_grace_s/drain_force (the operator's drain request), retired_models
     (specs of deleted models whose replicas still drain), reservations (room
     held for a model while its eviction victims drain): what a restarted
     controller needs to carry on a drain or an eviction where it left off
  5  nodes.drain_evict_idle (a drain that may evict known-idle replicas of
     other models to make room)
  6  replica states sleeping and waking (the state CHECK widened),
     replicas.sleep_level, nodes.host_memory_mib (engines that sleep instead of
     stopping, docs/sleep-and-adapters.md)
  7  api_keys (client keys: hash and limits, docs/tenants.md); event subject
     "key" (the events CHECK widened)
  8  api_keys.revoked_at (a revoked key's row stays: routers keep requiring keys)
  9  token_usage (each router process's running token totals per hour, key,
     team and model; docs/tenants.md#usage)
 10  leader (the URL the leading controller is reachable at: where a standby
     forwards the usage reports it receives)
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from llmgw.controller.store.base import SchemaTooNew
from llmgw.controller.store.codec import (
    EVENT_SUBJECTS,
    OPERATOR_STATES,
    REPLICA_STATES,
    SCHEMA_VERSION,
)

# The event subjects before version 7 (which added "key"): v1's table is created with these.
EVENT_SUBJECTS_V1 = tuple(s for s in EVENT_SUBJECTS if s != "key")

# SQLite only auto-assigns ids to a column declared exactly "INTEGER PRIMARY KEY";
# PostgreSQL gets a BIGSERIAL.
EventId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _define_v4_tables(md: sa.MetaData) -> None:
    """The tables schema version 4 added (its migration creates them from this)."""
    sa.Table(
        "retired_models",
        md,
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("spec", sa.Text, nullable=False),  # JSON wire.models.ModelSpec
    )
    sa.Table(
        "reservations",
        md,
        # No foreign key to models: the tick drops a reservation in the same
        # transaction that ends it, and a key would only order those writes.
        sa.Column("model", sa.String, primary_key=True),
        sa.Column("victims", sa.Text, nullable=False),  # JSON list of replica ids
        sa.Column("gpus", sa.Text, nullable=False),  # JSON list of [node, [indices]]
    )


def _define_v7_tables(md: sa.MetaData, *, version: int = 7) -> None:
    """The table schema version 7 added (its migration creates it from this), as of
    `version`."""
    sa.Table(
        "api_keys",
        md,
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("team", sa.String, nullable=False),
        # Lowercase hex SHA-256 of the key; the key itself is never stored.
        sa.Column("sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("spec", sa.Text, nullable=False),  # JSON wire.keys.ClientKey
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float),
        *([sa.Column("revoked_at", sa.Float)] if version >= 8 else []),
    )


def _define_v9_tables(md: sa.MetaData) -> None:
    """The table schema version 9 added (its migration creates it from this)."""
    sa.Table(
        "token_usage",
        md,
        # Unix seconds at the start of the UTC hour; first, so a range of hours is
        # a range of the primary key.
        sa.Column("hour", sa.BigInteger, primary_key=True),
        sa.Column("key", sa.String, primary_key=True),
        sa.Column("team", sa.String, primary_key=True),
        sa.Column("model", sa.String, primary_key=True),
        # Who counted them (UsageReport.counter_id, else its router_id: one router
        # process): each row holds that process's running totals, and a total over
        # routers is summed when read.
        sa.Column("router_id", sa.String, primary_key=True),
        sa.Column("requests", sa.BigInteger, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
    )


def _define_v10_tables(md: sa.MetaData) -> None:
    """The table schema version 10 added (its migration creates it from this)."""
    sa.Table(
        "leader",
        md,
        # One row at most: the current leader's, written when it takes the lock.
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        # NULL: the leader knows no URL it is reachable at (it listens on every
        # interface and was given no --advertise-url).
        sa.Column("url", sa.Text),
        sa.CheckConstraint("id = 1", name="ck_leader_one_row"),
    )


def _define(md: sa.MetaData, *, version: int) -> None:
    """The tables as of `version` (1 or the current one); a migration creates v1 from this."""
    v2 = version >= 2
    v4 = version >= 4
    v5 = version >= 5
    v6 = version >= 6
    sa.Table("meta", md, sa.Column("key", sa.String, primary_key=True), sa.Column("value", sa.Text))
    sa.Table(
        "nodes",
        md,
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("address", sa.String, nullable=False),
        sa.Column("fabrics", sa.Text, nullable=False),  # JSON list of names
        sa.Column("labels", sa.Text, nullable=False),  # JSON object
        sa.Column("gpus", sa.Text, nullable=False),  # JSON list of wire.agent.GPU
        sa.Column("operator_state", sa.String, nullable=False),
        sa.Column("last_heartbeat_at", sa.Float),
        sa.Column("agent_started_at", sa.Float),
        *(
            [
                sa.Column("port_lo", sa.Integer, nullable=False, server_default="21000"),
                sa.Column("port_hi", sa.Integer, nullable=False, server_default="21999"),
            ]
            if v2
            else []
        ),
        *(
            [
                sa.Column("drain_grace_s", sa.Float),
                sa.Column("drain_force", sa.Boolean, nullable=False, server_default=sa.false()),
            ]
            if v4
            else []
        ),
        *(
            [
                sa.Column(
                    "drain_evict_idle", sa.Boolean, nullable=False, server_default=sa.false()
                ),
            ]
            if v5
            else []
        ),
        *([sa.Column("host_memory_mib", sa.BigInteger)] if v6 else []),
        sa.CheckConstraint(_one_of("operator_state", OPERATOR_STATES), name="ck_nodes_state"),
    )
    sa.Table(
        "models",
        md,
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("spec", sa.Text, nullable=False),  # JSON wire.models.ModelSpec
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("desired_replicas", sa.Integer, nullable=False),
        sa.CheckConstraint("desired_replicas >= 0", name="ck_models_desired"),
    )
    sa.Table(
        "replicas",
        md,
        sa.Column("id", sa.String, primary_key=True),
        # No foreign key to models: a deleted model's replicas outlive it while
        # they drain (DELETE /admin/models/{name} drains, then forgets them).
        sa.Column("model", sa.String, nullable=False),
        sa.Column("state", sa.String, nullable=False),
        sa.Column("shards", sa.Text, nullable=False),  # JSON list of fleet.records.Shard
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("state_since", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("endpoint_url", sa.String),
        sa.Column("restarts", sa.Integer, nullable=False),
        sa.Column("pool", sa.String, nullable=False),
        sa.Column("weight", sa.Float, nullable=False),
        sa.Column("replaces", sa.String),
        sa.Column("retry_at", sa.Float),
        sa.Column("drain_deadline", sa.Float),
        *([sa.Column("master_port", sa.Integer)] if v2 else []),
        *([sa.Column("capacity_tok_s", sa.Float)] if version >= 3 else []),
        *([sa.Column("sleep_level", sa.Integer)] if v6 else []),
        sa.CheckConstraint(_one_of("state", REPLICA_STATES), name="ck_replicas_state"),
        sa.CheckConstraint("restarts >= 0", name="ck_replicas_restarts"),
        *([sa.Index("ix_replicas_model", "model")] if v2 else []),
    )
    sa.Table(
        "events",
        md,
        sa.Column("id", EventId, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("kind", sa.String, nullable=False),
        sa.Column("subject", sa.String, nullable=False),
        sa.Column("subject_id", sa.String, nullable=False),
        sa.Column("model", sa.String),
        sa.Column("message", sa.Text, nullable=False),
        sa.CheckConstraint(
            _one_of("subject", EVENT_SUBJECTS if version >= 7 else EVENT_SUBJECTS_V1),
            name="ck_events_subject",
        ),
        *(
            [
                sa.Index("ix_events_model", "model", "id"),
                sa.Index("ix_events_subject", "subject", "subject_id", "id"),
            ]
            if v2
            else []
        ),
        # Ids are never reused, even after the newest event is deleted: "after id N"
        # must keep meaning the same thing.
        sqlite_autoincrement=True,
    )
    if v4:
        _define_v4_tables(md)
    if version >= 7:
        _define_v7_tables(md, version=version)
    if version >= 9:
        _define_v9_tables(md)
    if version >= 10:
        _define_v10_tables(md)


# The current schema, used for every query.
METADATA = sa.MetaData()
_define(METADATA, version=SCHEMA_VERSION)
meta = METADATA.tables["meta"]
nodes = METADATA.tables["nodes"]
models = METADATA.tables["models"]
replicas = METADATA.tables["replicas"]
events = METADATA.tables["events"]
retired_models = METADATA.tables["retired_models"]
reservations = METADATA.tables["reservations"]
api_keys = METADATA.tables["api_keys"]
token_usage = METADATA.tables["token_usage"]
leader = METADATA.tables["leader"]


def _to_v1(conn: sa.Connection) -> None:
    md = sa.MetaData()
    _define(md, version=1)
    md.create_all(conn)


def _to_v2(conn: sa.Connection) -> None:
    for ddl in (
        "ALTER TABLE nodes ADD COLUMN port_lo INTEGER NOT NULL DEFAULT 21000",
        "ALTER TABLE nodes ADD COLUMN port_hi INTEGER NOT NULL DEFAULT 21999",
        "ALTER TABLE replicas ADD COLUMN master_port INTEGER",
        "CREATE INDEX ix_replicas_model ON replicas (model)",
        "CREATE INDEX ix_events_model ON events (model, id)",
        "CREATE INDEX ix_events_subject ON events (subject, subject_id, id)",
    ):
        conn.exec_driver_sql(ddl)


def _to_v3(conn: sa.Connection) -> None:
    # The raw `ctl bench` capacity beside the weight it was normalized into.
    conn.exec_driver_sql("ALTER TABLE replicas ADD COLUMN capacity_tok_s DOUBLE PRECISION")


def _to_v4(conn: sa.Connection) -> None:
    for ddl in (
        "ALTER TABLE nodes ADD COLUMN drain_grace_s DOUBLE PRECISION",
        "ALTER TABLE nodes ADD COLUMN drain_force BOOLEAN NOT NULL DEFAULT FALSE",
    ):
        conn.exec_driver_sql(ddl)
    md = sa.MetaData()
    _define_v4_tables(md)
    md.create_all(conn)


def _to_v5(conn: sa.Connection) -> None:
    conn.exec_driver_sql(
        "ALTER TABLE nodes ADD COLUMN drain_evict_idle BOOLEAN NOT NULL DEFAULT FALSE"
    )


def _to_v6(conn: sa.Connection) -> None:
    conn.exec_driver_sql("ALTER TABLE nodes ADD COLUMN host_memory_mib BIGINT")
    conn.exec_driver_sql("ALTER TABLE replicas ADD COLUMN sleep_level INTEGER")
    check = _one_of("state", REPLICA_STATES)
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("ALTER TABLE replicas DROP CONSTRAINT ck_replicas_state")
        conn.exec_driver_sql(
            f"ALTER TABLE replicas ADD CONSTRAINT ck_replicas_state CHECK ({check})"
        )
        return
    # SQLite cannot change a CHECK constraint: the table is rebuilt under its name.
    md = sa.MetaData()
    _define(md, version=6)
    conn.exec_driver_sql("DROP INDEX IF EXISTS ix_replicas_model")
    conn.exec_driver_sql("ALTER TABLE replicas RENAME TO replicas_v5")
    md.tables["replicas"].create(conn)
    cols = ", ".join(c.name for c in md.tables["replicas"].columns)
    conn.exec_driver_sql(f"INSERT INTO replicas ({cols}) SELECT {cols} FROM replicas_v5")
    conn.exec_driver_sql("DROP TABLE replicas_v5")


def _to_v7(conn: sa.Connection) -> None:
    md = sa.MetaData()
    _define_v7_tables(md)
    md.create_all(conn)
    check = _one_of("subject", EVENT_SUBJECTS)
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("ALTER TABLE events DROP CONSTRAINT ck_events_subject")
        conn.exec_driver_sql(f"ALTER TABLE events ADD CONSTRAINT ck_events_subject CHECK ({check})")
        return
    # SQLite cannot change a CHECK constraint: the table is rebuilt under its name,
    # keeping its AUTOINCREMENT high-water mark so no event id is ever reused.
    md = sa.MetaData()
    _define(md, version=7)
    for index in ("ix_events_model", "ix_events_subject"):
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS {index}")
    conn.exec_driver_sql("ALTER TABLE events RENAME TO events_v6")
    md.tables["events"].create(conn)
    cols = ", ".join(c.name for c in md.tables["events"].columns)
    conn.exec_driver_sql(f"INSERT INTO events ({cols}) SELECT {cols} FROM events_v6")
    conn.exec_driver_sql(
        "UPDATE sqlite_sequence SET seq = max(seq, coalesce((SELECT seq FROM sqlite_sequence "
        "WHERE name = 'events_v6'), 0)) WHERE name = 'events'"
    )
    conn.exec_driver_sql("DROP TABLE events_v6")
    conn.exec_driver_sql("DELETE FROM sqlite_sequence WHERE name = 'events_v6'")


def _to_v8(conn: sa.Connection) -> None:
    conn.exec_driver_sql("ALTER TABLE api_keys ADD COLUMN revoked_at DOUBLE PRECISION")


def _to_v9(conn: sa.Connection) -> None:
    md = sa.MetaData()
    _define_v9_tables(md)
    md.create_all(conn)


def _to_v10(conn: sa.Connection) -> None:
    md = sa.MetaData()
    _define_v10_tables(md)
    md.create_all(conn)


MIGRATIONS: tuple[tuple[int, Callable[[sa.Connection], None]], ...] = (
    (1, _to_v1),
    (2, _to_v2),
    (3, _to_v3),
    (4, _to_v4),
    (5, _to_v5),
    (6, _to_v6),
    (7, _to_v7),
    (8, _to_v8),
    (9, _to_v9),
    (10, _to_v10),
)
assert MIGRATIONS[-1][0] == SCHEMA_VERSION, "add a migration when bumping SCHEMA_VERSION"


def read_version(conn: sa.Connection) -> int:
    """The recorded schema version; 0 for a database without our tables."""
    if not sa.inspect(conn).has_table("meta"):
        return 0
    value = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
    return 0 if value is None else int(value)


def migrate(conn: sa.Connection) -> int:
    """Bring the database to `SCHEMA_VERSION` inside the caller's transaction.

    The caller holds a lock that keeps two controllers opening one database at
    once from both migrating it (SQLite: BEGIN IMMEDIATE; PostgreSQL: an
    advisory transaction lock).
    """
    found = read_version(conn)
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(found, SCHEMA_VERSION)
    for version, step in MIGRATIONS:
        if version <= found:
            continue
        step(conn)
        conn.execute(sa.delete(meta).where(meta.c.key == "schema_version"))
        conn.execute(sa.insert(meta).values(key="schema_version", value=str(version)))
    return max(found, SCHEMA_VERSION)
