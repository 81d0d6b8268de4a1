"""Client keys in the controller store, on SQLite, PostgreSQL and the memory fake."""

from __future__ import annotations

import dataclasses

import pytest

from llmgw.controller.fleet.records import Changes, Event, TenantKey
from llmgw.controller.store import Store, StoreError
from llmgw.controller.store.codec import SCHEMA_VERSION
from llmgw.wire.keys import Budget, ClientKey
from tests.integration import test_controller_store as contract

# The contract module's fixtures, seen here as globals (as pg.pg_schema is there).
backend = contract.backend
sql_backend = contract.sql_backend
store = contract.store
pg_schema = contract.pg_schema


def key(name: str = "alice", digest: str = "a" * 64, **kw: object) -> TenantKey:
    fields: dict[str, object] = {"name": name, "sha256": digest, "team": "research", **kw}
    return TenantKey(key=ClientKey(**fields), created_at=1_700_000_000.5)  # type: ignore[arg-type]


def key_event(name: str, kind: str = "key.created") -> Event:
    return Event(id=0, at=1.0, kind=kind, subject="key", subject_id=name, model=None, message="m")


class TestKeys:
    """Keys stored, loaded and revoked."""

    def test_every_field_round_trips(self, store: Store) -> None:
        """A key with every limit set loads back equal."""
        k = key(
            models=("m1", "m2"),
            rpm=60,
            tpm=10_000,
            budget=Budget(tokens=1_000_000, per="week"),
            priority="batch",
            expires_at=1_800_000_000.25,
        )
        store.apply(Changes(keys=[k], events=[key_event("alice")]))
        assert store.load().keys == {"alice": k}

    def test_defaults_round_trip(self, store: Store) -> None:
        """A key without limits loads back without limits (None, not 0)."""
        k = key()
        store.apply(Changes(keys=[k]))
        got = store.load().keys["alice"].key
        assert (got.rpm, got.tpm, got.budget, got.models) == (None, None, None, ())

    def test_revoke_deletes(self, store: Store) -> None:
        """A revoked key is gone from the next load, and its event is kept."""
        store.apply(Changes(keys=[key(), key("bob", "b" * 64)]))
        store.apply(Changes(deleted_keys=["alice"], events=[key_event("alice", "key.revoked")]))
        assert list(store.load().keys) == ["bob"]
        assert [e.kind for e in store.events()] == ["key.revoked"]

    def test_a_revoked_key_stays_as_a_tombstone(self, store: Store) -> None:
        """revoked_at round-trips: the row stays, marked."""
        k = key()
        store.apply(Changes(keys=[k]))
        store.apply(Changes(keys=[dataclasses.replace(k, revoked_at=5.5)]))
        assert store.load().keys["alice"].revoked_at == 5.5

    def test_two_keys_with_one_hash_are_refused(self, store: Store) -> None:
        """Two names for one hash are refused and nothing of the change is applied."""
        store.apply(Changes(keys=[key()]))
        with pytest.raises(StoreError):
            store.apply(Changes(keys=[key("bob")], events=[key_event("bob")]))
        assert list(store.load().keys) == ["alice"]
        assert store.events() == []


class TestKeysSchema:
    """The migration that adds keys."""

    def test_v6_database_upgrades_to_v7_keeping_event_ids(
        self, sql_backend: contract.Backend
    ) -> None:
        """A v6 database keeps its events, never reuses their ids, and then stores keys."""
        engine = sql_backend.engine()
        try:
            with engine.begin() as conn:
                sql_backend.at_version(conn, 6)
                for i in (1, 2, 3):
                    conn.exec_driver_sql(
                        "INSERT INTO events (at, kind, subject, subject_id, model, message)"
                        f" VALUES ({i}, 'node.joined', 'node', 'n{i}', NULL, 'hi')"
                    )
                # The newest event deleted: its id must still never come back.
                conn.exec_driver_sql("DELETE FROM events WHERE subject_id = 'n3'")
        finally:
            engine.dispose()
        s = sql_backend.open()
        try:
            assert s.schema_version() == SCHEMA_VERSION
            assert [e.id for e in s.events()] == [1, 2]
            written = s.apply(Changes(keys=[key()], events=[key_event("alice")]))
            assert written[0].id == 4
            assert [e.subject for e in s.events(limit=1)] == ["key"]
            assert list(s.load().keys) == ["alice"]
        finally:
            s.close()
