"""Traces across the router: W3C trace context passed on, and optional spans of its decisions.

Off (no `tracing:` in the configuration, the default), the router only passes a
client's `traceparent` and `tracestate` on to the engine as they came, so an
engine that traces (vLLM with `--otlp-traces-endpoint`) joins the client's
trace; nothing else is done, and nothing is imported.

Either way the client's context is read as W3C Trace Context says (`context_of`): a
`traceparent` sent twice is none at all, and several `tracestate` lines are one list.

On, each routed request is a span, `llmgw.route`, exported with the
OpenTelemetry SDK over OTLP/HTTP (protobuf) to `tracing.endpoint`: a child of
the client's trace context when a valid one came, else the root of a new trace. The
engine gets the span's own context as its `traceparent` (so the engine's spans
hang under the router's) and the client's `tracestate` unchanged, only under the
client's trace: a new trace carries none. The span
carries the routing decision: the model, each attempt as an event (the
replica, the policy's reason, the prefix blocks it was predicted to hold, and
why the attempt before it failed), the seconds held waiting for a replica, and
the answer's endpoint, status and outcome. Spans are batched and exported off
the event loop by the SDK's own thread; `sample_ratio` keeps a fraction of the
traces the router starts (a client's sampled flag is followed).

The SDK is an optional dependency (the `tracing` extra): a configuration that
turns tracing on without it installed is refused at start.
"""

from __future__ import annotations

from typing import Any, Final

from multidict import MultiMapping

from llmgw.router.config import TracingConfig
from llmgw.router.routing.scheduler import Decision
from llmgw.runtime.tracing import SpanExport, TracingSettings

# What a span's engine request carries: the W3C header names.
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"


def context_of(headers: MultiMapping[str]) -> tuple[str | None, str | None]:
    """A client's `traceparent` and `tracestate`, None where absent, as W3C Trace Context
    reads them: a traceparent sent more than once is none (which one the client meant is
    unknown; the first passed on as if it were the one made a trace of a guess), and
    tracestate lines are one list, joined with commas (the first alone lost the rest)."""
    parents = headers.getall(TRACEPARENT, ())
    if len(parents) != 1:
        return None, None
    states = headers.getall(TRACESTATE, ())
    return parents[0], ",".join(states) if states else None


def as_came(headers: MultiMapping[str]) -> bytes:
    """Tracing off: the client's trace context as the engine's header lines, b"" when none."""
    # The membership test first keeps a request without a traceparent as cheap as
    # before tracing existed: no list is made.
    if TRACEPARENT not in headers:
        return b""
    tp, ts = context_of(headers)
    return b"" if tp is None else passed_on(tp, ts)


def passed_on(traceparent: str, tracestate: str | None) -> bytes:
    """A client's trace context as the engine's header lines; b"" when a value holds a
    line break (it would smuggle a header)."""
    if "\n" in traceparent or "\r" in traceparent:
        return b""
    out = f"traceparent: {traceparent}\r\n"
    if tracestate and "\n" not in tracestate and "\r" not in tracestate:
        out += f"tracestate: {tracestate}\r\n"
    return out.encode("utf-8", "surrogateescape")


class Tracing:
    """The router's tracer: one span per routed request (see the module docstring).

    TracingUnavailable (runtime.tracing) when the SDK is not installed."""

    def __init__(self, cfg: TracingConfig) -> None:
        self._export = SpanExport(
            TracingSettings(
                endpoint=cfg.endpoint,
                service_name=cfg.service_name or "llmgw-router",
                sample_ratio=cfg.sample_ratio,
                export_interval_s=cfg.export_interval_s,
                export_timeout_s=cfg.export_timeout_s,
                max_queued_spans=cfg.max_queued_spans,
            ),
            scope="llmgw.router",
        )
        # What export lost, for /metrics (metrics.py).
        self.losses = self._export.losses
        # Only reached with the SDK installed (SpanExport checked).
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer = self._export.tracer
        self._propagator = TraceContextTextMapPropagator()
        self._server = SpanKind.SERVER

    def start(
        self, headers: MultiMapping[str], path: str, model: str, rid: str
    ) -> tuple[Any, bytes]:
        """A request's span, and the trace header lines its engine request carries."""
        carrier: dict[str, str] = {}
        tp, ts = context_of(headers)
        if tp is not None:
            carrier[TRACEPARENT] = tp
            if ts is not None:
                carrier[TRACESTATE] = ts
        parent = self._propagator.extract(carrier) if carrier else None
        span = self._tracer.start_span(
            "llmgw.route",
            context=parent,
            kind=self._server,
            attributes={"http.route": path, "llmgw.model": model, "llmgw.request_id": rid},
        )
        from opentelemetry.trace import get_current_span, set_span_in_context

        out: dict[str, str] = {}
        self._propagator.inject(out, context=set_span_in_context(span, parent))
        lines = b""
        if TRACEPARENT in out:
            # A traceparent the propagator refused (version ff, an all-zero id, …) left
            # the span a new trace's root: the client's tracestate belongs to the trace
            # it did not join, and W3C forbids reading it then.
            joined = parent is not None and get_current_span(parent).get_span_context().is_valid
            lines = passed_on(out[TRACEPARENT], ts if joined else None)
        return span, lines

    def attempt(self, span: Any, decision: Decision, number: int, last_error: str) -> None:
        """One attempt at a replica: where, why there, and why the one before failed."""
        eid = decision.endpoint_id or ""
        attrs: dict[str, str | int] = {
            "llmgw.attempt": number,
            "llmgw.endpoint": eid,
            "llmgw.reason": decision.reason,
        }
        for score in decision.scores:
            if score.id == eid:
                attrs["llmgw.prefix_blocks_predicted"] = score.prefix_blocks
        if last_error:
            attrs["llmgw.previous_failure"] = last_error
        span.add_event("attempt", attrs)

    def held(self, span: Any, seconds: float) -> None:
        span.set_attribute("llmgw.held_s", round(seconds, 6))

    def end(self, span: Any, *, endpoint: str, status: int, outcome: str, retries: int) -> None:
        span.set_attribute("llmgw.endpoint", endpoint)
        span.set_attribute("http.response.status_code", status)
        span.set_attribute("llmgw.outcome", outcome)
        span.set_attribute("llmgw.retries", retries)
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()

    def shutdown(self) -> None:
        """Export what is still batched, then stop (blocks: call it off the event loop)."""
        self._export.shutdown()
