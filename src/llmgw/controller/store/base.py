"""The store seam: where the controller's fleet state lives between restarts.

The controller keeps its whole `FleetState` in memory and writes through a
`Store` once per command or tick, as one `Changes` value applied in a single
transaction. A `Leadership` says which of several controllers sharing one
database may write; the others serve reads, and one of them takes over
when the lock is free.

Both protocols are synchronous: every call may block on disk or network. The
async controller calls them through `asyncio.to_thread(store.apply, changes)`,
never directly from the event loop. Implementations are safe to call from
several threads at once (reads may overlap a write).

Exceptions, translated once at this seam so callers never see a driver's::

    StoreError            the database refused or failed; the change was not applied
    ├── SchemaTooNew      the database was written by newer code; refuse to touch it
    ├── UnreadableRow     a stored row this code cannot decode (store/readrows.py)
    └── NotLeader         a write was attempted by a controller that does not lead

Anything else escaping `apply` (a value that cannot be encoded, say) is a bug in
the caller; the transaction is rolled back all the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from llmgw.controller.fleet.records import Changes, Event, FleetState
from llmgw.wire.usage import TokenUsage, UsageBy, UsageRow


class StoreError(Exception):
    """The database refused or failed an operation; nothing of it was applied."""


class SchemaTooNew(StoreError):
    """The database's schema version is newer than this code knows.

    Raised at open rather than reading what we might misunderstand or migrating
    "down", which would drop what the newer controller wrote.
    """

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"database schema version {found} is newer than this controller knows ({known}); "
            "upgrade llmgw instead of opening it with an older one"
        )
        self.found = found
        self.known = known


class UnreadableRow(StoreError):
    """A stored row this code cannot decode: written by a newer llmgw (a field it does
    not know) or changed by hand. Raised by `load` for the tables the fleet cannot do
    without (store/readrows.py); the message is one line naming the table and the row,
    and what to do."""

    def __init__(self, table: str, row: str, why: str, remedy: str) -> None:
        super().__init__(
            f"{table} row {row!r} cannot be read by this llmgw ({why}); it was written by a "
            f"newer llmgw or changed by hand: upgrade llmgw to the version that wrote it, or "
            f"{remedy}"
        )
        self.table = table
        self.row = row


class NotLeader(StoreError):
    """A write came from a controller that does not hold leadership."""


class Store(Protocol):
    """Persistent fleet state. All methods block; call them via `asyncio.to_thread`."""

    def load(self) -> FleetState:
        """Everything stored (nodes, models, replicas, retired specs, reservations),
        read as one consistent snapshot."""
        ...

    def apply(self, changes: Changes) -> list[Event]:
        """Write `changes` in ONE transaction, all or nothing.

        Upserts are by key (node name, model name, replica id, retired spec name,
        reservation model); within one call the last value for a key wins. Deletes
        run after upserts, so a key both upserted and deleted ends deleted;
        deleting an absent key is not an error. Returns
        `changes.events` in order with their store-assigned ids (ascending).
        """
        ...

    def events(
        self,
        *,
        model: str | None = None,
        replica: str | None = None,
        node: str | None = None,
        limit: int = 200,
        event_id: int | None = None,
    ) -> list[Event]:
        """The last `limit` events matching every given filter, oldest first.

        `model` matches `Event.model`; `replica` and `node` match events whose
        subject is that replica or node; `event_id` the one event with that id.
        """
        ...

    def record_usage(self, router_id: str, rows: Sequence[TokenUsage]) -> None:
        """Keep `rows`, the running totals counted by `router_id` (one router process's
        counter: UsageReport.counter_id), in one transaction.

        Each figure keeps the largest value recorded for its (hour, key, team, model,
        router_id), so recording the same rows again, or older ones late, changes
        nothing (store/usage.py). Not fenced: usage is not fleet state, and a
        standby that receives a report records it as the leader would.
        """
        ...

    def usage(self, *, since: int, by: UsageBy, limit: int | None = None) -> list[UsageRow]:
        """Token usage of the hours from `since` (unix seconds) on, summed over routers
        per hour and `by` (key, team or model), sorted by hour, then by name.

        `limit`: at most that many rows, the newest: whole hours from the newest back,
        the oldest of them cut after its first names (None: every row)."""
        ...

    def spent(self, *, keys: Sequence[str], since: int, until: int) -> dict[str, int]:
        """Tokens (prompt + completion) each of `keys` used in the hours from `since` up
        to `until` (unix seconds), over every router, team and model: a budget's spend,
        summed where the rows are. A key with no rows there is left out."""
        ...

    def prune_usage(self, *, before: int, limit: int) -> int:
        """Delete at most `limit` token usage rows of hours before `before` (unix
        seconds), oldest first, in one transaction; the number deleted (below `limit`:
        none older is left). Not fenced, as record_usage."""
        ...

    def prune_events(self, *, before: float | None, keep: int | None, limit: int) -> int:
        """Delete at most `limit` events, oldest (lowest id) first, in one transaction:
        those at before `before` (unix seconds; None: none for their age) and those
        older than the newest `keep` ids (None: no cap). The number deleted (below
        `limit`: none of the oldest `limit` was left to go). Not fenced, as record_usage.

        Only the oldest `limit` events are looked at, so an event is judged by its id:
        one stamped by a leader whose clock ran ahead waits for those after it."""
        ...

    def events_pruned_through(self) -> int:
        """The highest event id `prune_events` has deleted (0: none yet): an id at or
        below it that `events` no longer finds aged out."""
        ...

    def set_leader_url(self, url: str | None) -> None:
        """Record the URL this controller, the leader, is reachable at (None: it knows
        none), replacing what an earlier leader recorded. Fenced like `apply`: a
        deposed leader cannot point standbys back at itself."""
        ...

    def leader_url(self) -> str | None:
        """The URL the leader recorded with `set_leader_url`; None when it recorded
        none, or no leader has yet. It may name a leader that has since died."""
        ...

    def schema_version(self) -> int:
        """The schema version the database is at (after the migrations run at open)."""
        ...

    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...


class Leadership(Protocol):
    """Which controller may write. Exactly one holder at a time per database."""

    def try_acquire(self) -> bool:
        """Try to lead without waiting for the lock; True if this process leads now.

        True also when it already led. Raises StoreError when the database cannot
        be reached (the caller retries on its next tick).
        """
        ...

    def still_leader(self) -> bool:
        """Cheap check that the lock is still held; False once it was lost or released."""
        ...

    def release(self) -> None:
        """Stop leading (idempotent); another controller may acquire at once."""
        ...

    def holder(self) -> str | None:
        """Who holds the lock, in words for logs and errors; None when unknown or free."""
        ...
