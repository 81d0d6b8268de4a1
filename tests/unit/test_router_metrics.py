"""The router's Prometheus metrics: per-request recording and the live registry gauges."""

from __future__ import annotations

from llmgw.router.breaker import BreakerState
from llmgw.router.endpoint import Snapshot
from llmgw.router.metrics import RouterMetrics
from llmgw.wire.endpoints import EndpointInfo


def snap(eid: str, breaker: BreakerState, age_s: float | None) -> Snapshot:
    return Snapshot(
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
    def test_request_counted_with_labels(self) -> None:
        """A finished request increments its (model, endpoint, code) counter."""
        m = RouterMetrics(snapshots=list, held=dict)
        m.request_done("m", "a", 200, 0.01, 0.002)
        m.request_done("m", "a", 200, 0.01)
        assert lines(m, "llmgw_router_requests_total") == [
            'llmgw_router_requests_total{code="200",endpoint="a",model="m"} 2.0'
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


class TestLiveGauges:
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
