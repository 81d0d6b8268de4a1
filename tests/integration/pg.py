"""PostgreSQL for integration tests: the server at 127.0.0.1:5432, one fresh schema per test.

Import what you need into your test module:

    from tests.integration import pg
    from tests.integration.pg import PgSchema

    pg_schema = pg.pg_schema  # a fixture is visible to a module's tests as a global

    @pytest.mark.postgres
    def test_x(pg_schema: PgSchema) -> None:
        store = open_store(pg_schema.url, schema=pg_schema.schema)
        # a controller process: --database pg_schema.url_with_schema

`pg_schema` skips the test, saying why, when the server cannot be reached; the
schema (and everything in it) is dropped afterwards even if the test failed.
Set LLMGW_TEST_PG_URL to use another server.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import quote

import psycopg
import pytest

from llmgw.controller.store.postgres import lock_key

PG_URL = os.environ.get("LLMGW_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")


@dataclass(frozen=True)
class PgSchema:
    """A schema of its own on the test server."""

    url: str
    schema: str

    @property
    def url_with_schema(self) -> str:
        """The URL with the schema as libpq's search_path option (for `--database`)."""
        sep = "&" if "?" in self.url else "?"
        return f"{self.url}{sep}options={quote(f'-csearch_path={self.schema}')}"

    def terminate_leader(self) -> int:
        """End the session holding this schema's leadership lock (a leader losing its
        database session); the number ended. Only this schema's: the server is shared
        with other test runs, whose leaders must not lose theirs."""
        key = lock_key("leader", self.schema) & 0xFFFF_FFFF_FFFF_FFFF
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                " AND granted AND objsubid = 1 AND classid::bigint = %s"
                " AND objid::bigint = %s AND pid <> pg_backend_pid()",
                (key >> 32, key & 0xFFFF_FFFF),
            ).fetchall()
        return len(rows)

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        """A plain autocommit connection with the schema on the search path."""
        return psycopg.connect(
            self.url, autocommit=True, options=f"-csearch_path={self.schema}", connect_timeout=5
        )


@functools.cache
def pg_unreachable() -> str | None:
    """Why the test server cannot be used, or None when it can (checked once per run)."""
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL at {PG_URL} unreachable: {exc}".strip()
    return None


@contextmanager
def fresh_schema() -> Iterator[PgSchema]:
    """A new randomly named schema, dropped with CASCADE on exit; skips if no server."""
    why = pg_unreachable()
    if why is not None:
        pytest.skip(why)
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield PgSchema(url=PG_URL, schema=schema)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def pg_schema() -> Iterator[PgSchema]:
    """A fresh schema on the test server for this test (skipped when unreachable)."""
    with fresh_schema() as s:
        yield s
