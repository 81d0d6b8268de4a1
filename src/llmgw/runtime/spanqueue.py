"""The SDK's batch span processor, bounded and counted by llmgw (runtime/tracing.py).

Imported only when tracing is on: it subclasses the OpenTelemetry SDK's classes.

The SDK drops a span when its queue is full and gives up on a batch its exporter
failed, and says so only in log lines whose repeats it filters. Its own counters need the
SDK's metrics pipeline and an environment switch, and its queue is private. So the
bound is kept here instead (`SpanLosses.admit`, before a span reaches the SDK's
queue, which is sized so it never drops on its own), and the exporter is wrapped to
see what leaves the queue and what fails: every loss is counted, none twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from llmgw.runtime.tracing import SpanLosses

# Spans sent in one export at most (the SDK's default), fewer with a smaller queue.
MAX_BATCH = 512


class CountingExporter(SpanExporter):
    """`inner`, telling `losses` what it was handed and what it failed to send."""

    def __init__(self, inner: SpanExporter, losses: SpanLosses) -> None:
        self._inner = inner
        self._losses = losses

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._losses.handed(len(spans))
        try:
            result = self._inner.export(spans)
        except Exception:
            # Counted, then left to the SDK, which logs it and goes on with the next batch.
            self._losses.failed(len(spans))
            raise
        if result is not SpanExportResult.SUCCESS:
            self._losses.failed(len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class CountingBatch(BatchSpanProcessor):
    """A batch processor whose queue bound is `losses`' (counted), not the SDK's (silent)."""

    def __init__(
        self, exporter: SpanExporter, losses: SpanLosses, *, export_interval_s: float
    ) -> None:
        bound = losses.max_queued
        super().__init__(
            CountingExporter(exporter, losses),
            max_queue_size=bound,
            schedule_delay_millis=export_interval_s * 1000,
            max_export_batch_size=min(MAX_BATCH, bound),
        )
        self._losses = losses

    def on_end(self, span: ReadableSpan) -> None:
        # The SDK's own test, first: an unsampled span was never to be sent, so not lost.
        if not (span.context and span.context.trace_flags.sampled):
            return
        if self._losses.admit():
            super().on_end(span)
