"""Usage reports, router → controller, once a tick.

Per request the router only bumps two counters (`LoadTracker.started` /
`finished`); everything else is read from the registry and the hold queue
when a report is built. The report costs the same on four replicas as on four
hundred, and nothing here is per request on the wire.

`last_used` comes from the registry, which leaves never-used endpoints out:
a router that just restarted reports nothing, not zeros, so it cannot make
the whole fleet look idle.

Token usage rides along (`tokens`): each tick hands the requests' counts to a
`TokenLedger` (tokenusage.py), and the report carries the ledger's rows the
controller does not have yet; `deliver` marks them taken only on a 2xx. A lost
report loses nothing of them: the next one carries them again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol

import msgspec

from llmgw.router.control.tokenusage import TokenLedger
from llmgw.router.errors import LeaseRefused, ReportRefused
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.runtime.logs import kv
from llmgw.runtime.repeats import FailureLog
from llmgw.wire.leases import KeyDemand, LeaseAnswer
from llmgw.wire.usage import MAX_COUNTER_ID, FlowQueued, ModelLoad, TokenUsage, UsageReport

log: Final = logging.getLogger(__name__)


class LoadTracker:
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
    key_demand: Sequence[KeyDemand] = (),
    flow_queued: Mapping[tuple[str, str], int] | None = None,
) -> UsageReport:
    """One report; maps are copied and sorted so equal states encode equally.
    `flow_queued`: (band, team) → requests waiting in flow control."""
    return UsageReport(
        flow_queued=[
            FlowQueued(band=band, team=team, requests=n)
            for (band, team), n in sorted((flow_queued or {}).items())
            if n > 0
        ],
        router_id=router_id,
        sent_at=sent_at,
        last_used=dict(sorted(last_used.items())),
        inflight=dict(sorted(inflight.items())),
        demand=dict(sorted(demand.items())),
        load=dict(sorted(load.items())),
        key_demand=list(key_demand),
    )


def counter_id(router_id: str, incarnation: str) -> str:
    """The `counter_id` of this process's token rows: `router_id@incarnation`, within
    MAX_COUNTER_ID for any router_id the controller takes.

    A router_id too long for that is cut, and a hash of it whole put in place of the
    rest, so two long ids that share their start still count apart. Joined whole, one
    past about 110 characters made every report with token rows a 422, and the router
    gave those rows up.
    """
    whole = f"{router_id}@{incarnation}"
    if len(whole) <= MAX_COUNTER_ID:
        return whole
    digest = hashlib.sha256(router_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    keep = MAX_COUNTER_ID - len(digest) - len(incarnation) - 2
    return f"{router_id[:keep]}~{digest}@{incarnation}"


class ReportSink(Protocol):
    """Where reports go: the controller (`sources.ControllerClient`) or a test fake.

    Answers the shares it leases the router (None: it leased nothing, wire.leases).
    """

    async def post_usage(self, report: UsageReport) -> LeaseAnswer | None: ...


async def deliver(
    sink: ReportSink, ledger: TokenLedger, report: UsageReport, counted: Sequence[TokenUsage]
) -> tuple[UsageReport, LeaseAnswer | None]:
    """Send `report` with the token rows the controller lacks; raises what the sink raised.

    `counted`: the requests' counts since the last report (TokenCounts.drain).
    Returns the report as sent and the controller's lease answer.
    """
    ledger.add(counted)
    rows = ledger.pending()
    if rows:
        counter = counter_id(report.router_id, ledger.incarnation)
        report = msgspec.structs.replace(report, tokens=rows, counter_id=counter)
    try:
        answer = await sink.post_usage(report)
    except LeaseRefused:
        # The report was kept (2xx); only its answer was unreadable.
        ledger.acked(rows)
        raise
    except ReportRefused as exc:
        # Refused for what it holds: sent again it would be refused again, and every
        # later report with it. Its rows are given up; newer counts go in new rows.
        ledger.acked(rows)
        log.warning(kv("usage report refused", status=exc.status, token_rows_given_up=len(rows)))
        raise
    ledger.acked(rows)
    return report, answer


def report_failures(logger: logging.Logger) -> FailureLog:
    """The log of failed reports: a controller away fails every one (every
    report_interval_s, 2 s by default), said once, then every few minutes, and once
    when one is delivered again (runtime/repeats.py)."""
    return FailureLog(
        "usage report failed",
        cleared="usage reports delivered again",
        count_as="reports_failed",
        logger=logger,
    )


class UsageReporter:
    """Builds a report every tick and sends it when a sink is configured.

    `drain`: the requests' token counts since the last tick (TokenCounts.drain);
    without a sink they are dropped: a router on its own keeps only its per-team
    series (metrics.py), nothing to send.
    """

    def __init__(
        self,
        *,
        build: Callable[[bool], UsageReport],
        sink: ReportSink | None,
        interval_s: float,
        drain: Callable[[], list[TokenUsage]] = list,
        leased: Callable[[LeaseAnswer | None], None] | None = None,
        expire: Callable[[], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._build = build
        self._sink = sink
        self._drain = drain
        # The controller's answer to each delivered report, and the lease's expiry
        # check after every report, delivered or not (control/leases.py).
        self._leased = leased
        self._expire = expire
        self._wake = asyncio.Event()
        self.interval_s = interval_s
        self.ledger = TokenLedger(clock=clock)
        self.last: UsageReport | None = None
        self.failures = 0
        self._clock = clock
        self._failed = report_failures(log)

    async def tick(self) -> UsageReport:
        report = self._build(True)
        counted = self._drain()
        self.last = report
        if self._sink is not None:
            try:
                report, answer = await deliver(self._sink, self.ledger, report, counted)
            except Exception as exc:  # noqa: BLE001 - the next report carries its token rows again
                self.failures += 1
                self._failed.failed(str(exc), now=self._clock.monotonic())
            else:
                self.last = report
                self.failures = 0
                self._failed.worked()
                if self._leased is not None:
                    self._leased(answer)
            if self._expire is not None:
                self._expire()
        return report

    def wake(self) -> None:
        """Report now rather than at the next interval (a key waits for its first share)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            await self.tick()
