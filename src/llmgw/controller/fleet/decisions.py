"""Each committed decision, logged once and counted (docs/metrics.md, docs/controller.md).

Every decision the controller takes (placement, eviction, drain step, failure,
node and model changes) is an event in the batch that carries it; once the
store has committed the batch, `Decisions.committed()` sees each event exactly
once. It logs the event with its reason (the event's message) at INFO, and
counts placements, evictions, failures and drain steps by a short `reason`
label from a closed set: the message itself names replicas and nodes, which
would make a label without bound.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from prometheus_client import Counter, Histogram

from llmgw.controller.fleet.records import Event
from llmgw.runtime.logs import kv

log = logging.getLogger("llmgw.controller.decisions")
# Decisions are few and always worth having: logged whatever LLMGW_LOG_LEVEL says.
log.setLevel(logging.INFO)

# Store writes are sub-millisecond (SQLite) to tens of ms (PostgreSQL under load).
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def placement_reason(message: str) -> str:
    if message.startswith("restart "):
        return "restart"
    if message.startswith("replacing "):
        return "replacement"
    return "new"


def failure_reason(message: str) -> str:
    if "(deadline)" in message:
        return "deadline"
    if " unreachable for " in message:
        return "node_unreachable"
    if " exited" in message or "stopped unexpectedly" in message:
        return "engine_exited"
    return "other"


def drain_reason(message: str) -> str:
    if message.startswith("evicted for "):
        return "eviction"
    if message.startswith("replaced by "):
        return "replaced"
    if message.startswith("model ") and message.endswith(" deleted"):
        return "model_deleted"
    if "drain" in message:
        return "node_drain"
    if "surplus" in message or "scale" in message:
        return "scale_down"
    if "unhealthy" in message or "GPU" in message:
        return "gpu_unhealthy"
    return "other"


class Decisions:
    """Counters and histograms the controller moves as it acts (registered by api/metrics.py)."""

    def __init__(self) -> None:
        self.events = Counter(
            "llmgw_controller_events",
            "Events committed, by kind (replica.placed, node.unreachable, …).",
            ["kind"],
            registry=None,
        )
        self.placements = Counter(
            "llmgw_controller_placements",
            "Replicas placed: reason=new, restart (after a failure) or replacement (a move).",
            ["reason"],
            registry=None,
        )
        self.evictions = Counter(
            "llmgw_controller_evictions",
            "Ready replicas drained to make room for another model.",
            ["reason"],
            registry=None,
        )
        self.failures = Counter(
            "llmgw_controller_replica_failures",
            "Replicas failed: reason=engine_exited, deadline, node_unreachable or other.",
            ["reason"],
            registry=None,
        )
        self.drains = Counter(
            "llmgw_controller_drains",
            "Replicas sent to draining (or stopped before serving), by reason.",
            ["reason"],
            registry=None,
        )
        self.store_write = Histogram(
            "llmgw_controller_store_write_duration_seconds",
            "Seconds one store transaction took (successful or not).",
            buckets=WRITE_BUCKETS,
            registry=None,
        )
        self.tick = Histogram(
            "llmgw_controller_tick_duration_seconds",
            "Seconds one control-loop tick took (leadership check, plan, commit).",
            buckets=TICK_BUCKETS,
            registry=None,
        )

    def collectors(self) -> tuple[Counter | Histogram, ...]:
        return (
            self.events,
            self.placements,
            self.evictions,
            self.failures,
            self.drains,
            self.store_write,
            self.tick,
        )

    def committed(self, events: Iterable[Event]) -> None:
        for e in events:
            self.events.labels(e.kind).inc()
            reason = None
            if e.kind == "replica.placed":
                reason = placement_reason(e.message)
                self.placements.labels(reason).inc()
            elif e.kind == "replica.evicted":
                reason = "make_room"
                self.evictions.labels(reason).inc()
                self.drains.labels("eviction").inc()
            elif e.kind == "replica.failed":
                reason = failure_reason(e.message)
                self.failures.labels(reason).inc()
            elif e.kind in ("replica.draining", "replica.drain_forced"):
                reason = drain_reason(e.message)
                self.drains.labels(reason).inc()
            log.info(
                kv(
                    "decision",
                    kind=e.kind,
                    subject=e.subject,
                    id=e.subject_id,
                    model=e.model,
                    reason_class=reason,
                    reason=e.message,
                )
            )
