"""Token usage past its retention, deleted a bounded batch at a time (docs/tenants.md#usage).

Routers' token rows (store/usage.py) are kept per hour, key, team, model and router
process, so the table grows with every hour the fleet serves. The leader deletes the
hours older than `usage_retention_days`, at most `batch_rows` rows per call, on the
control loop: one call every `every_s` while nothing is left to delete, and one per
tick while a batch comes back full, so a backlog (a retention just shortened, a
controller that was down) drains in ticks that each stay short, rather than in one
delete that holds the table and the loop.

A failed delete is logged and tried again at the next interval: nothing depends on
old rows being gone at any moment.
"""

from __future__ import annotations

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


class UsageRetention:
    """Deletes token usage older than the retention; `tick()` once per control-loop tick."""

    def __init__(
        self,
        store: Store,
        *,
        retention_days: float,
        clock: Clock,
        batch_rows: int = BATCH_ROWS,
        every_s: float = EVERY_S,
    ) -> None:
        # retention_days 0: kept forever, nothing is deleted.
        self._store = store
        self.retention_days = retention_days
        self._clock = clock
        self.batch_rows = batch_rows
        self.every_s = every_s
        # Monotonic time of the next call; the first tick calls.
        self._next = -float("inf")

    def cutoff(self) -> int:
        """Unix seconds of the oldest hour kept: hours wholly older than the retention go."""
        return int((self._clock.wall() - self.retention_days * DAY_S) // HOUR_S) * HOUR_S

    async def tick(self) -> int:
        """One batch when due; the rows deleted (0 when not due, or off)."""
        now = self._clock.monotonic()
        if self.retention_days <= 0 or now < self._next:
            return 0
        before = self.cutoff()
        try:
            deleted = await asyncio.to_thread(
                self._store.prune_usage, before=before, limit=self.batch_rows
            )
        except StoreError as exc:
            log.warning(kv("usage retention failed", error=exc))
            self._next = now + self.every_s
            return 0
        # A full batch: more may be left, so the next tick goes on.
        self._next = now if deleted >= self.batch_rows else now + self.every_s
        if deleted:
            log.info(kv("usage pruned", rows=deleted, before=before))
        return deleted
