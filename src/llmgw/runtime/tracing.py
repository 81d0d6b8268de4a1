"""OpenTelemetry span export, set up once for the router and the controller alike.

Each program decides what its spans say (router/request/tracing.py, controller/fleet/spans.py);
what they share is here: the settings, the SDK loaded only when tracing is on (so a
program without `tracing` configured never imports it), the refusal to start when it
is configured and the SDK is missing, and the export itself: spans are batched and
sent over OTLP/HTTP (protobuf) by the SDK's own thread, never on the event loop.

What export loses is counted (`SpanLosses`) and put on each program's /metrics
(`SpansDropped`): the SDK only logs a full queue and a failed export, its repeats
filtered, so a collector away for hours read on a dashboard as a quiet hour. The
SDK-facing half, a batch processor that counts, is spanqueue.py, imported only when
tracing is on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.runtime.logs import kv

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)

# How long stopping waits for the spans still batched to be sent. The SDK's own
# shutdown waits up to 30 s for its export thread, which sits in an export for up to
# `export_timeout_s` per batch (retrying a collector that is down, hung or answering
# 429): a router or controller given SIGTERM took 10 to 30 s to exit, past a
# supervisor's grace, because its collector was away. A collector that is up takes
# well under this for a full queue; one that is not loses those spans, not the stop.
SHUTDOWN_WAIT_S: Final = 3.0


class TracingUnavailable(RuntimeError):
    """Tracing is configured, but the OpenTelemetry SDK is not installed."""


def require_sdk() -> None:
    """TracingUnavailable unless the SDK and its OTLP/HTTP exporter can be imported: a
    program checks this at start, before it serves, to refuse with one line."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise TracingUnavailable(
            "tracing is configured but the OpenTelemetry SDK is not installed "
            "(pip install 'llmgw[tracing]')"
        ) from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class TracingSettings:
    """Where spans go and how often (docs/tracing.md)."""

    # The OTLP/HTTP traces URL, e.g. http://otel-collector:4318/v1/traces.
    endpoint: str
    # The spans' service.name resource attribute.
    service_name: str
    # Fraction of the traces this program starts that are kept (0 to 1); a parent's
    # sampled flag, when a span has one, is followed whatever this is.
    sample_ratio: float = 1.0
    # Spans are batched and sent this often, off the event loop.
    export_interval_s: float = 5.0
    # One export's limit; a collector slower than this loses that batch, not the program.
    export_timeout_s: float = 10.0
    # Spans ended and not yet handed to the exporter, at most; one more is dropped (and
    # counted). The SDK's default; a collector away for long holds this many at most.
    max_queued_spans: int = 2048


# The `reason` label of llmgw_<program>_spans_dropped_total: a closed set.
QUEUE_FULL: Final = "queue_full"  # ended while max_queued_spans were waiting: never sent
EXPORT_FAILED: Final = "export_failed"  # handed to the exporter, which gave up on them
REASONS: Final = (QUEUE_FULL, EXPORT_FAILED)


class SpanLosses:
    """The spans export lost, by reason, and the queue bound that decides a drop.

    Thread-safe: spans end on the event loop, exports finish on the SDK's thread.
    `waiting` counts spans admitted and not yet handed to the exporter, which is at
    least what the SDK's own queue holds (it pops a batch just before the hand-over),
    so a queue sized `max_queued` never drops on its own: every loss is one counted here.
    """

    def __init__(self, *, max_queued: int) -> None:
        self._max_queued = max_queued
        self._lock = threading.Lock()
        self._waiting = 0
        self._lost = dict.fromkeys(REASONS, 0)

    @property
    def max_queued(self) -> int:
        """Spans that may wait for the exporter at once."""
        return self._max_queued

    def admit(self) -> bool:
        """Whether an ended span may join the queue; False: it is dropped, and counted."""
        with self._lock:
            if self._waiting >= self._max_queued:
                self._lost[QUEUE_FULL] += 1
                return False
            self._waiting += 1
            return True

    def handed(self, count: int) -> None:
        """`count` spans left the queue for the exporter."""
        with self._lock:
            self._waiting = max(0, self._waiting - count)

    def failed(self, count: int) -> None:
        """The exporter gave up on `count` spans (after its own retries)."""
        with self._lock:
            self._lost[EXPORT_FAILED] += count

    def lost(self) -> dict[str, int]:
        """Spans lost so far, by reason (every reason, zeros included)."""
        with self._lock:
            return dict(self._lost)


class SpansDropped(Collector):
    """`llmgw_<program>_spans_dropped_total` on a program's /metrics: a series per reason
    while tracing is on (zeros from the start, so a rate has a base), none while it is
    off. `losses` is read when scraped: tracing is set up after the registry."""

    def __init__(self, program: str, losses: Callable[[], SpanLosses | None]) -> None:
        self._name = f"llmgw_{program}_spans_dropped"
        self._losses = losses

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            self._name,
            "Spans never received by the collector: dropped with the export queue full, "
            "or given up on by a failed export.",
            labels=["reason"],
        )
        losses = self._losses()
        if losses is not None:
            for reason, count in losses.lost().items():
                family.add_metric([reason], float(count))
        yield family


class SpanExport:
    """A tracer provider exporting over OTLP/HTTP in batches; `tracer` makes the spans.

    TracingUnavailable when the SDK is not installed (`pip install 'llmgw[tracing]'`).
    """

    def __init__(
        self, settings: TracingSettings, *, scope: str, exporter: SpanExporter | None = None
    ) -> None:
        """`exporter`: where batches go (tests give an in-memory one); None: OTLP/HTTP to
        `settings.endpoint`."""
        require_sdk()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        from llmgw.runtime.spanqueue import CountingBatch

        self._provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name}),
            sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
        )
        if exporter is None:
            exporter = OTLPSpanExporter(
                endpoint=settings.endpoint, timeout=settings.export_timeout_s
            )
        # Lost spans, counted for /metrics (SpansDropped).
        self.losses = SpanLosses(max_queued=settings.max_queued_spans)
        self._provider.add_span_processor(
            CountingBatch(exporter, self.losses, export_interval_s=settings.export_interval_s)
        )
        # The SDK's Tracer: typed Any so callers need not import the SDK to type it.
        self.tracer: Any = self._provider.get_tracer(scope)

    def shutdown(self, *, wait_s: float = SHUTDOWN_WAIT_S) -> None:
        """Export what is still batched, waiting at most `wait_s`, then stop (blocks:
        call it off the event loop)."""
        # The SDK's shutdown takes no limit of its own, so it runs on a daemon thread
        # that is left behind after `wait_s`: a daemon thread does not hold the
        # process's exit, and its export thread is a daemon too.
        stopping = threading.Thread(
            target=self._provider.shutdown, name="llmgw-span-shutdown", daemon=True
        )
        stopping.start()
        stopping.join(wait_s)
        if stopping.is_alive():
            log.warning(kv("tracing stopped with spans unsent", wait_s=wait_s))
