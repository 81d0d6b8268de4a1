"""Stored rows this llmgw cannot read, on SQLite and PostgreSQL: refused by name, or skipped.

A row may be written in a shape this version cannot decode: by a newer llmgw (a spec
field added without a schema change), by a person editing the database, or by an older
llmgw before a rule tightened. The controller never guesses at such a row.
"""

from __future__ import annotations

import logging
import subprocess
import urllib.request
from pathlib import Path

import pytest

from llmgw.controller.fleet.records import Changes
from llmgw.controller.store import StoreError, UnreadableRow
from llmgw.testing.procs import llmgw_argv
from tests.integration import pg
from tests.integration import test_controller_store as contract
from tests.integration.controller_harness import Controller, Db, controller, wait_for
from tests.integration.test_controller_store_keys import key

# The contract module's fixtures, seen here as globals (as pg.pg_schema is there).
sql_backend = contract.sql_backend
pg_schema = contract.pg_schema

# A field no ModelSpec, ClientKey or GPU of this version has (a newer llmgw's, say).
NEWER = ', "from_a_newer_llmgw": 1}'


def everything() -> Changes:
    return Changes(
        nodes=[contract.node()],
        models=[contract.model()],
        replicas=[contract.replica()],
        retired=[contract.model("gone").spec],
        reservations=[contract.held()],
        keys=[key(rpm=60, tpm=10_000)],
    )


def corrupt(backend: contract.Backend, sql: str) -> None:
    """Run `sql` on the database as a person (or another llmgw) would."""
    engine = backend.engine()
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


def newer(column: str) -> str:
    """`column`'s JSON object with one more field than this llmgw knows."""
    return f"substr({column}, 1, length({column}) - 1) || '{NEWER}'"


# Table, the row's key, and an UPDATE that leaves that row unreadable.
REFUSED = [
    ("api_keys", "alice", f"UPDATE api_keys SET spec = {newer('spec')} WHERE name = 'alice'"),
    ("models", "llama", f"UPDATE models SET spec = {newer('spec')} WHERE name = 'llama'"),
    ("nodes", "n1", "UPDATE nodes SET gpus = '[{\"index\": \"zero\"}]' WHERE name = 'n1'"),
    ("replicas", "r1", "UPDATE replicas SET shards = 'not json' WHERE id = 'r1'"),
]
SKIPPED = [
    ("retired_models", "gone", "UPDATE retired_models SET spec = '{}' WHERE name = 'gone'"),
    ("reservations", "llama", "UPDATE reservations SET gpus = '[1, 2]' WHERE model = 'llama'"),
]


class TestUnreadableRows:
    """A row that does not decode stops the load by name, or is skipped where safe."""

    @pytest.mark.parametrize(("table", "name", "sql"), REFUSED, ids=[t for t, _, _ in REFUSED])
    def test_a_row_the_fleet_depends_on_stops_the_load(
        self, sql_backend: contract.Backend, table: str, name: str, sql: str
    ) -> None:
        """An unreadable key, model, node or replica fails the load with one line naming
        its table and row and what to do: never a key without its limits, a model's
        replicas orphaned, or GPUs that look free."""
        s = sql_backend.open()
        try:
            s.apply(everything())
            corrupt(sql_backend, sql)
            with pytest.raises(UnreadableRow) as ex:
                s.load()
        finally:
            s.close()
        message = str(ex.value)
        assert isinstance(ex.value, StoreError)
        assert (ex.value.table, ex.value.row) == (table, name)
        assert f"{table} row {name!r} cannot be read" in message
        assert "\n" not in message
        assert "upgrade" in message
        column = "id" if table == "replicas" else "name"
        assert f"DELETE FROM {table} WHERE {column} = '{name}'" in message

    @pytest.mark.parametrize(("table", "name", "sql"), SKIPPED, ids=[t for t, _, _ in SKIPPED])
    def test_a_transient_row_is_skipped_with_one_warning(
        self,
        sql_backend: contract.Backend,
        table: str,
        name: str,
        sql: str,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """An unreadable retired spec or reservation (a drain or eviction under way) is
        left out with a warning naming it, once however often the store is read; the
        rest loads, and the row itself stays as it was."""
        s = sql_backend.open()
        try:
            s.apply(everything())
            corrupt(sql_backend, sql)
            with caplog.at_level(logging.WARNING):
                first = s.load()
                again = s.load()
        finally:
            s.close()
        assert first == again
        assert name not in getattr(first, table.removesuffix("_models"))
        assert (
            list(first.models),
            list(first.keys),
            list(first.replicas),
        ) == (["llama"], ["alice"], ["r1"])
        warnings = [r.getMessage() for r in caplog.records if "unreadable row" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert f"table={table}" in warnings[0]
        assert name in warnings[0]


class TestUnreadableAtStart:
    """A controller that finds a row it cannot read says so in one line and exits."""

    def test_an_unreadable_key_stops_the_start_in_one_line(
        self, sql_backend: contract.Backend, tmp_path: Path
    ) -> None:
        """The controller exits 1 with one line naming the table and the row: no
        traceback, and no serving with that key's limits unknown."""
        s = sql_backend.open()
        try:
            s.apply(everything())
        finally:
            s.close()
        corrupt(sql_backend, REFUSED[0][2])
        argv = llmgw_argv("controller", "--port", "0", "--database", sql_backend.url)
        if sql_backend.schema is not None:
            argv += ["--schema", sql_backend.schema]
        got = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert (got.returncode, got.stdout) == (1, ""), got.stderr
        assert "Traceback" not in got.stderr
        lines = got.stderr.strip().splitlines()
        assert len(lines) == 1, got.stderr
        assert lines[0].startswith("llmgw controller: api_keys row 'alice' cannot be read")


def metrics(c: Controller) -> str:
    with urllib.request.urlopen(c.url + "/metrics", timeout=10) as resp:
        return str(resp.read().decode())


@pytest.mark.postgres
class TestUnreadableWhileRunning:
    """A row that turns unreadable while two controllers run on PostgreSQL."""

    def test_the_standby_says_why_once_and_shows_it(self, pg_schema: pg.PgSchema) -> None:
        """A standby whose reloads meet an unreadable key logs the one-line reason once
        (it logged `tick failed` at every reload) and shows the row on its /metrics; it
        does not take over from a leader gone until the row reads again."""
        db = Db(pg_schema.url, pg_schema.schema)
        with controller(db) as a, controller(db) as b:
            wait_for(a.leader, what="a leads")
            a.post("/admin/keys", {"name": "alice", "team": "research"})
            wait_for(lambda: b.get("/v1/endpoints?timeout_s=0")["keys"], what="b lists alice")
            backend = contract.Backend("postgres", pg_schema.url, pg_schema.schema, pg_schema)
            corrupt(backend, REFUSED[0][2])
            gauge = 'llmgw_controller_store_unreadable{row="alice",table="api_keys"} 1.0'
            wait_for(lambda: gauge in metrics(b), what="the standby shows the row")
            # Twenty reloads (0.3 s apart) later, still said once.
            b.wait_ticks(b.ticks() + 20)
            log = b.program.log_text()
            assert "Traceback" not in log
            said = [ln for ln in log.splitlines() if "cannot be read" in ln]
            assert len(said) == 1, said
            assert "api_keys row 'alice' cannot be read" in said[0]
            assert a.leader()
            # The leader gone, the standby cannot take over: it would lead without the key.
            a.program.stop(grace_s=5)
            b.wait_ticks(b.ticks() + 10)
            assert not b.leader()
            assert len([ln for ln in b.program.log_text().splitlines() if "cannot be" in ln]) == 1
            corrupt(backend, "UPDATE api_keys SET spec = replace(spec, '" + NEWER + "', '}')")
            wait_for(b.leader, what="b leads once the row reads")
            assert "llmgw_controller_store_unreadable{" not in metrics(b)
            assert [k["name"] for k in b.get("/admin/keys")] == ["alice"]
