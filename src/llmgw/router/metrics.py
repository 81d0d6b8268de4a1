"""The router's own Prometheus metrics (reference: docs/metrics.md).

Per request the router touches one counter child and up to two histogram
children, looked up in a dict keyed by their labels (prometheus_client's
`labels()` is several times slower than a dict hit). Everything that
describes the registry (breaker state, inflight, scrape age, held requests) is
read from live state when /metrics is scraped, by a collector: zero cost per
request, and never out of date.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.router import compiled
from llmgw.router.breaker import BreakerState
from llmgw.router.endpoint import Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds. Router-side latency spans sub-millisecond errors to minutes-long generations.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Gaps between relayed stream chunks: engines emit one every few to a few hundred ms.
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5)

# The `outcome` label of llmgw_router_requests_total: a closed set.
OK = "ok"  # a 2xx answer or a stream that ended cleanly
REJECTED = "rejected"  # the router's own 4xx: bad body, no key, too large, unknown model/URL
ENGINE_ERROR = "engine_error"  # an engine's 4xx/5xx (or in-stream error event) relayed
UNAVAILABLE = "unavailable"  # the router's 503: no replica could take it
STREAM_BROKEN = "stream_broken"  # the stream broke after bytes reached the client
TIMEOUT = "timeout"  # the request's deadline passed mid-stream
DISCONNECTED = "disconnected"  # the client went away before the answer was complete
OUTCOMES = (OK, REJECTED, ENGINE_ERROR, UNAVAILABLE, STREAM_BROKEN, TIMEOUT, DISCONNECTED)

# Breaker state as a number, for alerting on `> 0`.
BREAKER_VALUE = {BreakerState.CLOSED: 0.0, BreakerState.HALF_OPEN: 1.0, BreakerState.OPEN: 2.0}


class _LiveCollector(Collector):
    """Gauges computed from the registry and hold queue at scrape time."""

    def __init__(
        self,
        snapshots: Callable[[], Sequence[Snapshot]],
        held: Callable[[], Mapping[str, int]],
    ) -> None:
        self._snapshots = snapshots
        self._held = held

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
        yield from (breaker, inflight, pending, age, stale, held)


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
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._requests = Counter(
            "llmgw_router_requests",
            "Requests answered, by model, endpoint, HTTP status and outcome.",
            ["model", "endpoint", "code", "outcome"],
            registry=r,
        )
        self._latency = Histogram(
            "llmgw_router_request_duration_seconds",
            "Seconds from request received to response complete.",
            ["model", "endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._ttft = Histogram(
            "llmgw_router_time_to_first_token_seconds",
            "Seconds from request received to the first streamed byte sent.",
            ["model", "endpoint"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self._itl = Histogram(
            "llmgw_router_inter_token_latency_seconds",
            "Seconds between two relayed chunks of a stream (one chunk is usually one token).",
            ["model"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self._prompt = Counter(
            "llmgw_router_prompt_tokens",
            "Prompt tokens of answered requests, from the usage the engines returned.",
            ["model"],
            registry=r,
        )
        self._completion = Counter(
            "llmgw_router_completion_tokens",
            "Completion tokens of answered requests, from the usage the engines returned.",
            ["model"],
            registry=r,
        )
        self._cached = Counter(
            "llmgw_router_cached_tokens",
            "Prompt tokens the engines served from their prefix cache "
            "(usage.prompt_tokens_details.cached_tokens).",
            ["model"],
            registry=r,
        )
        self._retries = Counter(
            "llmgw_router_retries",
            "Attempts retried on another replica, by the endpoint that failed.",
            ["model", "endpoint"],
            registry=r,
        )
        self._scrape_failures = Counter(
            "llmgw_router_scrape_failures",
            "Failed metric scrapes per endpoint.",
            ["endpoint"],
            registry=r,
        )
        modules = Gauge(
            "llmgw_router_compiled",
            "1 for a hot module this router runs compiled by mypyc, 0 for the Python one.",
            ["module"],
            registry=r,
        )
        for module in compiled.MODULES:
            modules.labels(module).set(1.0 if module in compiled.STATUS.modules else 0.0)
        ProcessCollector(registry=r)
        r.register(_LiveCollector(snapshots, held))
        self._children: dict[tuple[Any, ...], Any] = {}
        # Which label of each metric names the endpoint (for forget()).
        self._endpoint_at: dict[Any, int] = {
            self._requests: 1,
            self._latency: 1,
            self._ttft: 1,
            self._retries: 1,
            self._scrape_failures: 0,
        }

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def request_done(
        self,
        model: str,
        endpoint: str,
        code: int,
        duration_s: float,
        ttft_s: float | None = None,
        outcome: str = OK,
    ) -> None:
        self._child(self._requests, model, endpoint, str(code), outcome).inc()
        self._child(self._latency, model, endpoint).observe(duration_s)
        if ttft_s is not None:
            self._child(self._ttft, model, endpoint).observe(ttft_s)

    def tokens(self, model: str, prompt: int, completion: int, cached: int) -> None:
        self._child(self._prompt, model).inc(prompt)
        self._child(self._completion, model).inc(completion)
        self._child(self._cached, model).inc(cached)

    def itl(self, model: str) -> Any:
        """The inter-token histogram child of `model` (a stream observes each gap)."""
        return self._child(self._itl, model)

    def retry(self, model: str, endpoint: str) -> None:
        self._child(self._retries, model, endpoint).inc()

    def scrape_failed(self, endpoint: str) -> None:
        self._child(self._scrape_failures, endpoint).inc()

    def forget(self, endpoint_ids: Sequence[str]) -> None:
        """Drop the series of removed endpoints, so replica churn cannot grow /metrics forever."""
        gone = set(endpoint_ids)
        if not gone:
            return
        for key in list(self._children):
            at = self._endpoint_at.get(key[0])
            if at is not None and key[1 + at] in gone:
                del self._children[key]
                metric, *labels = key
                metric.remove(*labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)
