"""The router's own Prometheus metrics (DESIGN §2.9).

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
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.router.breaker import BreakerState
from llmgw.router.endpoint import Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds. Router-side latency spans sub-millisecond errors to minutes-long generations.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

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
            stale.add_metric([s.id], 1.0 if s.stale else 0.0)
            if s.age_s is not None:
                age.add_metric([s.id], s.age_s)
        held = GaugeMetricFamily(
            "llmgw_router_held", "Requests held for lack of a replica.", labels=["model"]
        )
        for model, n in self._held().items():
            held.add_metric([model], float(n))
        yield from (breaker, inflight, age, stale, held)


class RouterMetrics:
    """The router's metric registry and the cheap per-request recording calls."""

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
            "Requests answered, by model, endpoint and HTTP status.",
            ["model", "endpoint", "code"],
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
        ProcessCollector(registry=r)
        r.register(_LiveCollector(snapshots, held))
        self._children: dict[tuple[Any, ...], Any] = {}

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
    ) -> None:
        self._child(self._requests, model, endpoint, str(code)).inc()
        self._child(self._latency, model, endpoint).observe(duration_s)
        if ttft_s is not None:
            self._child(self._ttft, model, endpoint).observe(ttft_s)

    def retry(self, model: str, endpoint: str) -> None:
        self._child(self._retries, model, endpoint).inc()

    def scrape_failed(self, endpoint: str) -> None:
        self._child(self._scrape_failures, endpoint).inc()

    def forget(self, endpoint_ids: Sequence[str]) -> None:
        """Drop the series of removed endpoints, so replica churn cannot grow /metrics forever."""
        gone = set(endpoint_ids)
        for key in [k for k in self._children if gone.intersection(k[1:])]:
            del self._children[key]
            metric, *labels = key
            metric.remove(*labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)
