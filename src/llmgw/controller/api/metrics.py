"""The controller's Prometheus metrics (`GET /metrics`; reference: docs/metrics.md).

Counters and histograms move as the controller acts (fleet/decisions.py);
everything about the fleet itself is computed from memory when /metrics is
scraped (api/fleetview.py, the figures `ctl status` shows), so it is never out
of date and costs nothing between scrapes. Labels are bounded by the fleet:
GPU class, fabric, node, model and fixed state names; series appear only for
what exists (a deleted model or node takes its series with it).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.controller.api.fleetview import fleet_view
from llmgw.controller.api.services import Services
from llmgw.runtime.procmetrics import register_process_metrics
from llmgw.runtime.tracing import SpanLosses, SpansDropped

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NODE_STATES = ("ready", "cordoned", "draining", "unreachable")
REPLICA_STATES = ("pending", "starting", "ready", "draining", "failed", "sleeping", "waking")


class _Fleet(Collector):
    def __init__(self, services: Services) -> None:
        self._s = services

    def collect(self) -> Iterator[Metric]:
        v = fleet_view(self._s)
        leader = GaugeMetricFamily(
            "llmgw_controller_leader", "1 while this controller leads (acts), 0 as a standby."
        )
        leader.add_metric([], 1.0 if v.leading else 0.0)
        yield leader
        unreadable = GaugeMetricFamily(
            "llmgw_controller_store_unreadable",
            "1 for the stored row this controller's last read of the store stopped at "
            "(written by a newer llmgw or by hand); absent once a read gets past it.",
            labels=["table", "row"],
        )
        stuck = self._s.fleet.unreadable
        if stuck is not None:
            unreadable.add_metric([stuck.table, stuck.row], 1.0)
        yield unreadable

        cards = ["gpu_class", "fabric"]
        total = GaugeMetricFamily(
            "llmgw_controller_gpus", "GPUs on registered nodes, by class and fabric.", labels=cards
        )
        used = GaugeMetricFamily(
            "llmgw_controller_gpus_used",
            "GPUs held by replicas (or by an engine still exiting).",
            labels=cards,
        )
        free = GaugeMetricFamily(
            "llmgw_controller_gpus_free", "GPUs healthy and held by nobody.", labels=cards
        )
        bad = GaugeMetricFamily(
            "llmgw_controller_gpus_unhealthy",
            "GPUs their agent reports unhealthy (neither used nor free).",
            labels=cards,
        )
        per: dict[tuple[str, str], list[int]] = {}
        by_state: Tally[str] = Tally()
        age = GaugeMetricFamily(
            "llmgw_controller_node_heartbeat_age_seconds",
            "Seconds since the node's last heartbeat; absent for a node that never sent one.",
            labels=["node"],
        )
        for n in v.nodes:
            by_state[n.state if n.state in NODE_STATES else "unreachable"] += 1
            if n.last_heartbeat is not None:
                age.add_metric([n.name], max(0.0, v.now - n.last_heartbeat))
            fabric = "+".join(n.fabrics)
            for cls in n.classes:
                row = per.setdefault((cls, fabric), [0, 0, 0, 0])
                gpus = [g for g in n.gpus if g.gpu_class == cls]
                held = set(n.gpus_used)
                row[0] += len(gpus)
                row[1] += sum(1 for g in gpus if g.healthy and g.index in held)
                row[2] += sum(1 for g in gpus if g.healthy and g.index not in held)
                row[3] += sum(1 for g in gpus if not g.healthy)
        for (cls, fabric), (t, u, f, b) in sorted(per.items()):
            total.add_metric([cls, fabric], float(t))
            used.add_metric([cls, fabric], float(u))
            free.add_metric([cls, fabric], float(f))
            bad.add_metric([cls, fabric], float(b))
        yield from (total, used, free, bad)

        nodes = GaugeMetricFamily(
            "llmgw_controller_nodes",
            "Nodes by state (as ctl status counts them).",
            labels=["state"],
        )
        for st in NODE_STATES:
            nodes.add_metric([st], float(by_state[st]))
        yield nodes
        yield age

        whole = GaugeMetricFamily(
            "llmgw_controller_fabric_free_nodes",
            "Ready nodes with every card free, per fabric (what a multi-node replica needs).",
            labels=["fabric"],
        )
        fabric_nodes = GaugeMetricFamily(
            "llmgw_controller_fabric_nodes", "Nodes on the fabric.", labels=["fabric"]
        )
        for fu in v.summary.fabrics:
            whole.add_metric([fu.fabric], float(fu.largest_free_block))
            fabric_nodes.add_metric([fu.fabric], float(fu.nodes))
        yield from (whole, fabric_nodes)

        replicas = GaugeMetricFamily(
            "llmgw_controller_replicas",
            "Replicas by model and state (stopped ones are gone; a series per pair that exists).",
            labels=["model", "state"],
        )
        pairs: Tally[tuple[str, str]] = Tally((r.model, r.state) for r in v.replicas)
        for (model, st), count in sorted(pairs.items()):
            replicas.add_metric([model, st], float(count))
        yield replicas

        models = GaugeMetricFamily(
            "llmgw_controller_models",
            "Models: total, satisfied (ready ≥ desired), short, unplaceable, waiting "
            "(requests held for them).",
            labels=["status"],
        )
        mt = v.summary.models
        models.add_metric(["total"], float(mt.total))
        models.add_metric(["satisfied"], float(mt.satisfied))
        models.add_metric(["short"], float(mt.short))
        models.add_metric(["unplaceable"], float(len(v.summary.unplaceable)))
        models.add_metric(["waiting"], float(sum(1 for w in v.waiting.values() if w > 0)))
        yield models

        desired = GaugeMetricFamily(
            "llmgw_controller_model_desired_replicas",
            "The replica count the controller aims at now (min, demand, autoscaling).",
            labels=["model"],
        )
        ready = GaugeMetricFamily(
            "llmgw_controller_model_ready_replicas", "Ready replicas per model.", labels=["model"]
        )
        short = GaugeMetricFamily(
            "llmgw_controller_model_short",
            "1 for a model with fewer ready replicas than desired (only such models).",
            labels=["model"],
        )
        unplaceable = GaugeMetricFamily(
            "llmgw_controller_model_unplaceable",
            "1 for a model placement cannot place now (only such models; the reason is on "
            "ctl status, the status page and the model.unplaceable event).",
            labels=["model"],
        )
        for m in v.models:
            desired.add_metric([m.name], float(m.desired))
            ready.add_metric([m.name], float(m.ready))
            if m.ready < m.desired:
                short.add_metric([m.name], 1.0)
            if m.unplaceable_reason is not None:
                unplaceable.add_metric([m.name], 1.0)
        waiting = GaugeMetricFamily(
            "llmgw_controller_model_waiting_requests",
            "Requests routers hold for the model (scale from zero), over fresh reports; "
            "only models with some.",
            labels=["model"],
        )
        for model, count in sorted(v.waiting.items()):
            if count > 0:
                waiting.add_metric([model], float(count))
        yield from (desired, ready, short, unplaceable, waiting)


class ControllerMetrics:
    def __init__(self, services: Services) -> None:
        self.registry = CollectorRegistry()
        for c in services.fleet.decisions.collectors():
            self.registry.register(c)
        for c in services.link.collectors():
            self.registry.register(c)
        register_process_metrics(self.registry)
        self.registry.register(_Fleet(services))

        def losses() -> SpanLosses | None:
            spans = services.fleet.spans
            return None if spans is None else spans.losses

        self.registry.register(SpansDropped("controller", losses))

    def render(self) -> bytes:
        return generate_latest(self.registry)
