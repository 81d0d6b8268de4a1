"""Usage reports, router → controller, once a tick.

Per request the router only bumps two counters (`UsageTracker.started` /
`finished`); everything else is read from the registry and the hold queue
when a report is built. The report costs the same on four replicas as on four
hundred, and nothing here is per request on the wire.

`last_used` comes from the registry, which leaves never-used endpoints out:
a router that just restarted reports nothing, not zeros, so it cannot make
the whole fleet look idle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Final, Protocol

from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.runtime.logs import kv
from llmgw.wire.usage import ModelLoad, UsageReport

log: Final = logging.getLogger(__name__)


class UsageTracker:
    """Per-model request counts: started during the interval, in flight now."""

    __slots__ = ("_clock", "_inflight", "_interval_start", "_started")

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._started: dict[str, int] = {}
        self._inflight: dict[str, int] = {}
        self._interval_start = clock.monotonic()

    def started(self, model: str) -> None:
        self._started[model] = self._started.get(model, 0) + 1
        self._inflight[model] = self._inflight.get(model, 0) + 1

    def finished(self, model: str) -> None:
        left = self._inflight.get(model, 0) - 1
        if left > 0:
            self._inflight[model] = left
        else:
            self._inflight.pop(model, None)

    def load(self, held: Mapping[str, int], *, reset: bool) -> dict[str, ModelLoad]:
        """Model → load since the interval began; `reset` starts a new interval."""
        now = self._clock.monotonic()
        interval_s = now - self._interval_start
        models = sorted(set(self._started) | set(self._inflight) | set(held))
        out = {
            m: ModelLoad(
                inflight=self._inflight.get(m, 0),
                held=held.get(m, 0),
                requests=self._started.get(m, 0),
                interval_s=round(interval_s, 3),
            )
            for m in models
        }
        if reset:
            self._started = {}
            self._interval_start = now
        return out


def build_report(
    *,
    router_id: str,
    sent_at: float,
    last_used: Mapping[str, float],
    inflight: Mapping[str, int],
    demand: Mapping[str, int],
    load: Mapping[str, ModelLoad],
) -> UsageReport:
    """One report; maps are copied and sorted so equal states encode equally."""
    return UsageReport(
        router_id=router_id,
        sent_at=sent_at,
        last_used=dict(sorted(last_used.items())),
        inflight=dict(sorted(inflight.items())),
        demand=dict(sorted(demand.items())),
        load=dict(sorted(load.items())),
    )


class ReportSink(Protocol):
    """Where reports go: the controller (`sources.ControllerClient`) or a test fake."""

    async def post_usage(self, report: UsageReport) -> None: ...


class UsageReporter:
    """Builds a report every tick and sends it when a sink is configured."""

    def __init__(
        self,
        *,
        build: Callable[[bool], UsageReport],
        sink: ReportSink | None,
        interval_s: float,
    ) -> None:
        self._build = build
        self._sink = sink
        self.interval_s = interval_s
        self.last: UsageReport | None = None
        self.failures = 0

    async def tick(self) -> UsageReport:
        report = self._build(True)
        self.last = report
        if self._sink is not None:
            try:
                await self._sink.post_usage(report)
            except Exception as exc:  # noqa: BLE001 - a lost report is replaced by the next one
                self.failures += 1
                log.warning(kv("usage report failed", error=exc))
            else:
                self.failures = 0
        return report

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.tick()
