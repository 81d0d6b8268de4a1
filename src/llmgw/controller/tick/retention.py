"""Token usage and events past their retention, deleted a bounded batch at a time.

Routers' token rows (store/usage.py) are kept per hour, key, team, model and router
process (docs/tenants.md#usage), and the event log gains a row for every change in
the fleet (docs/controller.md#events): both grow for as long as the fleet runs. The
leader deletes what is past each retention, at most `batch_rows` rows per call, on
the control loop: one call every `every_s` while nothing is left to delete, and one
per tick while a batch comes back full, so a backlog (a retention just shortened, a
controller that was down, the first start of a version with the retention) drains
in ticks that each stay short, rather than in one delete that holds the table and
the loop.

A failed delete is logged and tried again at the next interval: nothing depends on
old rows being gone at any moment.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import Final

from llmgw.controller.store import Store, StoreError
from llmgw.runtime.clock import Clock
from llmgw.runtime.logs import kv
from llmgw.wire.usage import HOUR_S

log: Final = logging.getLogger(__name__)

DAY_S = 86_400
# Rows deleted by one call: one short transaction, whatever the backlog.
BATCH_ROWS = 5_000
# Seconds between calls while the last one left nothing to delete.
EVERY_S = 600.0


class _Batches(abc.ABC):
    """One retention's schedule: `tick()` once per control-loop tick."""

    # For the log lines: "usage retention failed", "events pruned".
    what = ""
    pruned = ""

    def __init__(self, *, clock: Clock, batch_rows: int, every_s: float) -> None:
        self._clock = clock
        self.batch_rows = batch_rows
        self.every_s = every_s
        # Monotonic time of the next call; the first tick calls.
        self._next = -float("inf")

    @abc.abstractmethod
    def _on(self) -> bool:
        """Whether this retention deletes anything at all (its settings are not all 0)."""

    @abc.abstractmethod
    def _prune(self) -> int:
        """Delete one batch (blocks: run in a thread); the rows deleted."""

    async def tick(self) -> int:
        """One batch when due; the rows deleted (0 when not due, or off)."""
        now = self._clock.monotonic()
        if not self._on() or now < self._next:
            return 0
        try:
            deleted = await asyncio.to_thread(self._prune)
        except StoreError as exc:
            log.warning(kv(f"{self.what} retention failed", error=exc))
            self._next = now + self.every_s
            return 0
        # A full batch: more may be left, so the next tick goes on.
        self._next = now if deleted >= self.batch_rows else now + self.every_s
        if deleted:
            log.info(kv(f"{self.pruned} pruned", rows=deleted))
        return deleted


class UsageRetention(_Batches):
    """Deletes token usage older than the retention."""

    what, pruned = "usage", "usage"

    def __init__(
        self,
        store: Store,
        *,
        retention_days: float,
        clock: Clock,
        batch_rows: int = BATCH_ROWS,
        every_s: float = EVERY_S,
    ) -> None:
        super().__init__(clock=clock, batch_rows=batch_rows, every_s=every_s)
        self._store = store
        # 0: kept forever, nothing is deleted.
        self.retention_days = retention_days

    def cutoff(self) -> int:
        """Unix seconds of the oldest hour kept: hours wholly older than the retention go."""
        return int((self._clock.wall() - self.retention_days * DAY_S) // HOUR_S) * HOUR_S

    def _on(self) -> bool:
        return self.retention_days > 0

    def _prune(self) -> int:
        return self._store.prune_usage(before=self.cutoff(), limit=self.batch_rows)


class EventRetention(_Batches):
    """Deletes events older than `retention_days`, and those beyond the newest `max_rows`."""

    what, pruned = "event", "events"

    def __init__(
        self,
        store: Store,
        *,
        retention_days: float,
        max_rows: int,
        clock: Clock,
        batch_rows: int = BATCH_ROWS,
        every_s: float = EVERY_S,
    ) -> None:
        super().__init__(clock=clock, batch_rows=batch_rows, every_s=every_s)
        self._store = store
        # 0: no age limit; max_rows 0: no cap. Both 0: the log is kept whole.
        self.retention_days = retention_days
        self.max_rows = max_rows

    def _on(self) -> bool:
        return self.retention_days > 0 or self.max_rows > 0

    def _prune(self) -> int:
        days, rows = self.retention_days, self.max_rows
        return self._store.prune_events(
            before=self._clock.wall() - days * DAY_S if days > 0 else None,
            keep=rows if rows > 0 else None,
            limit=self.batch_rows,
        )
