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
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from llmgw.router.errors import HoldQueueFull
from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.runtime.peers import Peer, share_of
from llmgw.wire.endpoints import ModelOutlook

# A request refused because its model cannot be placed still counts as demand
# this long (usage reports), so the controller keeps trying and shows it waiting.
REFUSED_DEMAND_S = 15.0


def hold_until(
    snaps: Sequence[Snapshot],
    *,
    now: float,
    deadline: float,
    opened: Mapping[str, int],
    outlook: ModelOutlook | None = None,
    probe_wait_until: float | None = None,
) -> float | None:
    """The one rule for how long a request with no usable replica waits (docs/hardening.md).

    `snaps` are its model's replicas now, `deadline` the hold deadline (arrival +
    hold_timeout_s, within the request's own deadline), `opened` each replica's
    breaker open count when the wait began. The answer is the monotonic time the
    wait ends at (the request is answered 503 then unless a replica turns up),
    or None: answer 503 now. `probe_wait_until` (when the wait began plus the
    breakers' first cooldown; None: no bound) caps the wait for a probe.

    - No replica at all, and the controller says it cannot place one (`outlook`
      cannot_place: no room, nothing to evict): now, with its reason.
    - No replica at all (scale from zero, a replica starting, room being made):
      the hold deadline.
    - Every replica's breaker open: the earliest probe, or the hold deadline if
      that comes first; then the request tries (perhaps as the probe itself).
      Never past `probe_wait_until`: a dead engine's cooldown doubles with
      every failed probe (20 s, 40 s ... up to max_cooldown_s), and a request
      arriving late in a long one would wait through all of it for a verdict
      already known. Then it is answered 503 with the time of the next probe,
      unless a replica turned up meanwhile.
    - A probe failed while the request waited (a breaker opened again): now.
      So no request waits through more than one probe's verdict, whenever it came.
    - Otherwise (a probe is out, its verdict pending): the hold deadline; the
      verdict, like any list change, wakes the request.

    Any list change wakes a waiting request, which then looks again.
    """
    if not snaps:
        if outlook is not None and outlook.state == "cannot_place":
            return None
        return deadline
    if any(s.opened_total > opened.get(s.id, s.opened_total) for s in snaps):
        return None
    probes = [s.probe_in_s for s in snaps if s.breaker is BreakerState.OPEN]
    if len(probes) == len(snaps):
        until = min(deadline, now + min(p or 0.0 for p in probes))
        return until if probe_wait_until is None else min(until, probe_wait_until)
    return deadline


# Retry-After of a request refused because its model cannot be placed: the
# controller's word (when an eviction could make room), bounded; this when it
# gave none (an older controller). Past the bound a client should not sleep
# blind: capacity can come back sooner (a node added, a model scaled down).
UNPLACEABLE_RETRY_DEFAULT_S = 30
UNPLACEABLE_RETRY_MAX_S = 300


def unplaceable_retry_after_s(look: ModelOutlook) -> int:
    """Whole seconds for Retry-After when `look` (cannot_place) refuses a request:
    its retry_after_s rounded up, within 1..UNPLACEABLE_RETRY_MAX_S."""
    if look.retry_after_s is None or not math.isfinite(look.retry_after_s):
        return UNPLACEABLE_RETRY_DEFAULT_S
    return min(UNPLACEABLE_RETRY_MAX_S, max(1, math.ceil(look.retry_after_s)))


def held_too_long(hold_s: float, look: ModelOutlook | None) -> str:
    """Why a held request ends without a replica, with what the controller last said
    (a start that takes longer than the hold says so, with its usual duration)."""
    why = f"none became available within {hold_s:g}s"
    if look is not None and look.reason:
        why += f" (the controller: {look.reason})"
    return why


def retry_after_s(snaps: Sequence[Snapshot]) -> int:
    """Whole seconds (at least 1) until the earliest open breaker admits its probe."""
    probes = [s.probe_in_s for s in snaps if s.probe_in_s is not None]
    return max(1, int(min(probes, default=1.0) + 0.999))


class Holding:
    """Counts held requests per model and wakes them when endpoints change."""

    def __init__(
        self, *, max_held: int = 1000, client_share: float = 1.0, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.max_held = max_held
        # Held requests one client address may have (runtime/peers.py): one client
        # with many requests for a model nobody serves does not fill the queue.
        self.max_held_each = share_of(max_held, client_share)
        self._clock = clock
        self._held: dict[str, int] = {}
        # Model → monotonic time of the last request refused as unplaceable.
        self._refused: dict[str, float] = {}
        self._total = 0
        # One event per generation: notify sets the current one and starts a new
        # one, so a waiter never misses a change that happened while it looked.
        self._changed = asyncio.Event()

    @property
    def total(self) -> int:
        return self._total

    def demand(self) -> dict[str, int]:
        """Model → requests held now, or 1 for a model refused as unplaceable within
        REFUSED_DEMAND_S (the demand is real; models with none are absent)."""
        now = self._clock.monotonic()
        out = dict(self._held)
        for model, at in list(self._refused.items()):
            if now - at > REFUSED_DEMAND_S:
                del self._refused[model]
            else:
                out.setdefault(model, 1)
        return dict(sorted(out.items()))

    def refused(self, model: str) -> None:
        """A request for `model` was refused at once because it cannot be placed."""
        self._refused[model] = self._clock.monotonic()

    def notify_changed(self) -> None:
        """The endpoint list changed: every waiter looks again."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    @contextmanager
    def hold(self, model: str, peer: Peer | None = None) -> Iterator[None]:
        """Count one held request for `model` (from `peer`'s address) for the block."""
        if self._total >= self.max_held:
            raise HoldQueueFull(model)
        if peer is not None:
            if peer.held >= self.max_held_each:
                raise HoldQueueFull(model, share=True)
            peer.held += 1
        self._total += 1
        self._held[model] = self._held.get(model, 0) + 1
        try:
            yield
        finally:
            if peer is not None:
                peer.held -= 1
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
