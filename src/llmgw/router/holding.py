"""Holding requests for models with no available replica (scale from zero).

A request whose model has no replica that can take it waits here, bounded in
count (`max_held`) and in time (the caller's deadline), and proceeds when the
endpoint list changes. Waiters are woken by `notify_changed()`, which the
router calls after every `Registry.replace()`; they also re-check on a short
poll, because a breaker leaving its cooldown changes availability without any
list change.

What is held is demand: `demand()` is what the usage report tells the
controller, so it can start a replica for a model nobody is running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from llmgw.router.errors import HoldQueueFull


class Holding:
    """Counts held requests per model and wakes them when endpoints change."""

    def __init__(self, *, max_held: int = 1000) -> None:
        self.max_held = max_held
        self._held: dict[str, int] = {}
        self._total = 0
        # One event per generation: notify sets the current one and starts a new
        # one, so a waiter never misses a change that happened while it looked.
        self._changed = asyncio.Event()

    @property
    def total(self) -> int:
        return self._total

    def demand(self) -> dict[str, int]:
        """Model → requests held now (models with none are absent)."""
        return dict(sorted(self._held.items()))

    def notify_changed(self) -> None:
        """The endpoint list changed: every waiter looks again."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    @contextmanager
    def hold(self, model: str) -> Iterator[None]:
        """Count one held request for `model` for the duration of the block."""
        if self._total >= self.max_held:
            raise HoldQueueFull(model)
        self._total += 1
        self._held[model] = self._held.get(model, 0) + 1
        try:
            yield
        finally:
            self._total -= 1
            left = self._held[model] - 1
            if left:
                self._held[model] = left
            else:
                del self._held[model]

    async def wait_changed(self, *, timeout_s: float) -> bool:
        """Wait for the next `notify_changed()`; False when `timeout_s` passed first."""
        if timeout_s <= 0:
            return False
        event = self._changed
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            return False
        return True
