"""The router's own Prometheus metrics (reference: docs/metrics.md).

Per request the router adds to a few counters and histograms. These are the
module's own (`Counts`, `Buckets`): a dict hit and an add per call, rendered
into the same families prometheus_client's Counter and Histogram would expose
(`_total`, `_bucket`/`_count`/`_sum`, `_created`) when /metrics is scraped.
prometheus_client's own take a lock and re-check their type on every call, and
a histogram walks its buckets in Python, for every request (bench/RESULTS.md,
"Figures once quoted in the router's source"). Everything that describes the
registry (breaker state, inflight, scrape age, held requests) is read from
live state when /metrics is scraped, by a collector: zero cost per request,
and never out of date.
"""

from __future__ import annotations

import math
import os
import time
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from llmgw.router import compiled
from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot
from llmgw.runtime.procmetrics import register_process_metrics
from llmgw.runtime.tracing import SpanLosses, SpansDropped
from llmgw.wire.answerusage import Usage

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

# Seconds. Router-side latency spans sub-millisecond errors to minutes-long generations.
LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TTFT_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Gaps between relayed stream chunks: engines emit one every few to a few hundred ms.
ITL_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5)
# A granted request's wait in flow control: one release (tens of ms) to its band's bound.
FLOW_WAIT_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30)

# The `outcome` label of llmgw_router_requests_total: a closed set.
OK: Final = "ok"  # a 2xx answer or a stream that ended cleanly
REJECTED: Final = "rejected"  # the router's own 4xx: bad body, no key, too large, unknown model/URL
ENGINE_ERROR: Final = "engine_error"  # an engine's 4xx/5xx (or in-stream error event) relayed
UNAVAILABLE: Final = "unavailable"  # the router's 503: no replica could take it
STREAM_BROKEN: Final = "stream_broken"  # the stream broke after bytes reached the client
TIMEOUT: Final = "timeout"  # the request's deadline passed mid-stream
DISCONNECTED: Final = "disconnected"  # the client went away before the answer was complete
OUTCOMES: Final = (OK, REJECTED, ENGINE_ERROR, UNAVAILABLE, STREAM_BROKEN, TIMEOUT, DISCONNECTED)

# Breaker state as a number, for alerting on `> 0`.
BREAKER_VALUE: Final = {
    BreakerState.CLOSED: 0.0,
    BreakerState.HALF_OPEN: 1.0,
    BreakerState.OPEN: 2.0,
}


# prometheus_client's switch for the `_created` series, read the same way.
_CREATED: Final = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in (
    "true",
    "1",
    "t",
)


class Counts:
    """A counter family: per label values, a count and when it was created."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        # label values → [value, created (wall clock)]
        self.series: dict[tuple[str, ...], list[float]] = {}

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        self.cell(labels)[0] += amount

    def cell(self, labels: tuple[str, ...]) -> list[float]:
        """The series' [value, created], made at 0 if new: a caller may keep it and add
        to its value for as long as the series is not forgotten."""
        got = self.series.get(labels)
        if got is None:
            got = self.series[labels] = [0.0, time.time()]
        return got

    def collect(self) -> Metric:
        m = Metric(self.name, self.documentation, "counter")
        for labels, (value, created) in self.series.items():
            named = dict(zip(self.labelnames, labels, strict=True))
            m.add_sample(self.name + "_total", named, value)
            if _CREATED:
                m.add_sample(self.name + "_created", named, created)
        return m


class Bucket:
    """One histogram series: observe() is a bisect and two adds."""

    __slots__ = ("bounds", "counts", "created", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # ends with +Inf
        self.counts = [0.0] * len(bounds)
        self.total = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # The first bucket whose upper bound is >= amount (le), as prometheus_client.
        self.counts[bisect_left(self.bounds, amount)] += 1.0
        self.total += amount


class Buckets:
    """A histogram family: per label values, a `Bucket`."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = (*(float(b) for b in buckets), math.inf)
        # The `le` label as prometheus_client writes it ("0.005", "1.0", "+Inf").
        self._le = [floatToGoString(b) for b in self.bounds]  # type: ignore[no-untyped-call]
        self.series: dict[tuple[str, ...], Bucket] = {}

    def child(self, labels: tuple[str, ...]) -> Bucket:
        got = self.series.get(labels)
        if got is None:
            got = self.series[labels] = Bucket(self.bounds)
        return got

    def collect(self) -> Metric:
        m = Metric(self.name, self.documentation, "histogram")
        for labels, b in self.series.items():
            named = dict(zip(self.labelnames, labels, strict=True))
            acc = 0.0
            for le, n in zip(self._le, b.counts, strict=True):
                acc += n
                m.add_sample(self.name + "_bucket", {**named, "le": le}, acc)
            m.add_sample(self.name + "_count", named, acc)
            m.add_sample(self.name + "_sum", named, b.total)
            if _CREATED:
                m.add_sample(self.name + "_created", named, b.created)
        return m


class _Done:
    """The series one (endpoint, model) pair's answers are counted in, found once:
    a lookup by a tuple of labels is costly (bench/RESULTS.md), and an answer made
    three of them (`RouterMetrics.request_done`)."""

    __slots__ = ("counts", "latency", "ttft")

    def __init__(self, latency: Bucket) -> None:
        self.latency = latency
        self.ttft: Bucket | None = None  # made at the first streamed answer
        # status code → outcome → the requests counter's cell
        self.counts: dict[int, dict[str, list[float]]] = {}


class _Families(Collector):
    """Renders the per-request families at scrape time."""

    def __init__(self, families: Sequence[Counts | Buckets]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for f in self._families:
            yield f.collect()


class _LiveCollector(Collector):
    """Gauges computed from the registry and hold queue at scrape time."""

    def __init__(
        self,
        snapshots: Callable[[], Sequence[Snapshot]],
        held: Callable[[], Mapping[str, int]],
        queued: Callable[[], Mapping[tuple[str, str], int]],
    ) -> None:
        self._snapshots = snapshots
        self._held = held
        self._queued = queued

    def collect(self) -> Iterator[Metric]:
        snaps = self._snapshots()
        breaker = GaugeMetricFamily(
            "llmgw_router_breaker_state",
            "Circuit breaker per endpoint: 0 closed, 1 half-open, 2 open.",
            labels=["endpoint"],
        )
        inflight = GaugeMetricFamily(
            "llmgw_router_inflight", "Requests in flight per endpoint.", labels=["endpoint"]
        )
        pending = GaugeMetricFamily(
            "llmgw_router_pending",
            "Streamed requests in flight per endpoint still awaiting their first token.",
            labels=["endpoint"],
        )
        age = GaugeMetricFamily(
            "llmgw_router_scrape_age_seconds",
            "Seconds since the last successful scrape; absent when never scraped.",
            labels=["endpoint"],
        )
        stale = GaugeMetricFamily(
            "llmgw_router_endpoint_stale",
            "1 when the endpoint's figures are stale.",
            labels=["endpoint"],
        )
        for s in snaps:
            breaker.add_metric([s.id], BREAKER_VALUE.get(s.breaker, 2.0))
            inflight.add_metric([s.id], float(s.inflight))
            pending.add_metric([s.id], float(s.pending))
            stale.add_metric([s.id], 1.0 if s.stale else 0.0)
            if s.age_s is not None:
                age.add_metric([s.id], s.age_s)
        held = GaugeMetricFamily(
            "llmgw_router_held", "Requests held for lack of a replica.", labels=["model"]
        )
        for model, n in self._held().items():
            held.add_metric([model], float(n))
        queued = GaugeMetricFamily(
            "llmgw_router_flow_queued",
            "Requests waiting in flow control's queues (every replica of their model at "
            "capacity), by priority band and team (the key's name for a key without one; "
            "empty for requests without a key).",
            labels=["band", "team"],
        )
        for (band, team), n in self._queued().items():
            queued.add_metric([band, team], float(n))
        yield from (breaker, inflight, pending, age, stale, held, queued)


class RouterMetrics:
    """The router's metric registry and the cheap per-request recording calls.

    Labels stay bounded: `model` is a model the router knows, resolved from an
    alias to the served name ("" for requests naming no known model), `endpoint`
    a replica in the registry ("" when none was chosen), `code` an HTTP status,
    `outcome` one of OUTCOMES. Series of an endpoint that leaves are removed.
    """

    def __init__(
        self,
        *,
        snapshots: Callable[[], Sequence[Snapshot]],
        held: Callable[[], Mapping[str, int]],
        queued: Callable[[], Mapping[tuple[str, str], int]] = dict,
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._requests = Counts(
            "llmgw_router_requests",
            "Requests answered, by model, endpoint, HTTP status and outcome.",
            ["model", "endpoint", "code", "outcome"],
        )
        self._latency = Buckets(
            "llmgw_router_request_duration_seconds",
            "Seconds from request received to response complete.",
            ["model", "endpoint"],
            LATENCY_BUCKETS,
        )
        self._ttft = Buckets(
            "llmgw_router_time_to_first_token_seconds",
            "Seconds from request received to the first streamed byte sent.",
            ["model", "endpoint"],
            TTFT_BUCKETS,
        )
        self._itl = Buckets(
            "llmgw_router_inter_token_latency_seconds",
            "Seconds between two relayed chunks of a stream (one chunk is usually one token).",
            ["model"],
            ITL_BUCKETS,
        )
        self._prompt = Counts(
            "llmgw_router_prompt_tokens",
            "Prompt tokens of answered requests, from the usage the engines returned.",
            ["model"],
        )
        self._completion = Counts(
            "llmgw_router_completion_tokens",
            "Completion tokens of answered requests, from the usage the engines returned.",
            ["model"],
        )
        self._cached = Counts(
            "llmgw_router_cached_tokens",
            "Prompt tokens the engines served from their prefix cache "
            "(usage.prompt_tokens_details.cached_tokens).",
            ["model"],
        )
        self._retries = Counts(
            "llmgw_router_retries",
            "Attempts retried on another replica, by the endpoint that failed.",
            ["model", "endpoint"],
        )
        self._unbuffered = Counts(
            "llmgw_router_unbuffered_answers",
            "Whole answers over max_answer_bytes, relayed as they arrived (their usage "
            "read from their last bytes only).",
            ["model", "endpoint"],
        )
        self._clipped = Counts(
            "llmgw_router_usage_clipped_tokens",
            "Tokens of engines' usage past what their requests could have used (docs/"
            "tenants.md#usage), neither counted nor charged, by the endpoint that claimed them.",
            ["model", "endpoint"],
        )
        self._scrape_failures = Counts(
            "llmgw_router_scrape_failures",
            "Failed metric scrapes per endpoint.",
            ["endpoint"],
        )
        # Per team, never per key: a fleet has few teams and may have thousands of keys.
        self._team_requests = Counts(
            "llmgw_router_team_requests",
            "Requests of client keys, by the key's team, model and outcome.",
            ["team", "model", "outcome"],
        )
        self._team_prompt = Counts(
            "llmgw_router_team_prompt_tokens",
            "Prompt tokens of client keys' answered requests, by team and model.",
            ["team", "model"],
        )
        self._team_completion = Counts(
            "llmgw_router_team_completion_tokens",
            "Completion tokens of client keys' answered requests, by team and model.",
            ["team", "model"],
        )
        self._flow_wait = Buckets(
            "llmgw_router_flow_wait_seconds",
            "Seconds a request waited in flow control's queue before it was granted a "
            "replica, by priority band and team (as llmgw_router_flow_queued).",
            ["band", "team"],
            FLOW_WAIT_BUCKETS,
        )
        families: tuple[Counts | Buckets, ...] = (
            self._requests,
            self._latency,
            self._ttft,
            self._itl,
            self._prompt,
            self._completion,
            self._cached,
            self._retries,
            self._unbuffered,
            self._clipped,
            self._scrape_failures,
            self._team_requests,
            self._team_prompt,
            self._team_completion,
            self._flow_wait,
        )
        r.register(_Families(families))
        modules = Gauge(
            "llmgw_router_compiled",
            "1 for a hot module this router runs compiled by mypyc, 0 for the Python one.",
            ["module"],
            registry=r,
        )
        for module in compiled.MODULES:
            modules.labels(module).set(1.0 if module in compiled.STATUS.modules else 0.0)
        register_process_metrics(r)
        r.register(_LiveCollector(snapshots, held, queued))
        # Spans export lost (runtime/tracing.py); None: tracing is off, set by the app.
        self.span_losses: SpanLosses | None = None
        r.register(SpansDropped("router", lambda: self.span_losses))
        self._held_answers = Gauge(
            "llmgw_router_held_answer_bytes",
            "Bytes of engines' whole answers the router holds now (read, or written and "
            "not yet taken by the client's connection), against max_held_answer_bytes.",
            registry=r,
        )
        # (team, model) → its requests by outcome, its prompt and completion series.
        self._team_cells: dict[
            tuple[str, str], tuple[dict[str, list[float]], list[float], list[float]]
        ] = {}
        # Model → its prompt, completion and cached token series (`tokens`).
        self._token_cells: dict[str, tuple[list[float], list[float], list[float]]] = {}
        # Endpoint → model → its answers' series (`request_done`); emptied by forget().
        self._done: dict[str, dict[str, _Done]] = {}
        # Which label of each family names the endpoint (for forget()).
        self._endpoint_at: dict[Counts | Buckets, int] = {
            self._requests: 1,
            self._latency: 1,
            self._ttft: 1,
            self._retries: 1,
            self._unbuffered: 1,
            self._clipped: 1,
            self._scrape_failures: 0,
        }

    def held_answers(self, held_bytes: Callable[[], float]) -> None:
        """Where the held answers' gauge reads its figure (at scrape time)."""
        self._held_answers.set_function(held_bytes)

    def request_done(
        self,
        model: str,
        endpoint: str,
        code: int,
        duration_s: float,
        *,
        ttft_s: float | None = None,
        outcome: str = OK,
    ) -> None:
        by_model = self._done.get(endpoint)
        if by_model is None:
            by_model = self._done[endpoint] = {}
        done = by_model.get(model)
        if done is None:
            done = by_model[model] = _Done(self._latency.child((model, endpoint)))
        by_outcome = done.counts.get(code)
        if by_outcome is None:
            by_outcome = done.counts[code] = {}
        cell = by_outcome.get(outcome)
        if cell is None:
            cell = by_outcome[outcome] = self._requests.cell((model, endpoint, str(code), outcome))
        cell[0] += 1.0
        done.latency.observe(duration_s)
        if ttft_s is not None:
            ttft = done.ttft
            if ttft is None:
                ttft = done.ttft = self._ttft.child((model, endpoint))
            ttft.observe(ttft_s)

    def tokens(self, model: str, prompt: int, completion: int, cached: int) -> None:
        # The three series of a model, found once: a model's are never forgotten (no
        # endpoint label), and each tuple-keyed lookup is costly (bench/RESULTS.md).
        cells = self._token_cells.get(model)
        if cells is None:
            key = (model,)
            cells = (self._prompt.cell(key), self._completion.cell(key), self._cached.cell(key))
            self._token_cells[model] = cells
        cells[0][0] += prompt
        cells[1][0] += completion
        cells[2][0] += cached

    def team_done(self, team: str, model: str, outcome: str, usage: Usage | None) -> None:
        """A request of a client key of `team` ("" for a file key without one)."""
        # The series of a (team, model), found once, as `tokens` does per model.
        key = (team, model)
        cells = self._team_cells.get(key)
        if cells is None:
            prompt, completion = self._team_prompt.cell(key), self._team_completion.cell(key)
            cells = self._team_cells[key] = ({}, prompt, completion)
        by_outcome = cells[0]
        done = by_outcome.get(outcome)
        if done is None:
            done = by_outcome[outcome] = self._team_requests.cell((team, model, outcome))
        done[0] += 1.0
        if usage is not None:
            cells[1][0] += usage.prompt
            cells[2][0] += usage.completion

    def itl(self, model: str) -> Bucket:
        """The inter-token histogram series of `model` (a stream observes each gap)."""
        return self._itl.child((model,))

    def flow_waited(self, band: str, team: str, seconds: float) -> None:
        """A request of `band` and `team` was granted after `seconds` in flow control."""
        self._flow_wait.child((band, team)).observe(seconds)

    def retain_flow_teams(self, teams: Collection[str]) -> None:
        """Drop the flow-wait series of teams no key in force is queued as now (`teams`:
        each key's team, else its name; "" for requests without a key): a key without a
        team is its own label, and keys come and go (revoked, expired, minted per user),
        so keeping the series of every key that ever waited grew /metrics without end."""
        series = self._flow_wait.series
        for labels in [k for k in series if k[1] not in teams]:
            del series[labels]

    def retry(self, model: str, endpoint: str) -> None:
        self._retries.inc((model, endpoint))

    def unbuffered(self, model: str, endpoint: str) -> None:
        self._unbuffered.inc((model, endpoint))

    def usage_clipped(self, model: str, endpoint: str, tokens: int) -> None:
        self._clipped.inc((model, endpoint), float(tokens))

    def scrape_failed(self, endpoint: str) -> None:
        self._scrape_failures.inc((endpoint,))

    def forget(self, endpoint_ids: Sequence[str]) -> None:
        """Drop the series of removed endpoints, so replica churn cannot grow /metrics forever."""
        gone = set(endpoint_ids)
        if not gone:
            return
        for eid in gone:
            self._done.pop(eid, None)
        for family, at in self._endpoint_at.items():
            for labels in [k for k in family.series if k[at] in gone]:
                del family.series[labels]

    def render(self) -> bytes:
        return generate_latest(self.registry)
