"""The controller's actions as OpenTelemetry spans (docs/tracing.md), when tracing is on.

Every action is already an event committed with the batch that carries it, seen
exactly once after the store took it (decisions.py); so the spans are made there
too, one per action event, and none can be exported for a change the store then
refused. A span starts when the action was decided (the event's time) and ends
when the store committed it. Its attributes come from the replica as committed:
the model, the nodes and GPUs it holds, its state after the action, and the
reason in the event's words plus the short class the metrics count by.

Progress the agents report (a replica starting, ready) is no action and makes no
span. Spans go to the SDK's batch processor: building one is a few dictionary
writes on the event loop; encoding and sending happen on the SDK's thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from llmgw.controller.fleet.decisions import drain_reason, failure_reason, placement_reason
from llmgw.controller.fleet.records import Event, FleetState, Replica
from llmgw.runtime.tracing import SpanExport, TracingSettings

# Event kind → the action its span is named after (`llmgw.<action>`).
ACTIONS: Final[dict[str, str]] = {
    "replica.placed": "placement",  # "restart" when it restarts a failed replica
    "replica.evicted": "eviction",  # made room for another model: drained or asleep
    "replica.moved": "eviction",  # swapped out for another model (placement/swaps.py)
    "replica.draining": "drain",
    "replica.drain_forced": "drain",
    "replica.stopped": "stop",
    "replica.failed": "failure",
    "replica.sleeping": "sleep",
    "replica.waking": "wake",
    "model.scaled": "scale",
    "model.unplaceable": "unplaceable",
}


def action_of(e: Event) -> str | None:
    """The action `e` records, or None for an event that is no action (progress, nodes)."""
    action = ACTIONS.get(e.kind)
    if action == "placement" and placement_reason(e.message) == "restart":
        return "restart"
    return action


def reason_class(e: Event) -> str | None:
    """The metrics' short reason for `e` (decisions.py), None where they have none."""
    if e.kind == "replica.placed":
        return placement_reason(e.message)
    if e.kind in ("replica.evicted", "replica.moved"):
        return "make_room"
    if e.kind == "replica.failed":
        return failure_reason(e.message)
    if e.kind in ("replica.draining", "replica.drain_forced"):
        return drain_reason(e.message)
    return None


def attributes(e: Event, r: Replica | None) -> dict[str, Any]:
    """A span's attributes: the event's, then the replica's as committed (when known)."""
    out: dict[str, Any] = {"llmgw.event": e.kind, "llmgw.reason": e.message}
    if e.model is not None:
        out["llmgw.model"] = e.model
    cls = reason_class(e)
    if cls is not None:
        out["llmgw.reason_class"] = cls
    if e.subject != "replica":
        return out
    out["llmgw.replica"] = e.subject_id
    if r is None:
        # Forgotten in the same batch (a stopped replica past its retention).
        return out
    nodes = list(dict.fromkeys(s.node for s in r.shards))
    if nodes:
        out["llmgw.node"] = ",".join(nodes)
        out["llmgw.gpus"] = [f"{s.node}:{','.join(map(str, s.gpus))}" for s in r.shards]
        out["llmgw.gpu_count"] = r.gpu_count
    out["llmgw.replica.state"] = r.state
    out["llmgw.restarts"] = r.restarts
    if r.replaces is not None:
        out["llmgw.replaces"] = r.replaces
    if r.sleep_level is not None:
        out["llmgw.sleep_level"] = r.sleep_level
    return out


class ActionSpans:
    """One span per committed action (see the module docstring).

    TracingUnavailable (runtime.tracing) when the SDK is not installed."""

    def __init__(self, settings: TracingSettings) -> None:
        self._export = SpanExport(settings, scope="llmgw.controller")
        # What export lost, for /metrics (api/metrics.py).
        self.losses = self._export.losses
        # Only reached with the SDK installed (SpanExport checked).
        from opentelemetry.trace import SpanKind

        self._internal = SpanKind.INTERNAL

    def committed(self, events: Iterable[Event], state: FleetState, *, now: float) -> None:
        """Spans for the actions among `events`, which the store committed at `now`
        (Unix seconds); `state` already holds the batch's changes."""
        end_ns = int(now * 1e9)
        for e in events:
            action = action_of(e)
            if action is None:
                continue
            r = state.replicas.get(e.subject_id) if e.subject == "replica" else None
            start_ns = min(int(e.at * 1e9), end_ns)
            attrs = attributes(e, r)
            attrs["llmgw.action"] = action
            span = self._export.tracer.start_span(
                f"llmgw.{action}", kind=self._internal, attributes=attrs, start_time=start_ns
            )
            span.end(end_time=end_ns)

    def shutdown(self) -> None:
        """Export what is still batched, then stop (blocks: call it off the event loop)."""
        self._export.shutdown()
