"""Event retention in the controller store, on SQLite, PostgreSQL and the memory fake."""

from __future__ import annotations

import sqlalchemy as sa

from llmgw.controller.fleet.records import Changes, Event
from llmgw.controller.store import Store
from llmgw.controller.store.sql import SqlStore
from llmgw.controller.store.sqlevents import batch_statements
from tests.integration import test_controller_store as contract

# The contract module's fixtures, seen here as globals (as pg.pg_schema is there).
backend = contract.backend
sql_backend = contract.sql_backend
store = contract.store
pg_schema = contract.pg_schema


def write(store: Store, *ats: float) -> list[Event]:
    """One event at each of `ats`, in that order (ids ascending)."""
    return store.apply(Changes(events=[contract.event(at=at) for at in ats]))


def kept(store: Store) -> list[float]:
    return [e.at for e in store.events(limit=10_000)]


class TestPruneEvents:
    """Events past the retention deleted in bounded batches, oldest first."""

    def test_old_events_go_a_batch_at_a_time(self, store: Store) -> None:
        """Seven events, those before 5.5 pruned two at a time: a short batch says
        nothing older is left, and the newer ones stay."""
        write(store, 1, 2, 3, 4, 5, 6, 7)
        assert [store.prune_events(before=5.5, keep=None, limit=2) for _ in range(4)] == [
            2,
            2,
            1,
            0,
        ]
        assert kept(store) == [6.0, 7.0]

    def test_only_the_newest_n_are_kept(self, store: Store) -> None:
        """A cap of three: the seven oldest of ten go, the oldest first, whatever their age."""
        write(store, *range(1, 11))
        assert [store.prune_events(before=None, keep=3, limit=4) for _ in range(3)] == [4, 3, 0]
        assert kept(store) == [8.0, 9.0, 10.0]

    def test_either_rule_deletes(self, store: Store) -> None:
        """Age and cap together: an event goes when either rule says so."""
        write(store, *range(1, 11))
        assert store.prune_events(before=3.5, keep=5, limit=100) == 5
        assert kept(store) == [6.0, 7.0, 8.0, 9.0, 10.0]
        assert store.prune_events(before=8.5, keep=5, limit=100) == 3
        assert kept(store) == [9.0, 10.0]

    def test_nothing_to_prune_deletes_nothing(self, store: Store) -> None:
        """An empty log, a cutoff before every event, a cap above their number: nothing."""
        assert store.prune_events(before=100.0, keep=1, limit=10) == 0
        write(store, 5, 6)
        assert store.prune_events(before=5.0, keep=2, limit=10) == 0
        assert store.prune_events(before=None, keep=None, limit=10) == 0
        assert kept(store) == [5.0, 6.0]
        assert store.events_pruned_through() == 0

    def test_the_highest_pruned_id_is_remembered(self, store: Store) -> None:
        """After a prune the store says which ids the retention took: those up to the
        highest it deleted, even once the log is empty."""
        written = write(store, 1, 2, 3)
        store.prune_events(before=2.5, keep=None, limit=10)
        assert store.events_pruned_through() == written[1].id
        store.prune_events(before=None, keep=0, limit=10)
        assert store.events(limit=10) == []
        assert store.events_pruned_through() == written[2].id

    def test_ids_are_never_reused_after_everything_was_pruned(self, store: Store) -> None:
        """A new event after the whole log went still gets a higher id than any before."""
        old = write(store, 1, 2)
        assert store.prune_events(before=None, keep=0, limit=10) == 2
        (new,) = write(store, 3)
        assert new.id > old[-1].id

    def test_the_mark_survives_a_reopen(self, sql_backend: contract.Backend) -> None:
        """The highest pruned id is kept in the database, not in the process."""
        s = sql_backend.open()
        try:
            written = write(s, 1, 2, 3)
            s.prune_events(before=1.5, keep=None, limit=10)
        finally:
            s.close()
        s = sql_backend.open()
        try:
            assert s.events_pruned_through() == written[0].id
        finally:
            s.close()


class TestPrunePlan:
    """A batch reads a range of the primary key, never the whole table."""

    def test_a_batch_is_a_key_range(self, sql_backend: contract.Backend) -> None:
        """With 20,000 events, the statements that pick and delete a batch are planned on
        the primary key (no full scan), so their cost follows the batch, not the log."""
        s = sql_backend.open()
        assert isinstance(s, SqlStore)
        try:
            for start in range(0, 20_000, 5_000):
                write(s, *(float(i) for i in range(start, start + 5_000)))
            with s.engine.begin() as conn:
                postgres = conn.dialect.name == "postgresql"
                if postgres:
                    conn.exec_driver_sql("ANALYZE events")
                statements = batch_statements(conn, before=100.0, keep=1_000, limit=500)
                assert len(statements) == 2
                for stmt in statements:
                    sql = str(stmt.compile(conn, compile_kwargs={"literal_binds": True}))
                    explain = "EXPLAIN " if postgres else "EXPLAIN QUERY PLAN "
                    plan = "\n".join(str(r[-1]) for r in conn.execute(sa.text(explain + sql)))
                    if postgres:
                        assert "Seq Scan" not in plan, (sql, plan)
                        assert "events_pkey" in plan, (sql, plan)
                    else:
                        assert "INTEGER PRIMARY KEY" in plan, (sql, plan)
        finally:
            s.close()
