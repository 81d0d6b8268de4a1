"""The router's Prometheus metrics: per-request recording and the live registry gauges."""

from __future__ import annotations

from llmgw.router.metrics import RouterMetrics
from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot
from llmgw.wire.endpoints import EndpointInfo


def snap(eid: str, breaker: BreakerState, age_s: float | None) -> Snapshot:
    return Snapshot.of(
        info=EndpointInfo(id=eid, url="http://x", models=("m",)),
        stats=None,
        drain_rate=0.0,
        inflight=2,
        running_capacity=0,
        stale=age_s is None,
        age_s=age_s,
        breaker=breaker,
        restarts=0,
    )


def lines(m: RouterMetrics, prefix: str) -> list[str]:
    return [line for line in m.render().decode().splitlines() if line.startswith(prefix)]


class TestRecording:
    """Per-request metrics and the series forgotten with an endpoint."""

    def test_request_counted_with_labels(self) -> None:
        """A finished request increments its (model, endpoint, code) counter."""
        m = RouterMetrics(snapshots=list, held=dict)
        m.request_done("m", "a", 200, 0.01, ttft_s=0.002)
        m.request_done("m", "a", 200, 0.01)
        assert lines(m, "llmgw_router_requests_total") == [
            'llmgw_router_requests_total{code="200",endpoint="a",model="m",outcome="ok"} 2.0'
        ]
        assert lines(m, "llmgw_router_time_to_first_token_seconds_count") == [
            'llmgw_router_time_to_first_token_seconds_count{endpoint="a",model="m"} 1.0'
        ]

    def test_forget_drops_removed_endpoint_series(self) -> None:
        """Series of an endpoint that left the registry are removed."""
        m = RouterMetrics(snapshots=list, held=dict)
        m.request_done("m", "gone", 200, 0.01)
        m.retry("m", "gone")
        m.forget(["gone"])
        assert lines(m, "llmgw_router_requests_total") == []
        assert lines(m, "llmgw_router_retries_total") == []

    def test_an_endpoint_back_after_forget_counts_from_zero(self) -> None:
        """The series an answer is counted in are found once and kept (per endpoint and
        model); forget() drops them too, so an endpoint that comes back under the same
        id counts in new series, shown on /metrics, from zero."""
        m = RouterMetrics(snapshots=list, held=dict)
        m.request_done("m", "back", 200, 0.01, ttft_s=0.002)
        m.request_done("m", "back", 503, 0.01, outcome="engine_error")
        m.forget(["back"])
        m.request_done("m", "back", 200, 0.02)
        m.request_done("m", "back", 200, 0.03, ttft_s=0.001)
        assert lines(m, "llmgw_router_requests_total") == [
            'llmgw_router_requests_total{code="200",endpoint="back",model="m",outcome="ok"} 2.0'
        ]
        assert lines(m, "llmgw_router_request_duration_seconds_count") == [
            'llmgw_router_request_duration_seconds_count{endpoint="back",model="m"} 2.0'
        ]
        assert lines(m, "llmgw_router_time_to_first_token_seconds_count") == [
            'llmgw_router_time_to_first_token_seconds_count{endpoint="back",model="m"} 1.0'
        ]

    def test_no_first_token_series_without_a_stream(self) -> None:
        """Answers without a first-token time make no empty first-token series."""
        m = RouterMetrics(snapshots=list, held=dict)
        m.request_done("m", "a", 200, 0.01)
        assert lines(m, "llmgw_router_time_to_first_token_seconds_count") == []

    def test_forget_keeps_series_whose_other_labels_match(self) -> None:
        """Only the endpoint label is compared: a model named like a removed id stays."""
        m = RouterMetrics(snapshots=list, held=dict)
        m.request_done("gone", "kept", 200, 0.01)
        m.request_done("m", "gone", 499, 0.01, outcome="disconnected")
        m.forget(["gone"])
        assert lines(m, "llmgw_router_requests_total") == [
            'llmgw_router_requests_total{code="200",endpoint="kept",model="gone",outcome="ok"} 1.0'
        ]

    def test_tokens_counted_per_model(self) -> None:
        """Prompt, completion and cached tokens add up per model."""
        m = RouterMetrics(snapshots=list, held=dict)
        m.tokens("m", 10, 5, 4)
        m.tokens("m", 2, 1, 0)
        assert lines(m, "llmgw_router_prompt_tokens_total") == [
            'llmgw_router_prompt_tokens_total{model="m"} 12.0'
        ]
        assert lines(m, "llmgw_router_completion_tokens_total") == [
            'llmgw_router_completion_tokens_total{model="m"} 6.0'
        ]
        assert lines(m, "llmgw_router_cached_tokens_total") == [
            'llmgw_router_cached_tokens_total{model="m"} 4.0'
        ]


class TestLiveGauges:
    """Registry gauges read at scrape time."""

    def test_registry_state_read_at_scrape_time(self) -> None:
        """Breaker, inflight and held come from live state; unknown scrape age is absent."""
        snaps = [snap("a", BreakerState.OPEN, 1.5), snap("b", BreakerState.CLOSED, None)]
        m = RouterMetrics(snapshots=lambda: snaps, held=lambda: {"cold": 3})
        assert lines(m, "llmgw_router_breaker_state{") == [
            'llmgw_router_breaker_state{endpoint="a"} 2.0',
            'llmgw_router_breaker_state{endpoint="b"} 0.0',
        ]
        assert lines(m, "llmgw_router_scrape_age_seconds{") == [
            'llmgw_router_scrape_age_seconds{endpoint="a"} 1.5'
        ]
        assert lines(m, "llmgw_router_held{") == ['llmgw_router_held{model="cold"} 3.0']


class TestFamiliesMatchPrometheusClient:
    """The router's own counters and histograms render exactly what prometheus_client's
    Counter and Histogram would for the same calls (`_created` values aside)."""

    @staticmethod
    def _text(registry: object) -> list[str]:
        from prometheus_client import generate_latest

        out = generate_latest(registry).decode()  # type: ignore[arg-type]
        # _created samples hold the wall clock at creation: compare the names only.
        return [
            line.rsplit(" ", 1)[0] if "_created{" in line else line for line in out.splitlines()
        ]

    def test_counter_and_histogram_text(self) -> None:
        """Our counter and histogram families render the same text as prometheus_client's."""
        from prometheus_client import CollectorRegistry, Counter, Histogram

        from llmgw.router.metrics import LATENCY_BUCKETS, Buckets, Counts, _Families

        ref, ours = CollectorRegistry(), CollectorRegistry()
        rc = Counter("x_requests", "Help.", ["model", "code"], registry=ref)
        rh = Histogram("x_seconds", "Help.", ["model"], buckets=LATENCY_BUCKETS, registry=ref)
        oc = Counts("x_requests", "Help.", ["model", "code"])
        oh = Buckets("x_seconds", "Help.", ["model"], LATENCY_BUCKETS)
        ours.register(_Families((oc, oh)))
        # Bucket edges included: `le` is "less than or equal".
        values = [0.0, 0.005, 0.0051, 0.01, 0.3, 1, 2.5, 299.9, 300, 301, 1e9]
        for i, v in enumerate(values):
            model = "a" if i % 3 else "b"
            rc.labels(model, "200").inc(i)
            oc.inc((model, "200"), i)
            rh.labels(model).observe(v)
            oh.child((model,)).observe(v)
        assert self._text(ours) == self._text(ref)

    def test_empty_families_still_declare_themselves(self) -> None:
        """Empty families still declare themselves."""
        from prometheus_client import CollectorRegistry, Counter, Histogram

        from llmgw.router.metrics import Buckets, Counts, _Families

        ref, ours = CollectorRegistry(), CollectorRegistry()
        Counter("y_total", "Help.", ["model"], registry=ref)
        Histogram("y_seconds", "Help.", ["model"], buckets=(1, 2), registry=ref)
        ours.register(
            _Families(
                (Counts("y", "Help.", ["model"]), Buckets("y_seconds", "Help.", ["model"], (1, 2)))
            )
        )
        assert self._text(ours) == self._text(ref)
