"""One consistent picture of the fleet for /metrics and the status page.

Built from the same views `ctl status` reads (api/views.py, api/summary.py),
in one pass at read time, so the page, the metrics and `ctl status --json`
cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.controller.api.services import Services
from llmgw.controller.api.summary import summarize_views
from llmgw.controller.api.views import model_view, node_view, replica_counts, replica_view
from llmgw.controller.idle import idle_fn
from llmgw.controller.placement.capacity import gpus_in_use
from llmgw.wire.admin import ModelView, NodeView, ReplicaView, Summary


@dataclass(frozen=True, slots=True)
class FleetView:
    now: float
    leading: bool
    summary: Summary
    nodes: list[NodeView]
    models: list[ModelView]
    replicas: list[ReplicaView]
    # Model → requests routers hold for it (scale from zero), over fresh reports.
    waiting: dict[str, int]


def fleet_view(s: Services) -> FleetView:
    now = s.clock.wall()
    state = s.fleet.state
    used = gpus_in_use(state)
    timeout = s.config.heartbeat_timeout_s
    nodes = [
        node_view(n, state, now=now, heartbeat_timeout_s=timeout, used=used, waits={})
        for n in state.nodes.values()
    ]
    idle = idle_fn(s.idle_for(now), now=now)
    replicas = [replica_view(r, idle) for r in state.replicas.values() if r.state != "stopped"]
    counts = replica_counts(state)
    reasons = s.unplaceable()
    models = [
        model_view(m, state, reasons.get(m.name), counts=counts) for m in state.models.values()
    ]
    # Demand is reported by the name asked for: fold aliases into their model.
    owner = {a: m.name for m in state.models.values() for a in m.spec.aliases}
    waiting: dict[str, int] = {}
    for name, n in s.usage.demand().items():
        model = owner.get(name, name)
        if model in state.models:
            waiting[model] = waiting.get(model, 0) + n
    return FleetView(
        now=now,
        leading=s.fleet.leading,
        summary=summarize_views(nodes, replicas, models),
        nodes=nodes,
        models=models,
        replicas=replicas,
        waiting=waiting,
    )
