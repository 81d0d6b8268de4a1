"""The leader's URL in the controller store, on SQLite, PostgreSQL and the memory fake."""

from __future__ import annotations

import pytest

from llmgw.controller.store import FencedStore, NotLeader, Store
from llmgw.controller.store.codec import SCHEMA_VERSION
from tests.integration import test_controller_store as contract

# The contract module's fixtures, seen here as globals (as pg.pg_schema is there).
backend = contract.backend
sql_backend = contract.sql_backend
store = contract.store
pg_schema = contract.pg_schema


class TestLeaderUrl:
    """Where the leader says it is reachable, as standbys read it."""

    def test_none_before_any_leader_said(self, store: Store) -> None:
        """A new store names no leader URL."""
        assert store.leader_url() is None

    def test_the_last_recorded_wins(self, store: Store) -> None:
        """A new leader's URL replaces the one before; None clears it."""
        store.set_leader_url("http://10.0.0.1:8081")
        store.set_leader_url("http://ctl-b:8081")
        assert store.leader_url() == "http://ctl-b:8081"
        store.set_leader_url(None)
        assert store.leader_url() is None

    def test_it_survives_a_reopen(self, sql_backend: contract.Backend) -> None:
        """Another controller opening the database reads what the leader recorded."""
        s = sql_backend.open()
        try:
            s.set_leader_url("http://ctl-a:8081")
        finally:
            s.close()
        s = sql_backend.open()
        try:
            assert s.leader_url() == "http://ctl-a:8081"
        finally:
            s.close()

    def test_a_controller_that_does_not_lead_cannot_record_it(
        self, backend: contract.Backend
    ) -> None:
        """Fenced like every write: a deposed leader cannot point standbys back at itself."""
        s = backend.open()
        first, second = backend.leadership(), backend.leadership()
        try:
            assert first.try_acquire()
            FencedStore(s, first).set_leader_url("http://ctl-a:8081")
            fenced = FencedStore(s, second)
            with pytest.raises(NotLeader):
                fenced.set_leader_url("http://ctl-b:8081")
            assert fenced.leader_url() == "http://ctl-a:8081"
        finally:
            first.release()
            second.release()
            s.close()


class TestLeaderSchema:
    """The migration that adds the leader's URL."""

    def test_v9_database_upgrades_to_v10(self, sql_backend: contract.Backend) -> None:
        """A v9 database keeps its token usage and then stores a leader URL."""
        engine = sql_backend.engine()
        try:
            with engine.begin() as conn:
                sql_backend.at_version(conn, 9)
                conn.exec_driver_sql(
                    "INSERT INTO token_usage (hour, key, team, model, router_id, requests,"
                    " prompt_tokens, completion_tokens) VALUES (3600, 'k', 't', 'm', 'r', 1, 2, 3)"
                )
        finally:
            engine.dispose()
        s = sql_backend.open()
        try:
            assert s.schema_version() == SCHEMA_VERSION == 10
            assert s.leader_url() is None
            s.set_leader_url("http://ctl-a:8081")
            assert s.leader_url() == "http://ctl-a:8081"
            assert [r.prompt_tokens for r in s.usage(since=0, by="key")] == [2]
        finally:
            s.close()
