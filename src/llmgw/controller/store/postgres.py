"""PostgreSQL (psycopg 3): production, several controllers on one database.

`schema=` (or `?options=-csearch_path%3D<name>` in the URL) puts every table in
that schema, created if missing; tests give each run its own and drop it after.
Leadership is an advisory lock (leadership.AdvisoryLockLeadership).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql

from llmgw.controller.store.base import StoreError
from llmgw.controller.store.sql import SqlStore

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_SEARCH_PATH = re.compile(r"search_path\s*=\s*([A-Za-z_][A-Za-z0-9_]*)")

APPLICATION_NAME = "llmgw-controller"

# Server-side TCP settings for every session a controller opens; each is the
# session's own (any role may SET them), so postgresql.conf need not change. A leader
# whose host goes silent sends no FIN: PostgreSQL ends its session, freeing the
# leadership lock and any fence a write of it held, only once TCP gives up on it,
# after more than two hours with the stock settings (the operating system's). With
# these, a keepalive probe goes out after 5 s without traffic, and the session ends
# once data or a probe has gone unacknowledged for 5 s.
SESSION_TCP = (
    ("tcp_keepalives_idle", "5"),
    ("tcp_keepalives_interval", "2"),
    ("tcp_keepalives_count", "3"),
    ("tcp_user_timeout", "5000"),  # milliseconds; PostgreSQL 12 and later
)


def bound_silence(conn: psycopg.Connection[Any]) -> None:
    """SET `SESSION_TCP` on `conn`'s session (committed, if a transaction was opened)."""
    for name, value in SESSION_TCP:
        if name == "tcp_user_timeout" and conn.info.server_version < 120000:
            continue
        conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
    if not conn.autocommit:
        conn.commit()


def pg_url(url: str) -> sa.URL:
    """The URL with SQLAlchemy's psycopg 3 driver, whatever `postgres[ql][+driver]://` spelling."""
    try:
        u = sa.make_url(url.replace("postgres://", "postgresql://", 1))
    except sa.exc.ArgumentError as exc:
        raise StoreError(f"bad PostgreSQL URL: {exc}") from exc
    return u.set(drivername="postgresql+psycopg")


def libpq_url(url: str) -> str:
    """The same database as a plain libpq URL, for a raw psycopg connection."""
    return pg_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def schema_name(url: str, schema: str | None) -> str | None:
    """The schema to use: `schema` if given, else a search_path in the URL's options, else None."""
    if schema is None:
        options = pg_url(url).query.get("options")
        found = _SEARCH_PATH.search(
            options if isinstance(options, str) else " ".join(options or ())
        )
        schema = found.group(1) if found else None
    if schema is not None and not _SCHEMA_NAME.match(schema):
        raise StoreError(f"schema name {schema!r} must be a plain SQL identifier")
    return schema


def lock_key(purpose: str, schema: str) -> int:
    """A signed 64-bit advisory-lock key for (`purpose`, `schema`), stable across processes."""
    digest = hashlib.blake2b(f"llmgw:{purpose}:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def open_postgres_store(url: str, *, schema: str | None = None) -> SqlStore:
    """Connect, create the schema if it is missing, and migrate it to the current version."""
    schema = schema_name(url, schema)
    connect_args: dict[str, object] = {"application_name": APPLICATION_NAME, "connect_timeout": 10}
    if schema is not None:
        connect_args["options"] = f"-csearch_path={schema}"
    engine = sa.create_engine(
        pg_url(url),
        connect_args=connect_args,
        # A database restart or failover leaves dead connections in the pool;
        # check each before use rather than fail the tick that draws one.
        pool_pre_ping=True,
    )
    # A write of a leader gone silent holds the fence until its session ends, and the
    # successor waits for the fence (leadership.py): bounded like the lock's session.
    sa.event.listen(engine, "connect", lambda dbapi_conn, _record: bound_silence(dbapi_conn))
    describe = f"postgresql {engine.url.render_as_string(hide_password=True)}" + (
        f" schema {schema}" if schema else ""
    )
    store = SqlStore(
        engine,
        describe=describe,
        # One snapshot for the three tables load() reads: without it a write
        # committed between them could show a replica whose model is not loaded.
        read_options={"isolation_level": "REPEATABLE READ"},
    )

    def prepare(conn: sa.Connection) -> None:
        target = schema or conn.exec_driver_sql("SELECT current_schema()").scalar() or "public"
        # Two controllers starting at once: the second waits here, then finds the
        # schema migrated. Released at commit.
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(lock_key("migrate", target))))
        if schema is not None:
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')

    try:
        store.migrate(prepare=prepare)
    except BaseException:
        engine.dispose()
        raise
    return store
