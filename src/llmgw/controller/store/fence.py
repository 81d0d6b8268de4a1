"""`FencedStore`: a store that refuses writes once this controller no longer leads."""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.controller.fleet.records import Changes, Event, FleetState
from llmgw.controller.store.base import Leadership, NotLeader, Store
from llmgw.controller.store.sql import SqlStore
from llmgw.wire.usage import TokenUsage, UsageBy, UsageRow


class FencedStore:
    """A Store whose `apply` raises NotLeader unless `leadership.still_leader()`.

    Closes most of the window in which a leader that lost its lock (its
    connection dropped, say) keeps writing while a standby already leads: each
    write checks first. Reads pass through; standbys serve them.
    """

    def __init__(self, store: Store, leadership: Leadership) -> None:
        self.store = store
        self.leadership = leadership
        # The check below and the write are two steps; a leadership that can
        # fence inside the write's own transaction (PostgreSQL) closes the gap.
        guard = getattr(leadership, "write_guard", None)
        if guard is not None and isinstance(store, SqlStore):
            store.write_guard = guard

    def load(self) -> FleetState:
        return self.store.load()

    def apply(self, changes: Changes) -> list[Event]:
        if not self.leadership.still_leader():
            raise NotLeader("this controller does not hold leadership; the write was refused")
        return self.store.apply(changes)

    def events(
        self,
        *,
        model: str | None = None,
        replica: str | None = None,
        node: str | None = None,
        limit: int = 200,
        event_id: int | None = None,
    ) -> list[Event]:
        return self.store.events(
            model=model, replica=replica, node=node, limit=limit, event_id=event_id
        )

    def record_usage(self, router_id: str, rows: Sequence[TokenUsage]) -> None:
        # Not fenced (Store.record_usage): idempotent rows, not fleet state.
        self.store.record_usage(router_id, rows)

    def usage(self, *, since: int, by: UsageBy, limit: int | None = None) -> list[UsageRow]:
        return self.store.usage(since=since, by=by, limit=limit)

    def spent(self, *, keys: Sequence[str], since: int, until: int) -> dict[str, int]:
        return self.store.spent(keys=keys, since=since, until=until)

    def prune_usage(self, *, before: int, limit: int) -> int:
        # Not fenced either: deleting rows past the retention twice deletes them once.
        return self.store.prune_usage(before=before, limit=limit)

    def prune_events(self, *, before: float | None, keep: int | None, limit: int) -> int:
        # Not fenced, as prune_usage.
        return self.store.prune_events(before=before, keep=keep, limit=limit)

    def events_pruned_through(self) -> int:
        return self.store.events_pruned_through()

    def set_leader_url(self, url: str | None) -> None:
        if not self.leadership.still_leader():
            raise NotLeader("this controller does not hold leadership; the write was refused")
        self.store.set_leader_url(url)

    def leader_url(self) -> str | None:
        return self.store.leader_url()

    def schema_version(self) -> int:
        return self.store.schema_version()

    def close(self) -> None:
        self.store.close()
