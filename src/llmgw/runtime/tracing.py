"""OpenTelemetry span export, set up once for the router and the controller alike.

Each program decides what its spans say (router/request/tracing.py, controller/fleet/spans.py);
what they share is here: the settings, the SDK loaded only when tracing is on (so a
program without `tracing` configured never imports it), the refusal to start when it
is configured and the SDK is missing, and the export itself: spans are batched and
sent over OTLP/HTTP (protobuf) by the SDK's own thread, never on the event loop.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Final

from llmgw.runtime.logs import kv

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


class SpanExport:
    """A tracer provider exporting over OTLP/HTTP in batches; `tracer` makes the spans.

    TracingUnavailable when the SDK is not installed (`pip install 'llmgw[tracing]'`).
    """

    def __init__(self, settings: TracingSettings, *, scope: str) -> None:
        require_sdk()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        self._provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name}),
            sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
        )
        exporter = OTLPSpanExporter(endpoint=settings.endpoint, timeout=settings.export_timeout_s)
        self._provider.add_span_processor(
            BatchSpanProcessor(exporter, schedule_delay_millis=settings.export_interval_s * 1000)
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
