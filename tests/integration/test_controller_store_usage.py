"""Token usage in the controller store, on SQLite, PostgreSQL and the memory fake."""

from __future__ import annotations

import pytest

from llmgw.controller.fleet.records import Changes
from llmgw.controller.store import Store
from llmgw.controller.store.codec import SCHEMA_VERSION
from llmgw.wire.usage import TokenUsage, UsageRow
from tests.integration import test_controller_store as contract
from tests.integration.test_controller_store_keys import key

# The contract module's fixtures, seen here as globals (as pg.pg_schema is there).
backend = contract.backend
sql_backend = contract.sql_backend
store = contract.store
pg_schema = contract.pg_schema

H = 1_765_000_800  # the start of a UTC hour


def row(
    key: str = "alice",
    team: str = "research",
    model: str = "m1",
    *,
    hour: int = H,
    requests: int = 1,
    prompt: int = 10,
    completion: int = 5,
) -> TokenUsage:
    return TokenUsage(
        hour=hour,
        key=key,
        team=team,
        model=model,
        requests=requests,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


def team_row(team: str, requests: int, prompt: int, completion: int, hour: int = H) -> UsageRow:
    return UsageRow(
        hour=hour,
        team=team,
        requests=requests,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


class TestRecordUsage:
    """Routers' running totals kept and summed."""

    def test_same_report_twice_counts_once(self, store: Store) -> None:
        """A retried report (the same rows again) changes nothing."""
        rows = [row(requests=2, prompt=30, completion=7)]
        store.record_usage("r1", rows)
        store.record_usage("r1", rows)
        assert store.usage(since=H, by="team") == [team_row("research", 2, 30, 7)]

    def test_late_older_report_changes_nothing(self, store: Store) -> None:
        """A report arriving after a newer one from the same router leaves the newer figures."""
        store.record_usage("r1", [row(requests=5, prompt=50, completion=20)])
        store.record_usage("r1", [row(requests=3, prompt=30, completion=10)])
        assert store.usage(since=H, by="team") == [team_row("research", 5, 50, 20)]

    def test_running_totals_grow(self, store: Store) -> None:
        """A newer total of the same router replaces the older one, not adds to it."""
        store.record_usage("r1", [row(requests=1, prompt=10, completion=5)])
        store.record_usage("r1", [row(requests=3, prompt=40, completion=9)])
        assert store.usage(since=H, by="team") == [team_row("research", 3, 40, 9)]

    def test_routers_are_summed(self, store: Store) -> None:
        """Two router processes' totals for one key and hour add up."""
        store.record_usage("r1", [row(requests=1, prompt=10, completion=5)])
        store.record_usage("r2", [row(requests=2, prompt=20, completion=6)])
        assert store.usage(since=H, by="team") == [team_row("research", 3, 30, 11)]

    def test_grouped_by_key_team_and_model(self, store: Store) -> None:
        """By key rows name key and team; by model, the model; each sorted by hour then name."""
        store.record_usage(
            "r1",
            [
                row("bob", "infra", "m2", prompt=1, completion=1),
                row("alice", "research", "m1", prompt=10, completion=5),
                row("alice", "research", "m2", hour=H + 3600, prompt=4, completion=2),
            ],
        )
        by_key = store.usage(since=H, by="key")
        assert [(r.hour, r.key, r.team, r.model) for r in by_key] == [
            (H, "alice", "research", None),
            (H, "bob", "infra", None),
            (H + 3600, "alice", "research", None),
        ]
        by_model = store.usage(since=H, by="model")
        assert [(r.hour, r.model, r.prompt_tokens) for r in by_model] == [
            (H, "m1", 10),
            (H, "m2", 1),
            (H + 3600, "m2", 4),
        ]

    def test_since_leaves_earlier_hours_out(self, store: Store) -> None:
        """Hours before `since` are not in the answer."""
        store.record_usage("r1", [row(hour=H - 3600), row(hour=H, prompt=3)])
        assert [r.hour for r in store.usage(since=H, by="team")] == [H]

    def test_one_report_naming_a_row_twice_keeps_the_larger(self, store: Store) -> None:
        """Two figures for one row in one report: the larger stands (no error)."""
        store.record_usage("r1", [row(prompt=9), row(prompt=4)])
        assert store.usage(since=H, by="team")[0].prompt_tokens == 9

    def test_nothing_recorded_is_an_empty_answer(self, store: Store) -> None:
        """No usage yet: no rows, not zeros."""
        store.record_usage("r1", [])
        assert store.usage(since=0, by="key") == []

    def test_usage_survives_reopening(self, backend: contract.Backend) -> None:
        """Recorded usage is there after the store is closed and opened again."""
        if not backend.persistent:
            pytest.skip("the memory store keeps nothing across processes")
        s = backend.open()
        s.record_usage("r1", [row(requests=4, prompt=40, completion=8)])
        s.close()
        s = backend.open()
        try:
            assert s.usage(since=H, by="team") == [team_row("research", 4, 40, 8)]
        finally:
            s.close()


class TestPruneUsage:
    """Hours past the retention deleted in bounded batches, oldest first."""

    def hours(self, store: Store) -> list[int]:
        return sorted({r.hour for r in store.usage(since=0, by="model")})

    def test_batches_take_the_oldest_rows_first(self, store: Store) -> None:
        """Three old hours of two rows each, pruned two rows at a time: the oldest hour
        goes first, a short batch says nothing older is left, newer hours stay."""
        for i in range(4):
            store.record_usage(
                "r1", [row("alice", hour=H + i * 3600), row("bob", hour=H + i * 3600)]
            )
        cutoff = H + 3 * 3600
        assert store.prune_usage(before=cutoff, limit=2) == 2
        assert self.hours(store) == [H + 3600, H + 2 * 3600, H + 3 * 3600]
        assert store.prune_usage(before=cutoff, limit=3) == 3
        # One row of H + 2 h is left: the next batch takes it and comes back short.
        assert store.prune_usage(before=cutoff, limit=3) == 1
        assert store.prune_usage(before=cutoff, limit=3) == 0
        assert self.hours(store) == [H + 3 * 3600]
        assert [(r.key, r.requests) for r in store.usage(since=0, by="key")] == [
            ("alice", 1),
            ("bob", 1),
        ]

    def test_every_router_row_of_an_hour_goes(self, store: Store) -> None:
        """Rows of one hour from several routers, keys and models are all old alike."""
        store.record_usage("r1", [row("alice"), row("bob", model="m2")])
        store.record_usage("r2", [row("alice"), row("carol", team="infra")])
        store.record_usage("r2", [row("alice", hour=H + 3600)])
        assert store.prune_usage(before=H + 3600, limit=100) == 4
        assert self.hours(store) == [H + 3600]

    def test_nothing_old_deletes_nothing(self, store: Store) -> None:
        """A cutoff before every row, or an empty table, deletes nothing."""
        assert store.prune_usage(before=H, limit=10) == 0
        store.record_usage("r1", [row()])
        assert store.prune_usage(before=H, limit=10) == 0
        assert self.hours(store) == [H]


class TestUsageSchema:
    """The migration that adds token usage."""

    def test_v8_database_upgrades_and_records_usage(self, sql_backend: contract.Backend) -> None:
        """A v8 database reaches the current version, stores keys and records usage."""
        engine = sql_backend.engine()
        try:
            with engine.begin() as conn:
                sql_backend.at_version(conn, 8)
        finally:
            engine.dispose()
        s = sql_backend.open()
        try:
            s.apply(Changes(keys=[key()]))
            assert s.schema_version() == SCHEMA_VERSION
            assert list(s.load().keys) == ["alice"]
            s.record_usage("r1", [row()])
            assert s.usage(since=H, by="key")[0].key == "alice"
        finally:
            s.close()


class TestUsageLimit:
    """`usage(limit=N)`: the newest N rows, oldest hour first as ever."""

    def test_the_newest_rows_are_kept(self, store: Store) -> None:
        """Of three hours of three keys, a limit of 4 keeps the newest hour and one row more."""
        store.record_usage(
            "r1", [row(k, hour=H + i * 3600) for i in range(3) for k in ("a", "b", "c")]
        )
        got = [(r.hour, r.key) for r in store.usage(since=0, by="key", limit=4)]
        assert got == [(H + 3600, "a"), (H + 7200, "a"), (H + 7200, "b"), (H + 7200, "c")]

    def test_a_limit_above_the_rows_changes_nothing(self, store: Store) -> None:
        """A limit the rows do not reach answers what no limit does."""
        store.record_usage("r1", [row(k, hour=H + i * 3600) for i in range(2) for k in "ab"])
        assert store.usage(since=0, by="team", limit=100) == store.usage(since=0, by="team")


class TestSpent:
    """`spent`: each key's tokens in a span of hours, summed in the store."""

    def test_sums_routers_models_and_teams_within_the_span(self, store: Store) -> None:
        """Prompt and completion of every router, model and team of the key, in the span only."""
        store.record_usage(
            "r1",
            [
                row("a", model="m1", prompt=10, completion=5),
                row("a", team="other", model="m2", prompt=1, completion=2),
                row("a", hour=H - 3600, prompt=100),
                row("a", hour=H + 7200, prompt=1000),
                row("b", prompt=7, completion=0),
            ],
        )
        store.record_usage("r2", [row("a", prompt=20, completion=0)])
        assert store.spent(keys=["a", "c"], since=H, until=H + 7200) == {"a": 38}

    def test_no_keys_asks_nothing(self, store: Store) -> None:
        """An empty list of keys: an empty answer."""
        store.record_usage("r1", [row("a")])
        assert store.spent(keys=[], since=0, until=H + 3600) == {}
