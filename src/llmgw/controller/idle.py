"""Idle tracking: what the routers say about whether anyone wants a replica.

Routers report once a tick (`POST /v1/usage`) a map of endpoint id (= replica
id) → unix seconds of the last dispatch there. Reports from every router are
merged, newest timestamp wins, and *absence is not zero*: a router that has just
restarted knows nothing, and if its empty map counted as "never used" one
restart would nominate the whole fleet for eviction. So an absent entry never
overwrites a known timestamp, and a replica no router has reported stays
unknown (`None`), never idle.

The rest of a report (in-flight counts, demand for models with no replica, load
per model) is a reading *now*, not a history: only each router's latest report
counts, and only while it is fresh (received within `fresh_s`), so a router that
died stops holding demand up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.wire.usage import FlowQueued, UsageReport

# Replica id → seconds since a router last used it; None when no router has said.
IdleFor = Callable[[str], float | None]
# Replica id → requests in flight there over fresh routers; None when none reported it.
InflightFor = Callable[[str], int | None]


class IdleSource(Protocol):
    """What IdleTracker offers; accepted wherever an IdleFor is."""

    def idle_for(self, replica_id: str, *, now: float) -> float | None: ...


def idle_fn(idle: IdleFor | IdleSource, *, now: float) -> IdleFor:
    """A plain replica id → idle seconds function, from either form."""
    if callable(idle):
        return idle
    source = idle
    return lambda replica_id: source.idle_for(replica_id, now=now)


@dataclass(frozen=True, slots=True)
class ModelLoadSum:
    """One model's load over every fresh router (autoscaling input)."""

    # Requests in flight to the model's replicas, summed over routers.
    inflight: int
    # Requests held for lack of a replica, summed over routers.
    held: int
    # Requests started per second, summed over the routers that measured an
    # interval; None when none did (unknown, not zero).
    requests_per_s: float | None
    # How many fresh routers reported this model.
    routers: int


@dataclass(frozen=True, slots=True)
class _Received:
    # Our monotonic clock when it arrived: freshness never trusts a router's clock.
    at: float
    report: UsageReport


class IdleTracker:
    """Merges usage reports; answers idle time, demand and load. Sync, no I/O."""

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, fresh_s: float = 10.0) -> None:
        # fresh_s: a router's last report counts for demand, load and in-flight
        # this long after it arrived (default: a few report intervals).
        self._clock = clock
        self._fresh_s = fresh_s
        self._last_used: dict[str, float] = {}
        self._routers: dict[str, _Received] = {}

    def ingest(self, report: UsageReport) -> None:
        """Merge one router's report: newest timestamp wins; absent entries change nothing."""
        last_used = self._last_used
        # A router's clock ahead of ours: its use counts as when we heard of it. Kept
        # as sent, one far ahead would outrank every later use, and the replica would
        # read idle 0 long after that router went quiet (never evicted, never slept).
        heard = self._clock.wall()
        for rid, sent in report.last_used.items():
            if not math.isfinite(sent):
                continue  # not a measurement; unknown stays unknown
            at = min(sent, heard)
            known = last_used.get(rid)
            if known is None or at > known:
                last_used[rid] = at
        previous = self._routers.get(report.router_id)
        # A late report (sent before the one we hold) must not replace a newer reading.
        if previous is None or report.sent_at >= previous.report.sent_at:
            self._routers[report.router_id] = _Received(at=self._clock.monotonic(), report=report)

    def last_used(self, replica_id: str) -> float | None:
        """Unix seconds of the newest dispatch any router reported; None when none has."""
        return self._last_used.get(replica_id)

    def idle_for(self, replica_id: str, *, now: float) -> float | None:
        """Seconds since the last dispatch (≥ 0); None: no router has reported it."""
        at = self._last_used.get(replica_id)
        if at is None:
            return None
        # A router clock slightly ahead of ours must not give a negative idle time.
        return max(0.0, now - at)

    def forget(self, replica_id: str) -> None:
        """Drop what is known of a replica that is gone."""
        self._last_used.pop(replica_id, None)

    def retain(self, replica_ids: Collection[str]) -> None:
        """Forget every replica not in `replica_ids` (those that still exist)."""
        for rid in [r for r in self._last_used if r not in replica_ids]:
            del self._last_used[rid]

    def inflight(self, replica_id: str) -> int | None:
        """Requests in flight there, summed over fresh routers; None when none reported it."""
        counts = [r.inflight[replica_id] for r in self._fresh_reports() if replica_id in r.inflight]
        return sum(counts) if counts else None

    def demand(self) -> dict[str, int]:
        """Model → requests held for lack of a replica, over fresh routers (scale from zero)."""
        out: dict[str, int] = {}
        for r in self._fresh_reports():
            for model, held in r.demand.items():
                if held > 0:
                    out[model] = out.get(model, 0) + held
        return out

    def flow_queued(self) -> list[FlowQueued]:
        """Requests waiting in the routers' flow control, by band and team, summed over
        fresh routers; only those with any, by band (first served first), then team."""
        acc: dict[tuple[str, str], int] = {}
        for r in self._fresh_reports():
            for q in r.flow_queued:
                if q.requests > 0:
                    acc[q.band, q.team] = acc.get((q.band, q.team), 0) + q.requests
        order = {"critical": 0, "standard": 1, "batch": 2}
        keys = sorted(acc, key=lambda k: (order.get(k[0], 3), k[0], k[1]))
        return [FlowQueued(band=b, team=t, requests=acc[b, t]) for b, t in keys]

    def load(self) -> dict[str, ModelLoadSum]:
        """Model → load summed over fresh routers."""
        acc: dict[str, tuple[int, int, float | None, int]] = {}
        for r in self._fresh_reports():
            for model, ml in r.load.items():
                inflight, held, rate, routers = acc.get(model, (0, 0, None, 0))
                if ml.interval_s > 0:
                    measured = ml.requests / ml.interval_s
                    rate = measured if rate is None else rate + measured
                acc[model] = (inflight + ml.inflight, held + ml.held, rate, routers + 1)
        return {
            model: ModelLoadSum(inflight=i, held=h, requests_per_s=rate, routers=n)
            for model, (i, h, rate, n) in sorted(acc.items())
        }

    def _fresh_reports(self) -> list[UsageReport]:
        now = self._clock.monotonic()
        stale = [rid for rid, got in self._routers.items() if now - got.at > self._fresh_s]
        for rid in stale:
            # A router that stopped reporting holds nothing up; it returns with its next report.
            del self._routers[rid]
        return [self._routers[rid].report for rid in sorted(self._routers)]
