"""Spans export loses, counted for /metrics (runtime/tracing.py, runtime/spanqueue.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llmgw.runtime.tracing import SpanExport, SpanLosses, SpansDropped, TracingSettings

pytest.importorskip("opentelemetry.sdk.trace", reason="the tracing extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class GatedExporter(SpanExporter):
    """Holds each export until `gate` opens, then answers `result` (or raises)."""

    def __init__(self, result: SpanExportResult | None) -> None:
        self.result = result
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.sizes: list[int] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.sizes.append(len(spans))
        self.entered.set()
        self.gate.wait(10)
        if self.result is None:
            raise ConnectionError("collector away")
        return self.result

    def shutdown(self) -> None:
        self.gate.set()


def until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "never held"
        time.sleep(0.01)


def export(exporter: SpanExporter, *, max_queued: int) -> SpanExport:
    settings = TracingSettings(
        endpoint="http://unused:4318/v1/traces",
        service_name="t",
        export_interval_s=0.01,
        max_queued_spans=max_queued,
    )
    return SpanExport(settings, scope="test", exporter=exporter)


def end_spans(ex: SpanExport, count: int) -> None:
    for i in range(count):
        ex.tracer.start_span(f"s{i}").end()


class TestSpanLosses:
    """The queue bound and the counts, without the SDK."""

    def test_admits_up_to_the_bound(self) -> None:
        """Spans past max_queued are dropped and counted; handed ones make room again."""
        losses = SpanLosses(max_queued=2)
        assert [losses.admit() for _ in range(3)] == [True, True, False]
        losses.handed(2)
        assert losses.admit() is True
        assert losses.lost() == {"queue_full": 1, "export_failed": 0}

    def test_failed_counts_spans(self) -> None:
        """A failed export counts each span it carried."""
        losses = SpanLosses(max_queued=8)
        losses.failed(3)
        assert losses.lost() == {"queue_full": 0, "export_failed": 3}


class TestCountingBatch:
    """A real tracer provider with an exporter that holds, then fails."""

    @pytest.mark.parametrize("result", [SpanExportResult.FAILURE, None])
    def test_full_queue_and_failed_exports_counted(self, result: SpanExportResult | None) -> None:
        """With one export held, spans past the bound are dropped; every span of a failed
        (or raising) export counts once: nothing lost is missed, nothing counted twice."""
        exporter = GatedExporter(result)
        ex = export(exporter, max_queued=2)
        try:
            end_spans(ex, 1)
            assert exporter.entered.wait(10)
            end_spans(ex, 4)  # two wait, two find the queue full
            assert ex.losses.lost()["queue_full"] == 2
            exporter.gate.set()
            until(lambda: ex.losses.lost()["export_failed"] == 3)
        finally:
            ex.shutdown()
        assert exporter.sizes == [1, 2]
        assert ex.losses.lost() == {"queue_full": 2, "export_failed": 3}

    def test_sent_spans_not_counted(self) -> None:
        """Spans an export sent are not losses."""
        exporter = GatedExporter(SpanExportResult.SUCCESS)
        exporter.gate.set()
        ex = export(exporter, max_queued=4)
        try:
            end_spans(ex, 3)
            until(lambda: sum(exporter.sizes) == 3)
        finally:
            ex.shutdown()
        assert ex.losses.lost() == {"queue_full": 0, "export_failed": 0}


class TestSpansDropped:
    """The /metrics family."""

    def scrape(self, losses: SpanLosses | None) -> str:
        registry = CollectorRegistry()
        registry.register(SpansDropped("router", lambda: losses))
        return generate_latest(registry).decode()

    def test_both_reasons_from_the_start(self) -> None:
        """Tracing on: a series per reason, zeros included."""
        losses = SpanLosses(max_queued=1)
        losses.failed(2)
        text = self.scrape(losses)
        assert 'llmgw_router_spans_dropped_total{reason="queue_full"} 0.0' in text
        assert 'llmgw_router_spans_dropped_total{reason="export_failed"} 2.0' in text

    def test_no_series_when_off(self) -> None:
        """Tracing off: the family's help and type only, no series."""
        text = self.scrape(None)
        assert "# TYPE llmgw_router_spans_dropped_total counter" in text
        assert "llmgw_router_spans_dropped_total{" not in text
