"""The fleet summary: how full, what is broken, what holds cards nobody uses.

A per-node listing is right for four nodes and wrong for two hundred: how full
am I, what is broken, what is holding cards nobody is using are aggregates. They
are derived here from the same views the tables show (api/views.py), so
the summary cannot disagree with them, and nothing here is ever stored.

Rules worth knowing:
- stopped replicas are not counted at all: they are gone, and counting them as
  "starting" would report work that is not happening;
- `unplaceable_reasons` carries, in the same order as `unplaceable`, the reason
  placement gave for each;
- ties in the idle list are broken by replica id, so the output is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter

from llmgw.controller.api.views import (
    model_view,
    node_view,
    replica_counts,
    replica_view,
)
from llmgw.controller.fleet.records import FleetState
from llmgw.controller.idle import IdleFor, IdleSource, idle_fn
from llmgw.controller.placement.capacity import gpus_in_use
from llmgw.wire.admin import (
    ClassUse,
    FabricUse,
    IdleReplica,
    ModelView,
    NodeView,
    ReplicaView,
    Summary,
    UnplaceableModel,
)

# How long a replica must go unasked-for to be named. Minutes rather than
# seconds: a replica that flaps in and out of the list is noise, and unloading
# one throws away the KV cache prefix routing spent its effort filling.
IDLE_THRESHOLD_S = 600


def summarize(
    state: FleetState,
    *,
    now: float,
    heartbeat_timeout_s: float,
    idle_for: IdleFor | IdleSource,
    unplaceable: Mapping[str, str] | None = None,
) -> Summary:
    """The whole fleet in one answer. `unplaceable`: model → placement's reason.

    `idle_for`: replica id → idle seconds (None when unknown), or an IdleTracker.
    """
    idle = idle_fn(idle_for, now=now)
    reasons = unplaceable or {}
    used = gpus_in_use(state)
    counts = replica_counts(state)
    # waits={}: the summary counts nodes by state; explaining drains is the node view's.
    nodes = [
        node_view(n, state, now=now, heartbeat_timeout_s=heartbeat_timeout_s, used=used, waits={})
        for n in state.nodes.values()
    ]
    replicas = [replica_view(r, idle) for r in state.replicas.values() if r.state != "stopped"]
    models = [
        model_view(m, state, reasons.get(m.name), counts=counts) for m in state.models.values()
    ]
    return summarize_views(nodes, replicas, models)


def summarize_views(
    nodes: Iterable[NodeView], replicas: Iterable[ReplicaView], models: Iterable[ModelView]
) -> Summary:
    """The summary over the tables' rows."""
    s = Summary()
    node_list = list(nodes)
    by_class: dict[str, ClassUse] = {}
    s.nodes.total = len(node_list)
    for n in node_list:
        if n.state == "ready":
            s.nodes.ready += 1
        elif n.state == "cordoned":
            s.nodes.cordoned += 1
        elif n.state == "draining":
            s.nodes.draining += 1
        else:
            # Anything else is a node we cannot act on as if it were there.
            s.nodes.unreachable += 1
        held = set(n.gpus_used)
        # Card by card, so a node with two classes counts each under its own.
        for g in n.gpus:
            u = by_class.get(g.gpu_class)
            if u is None:
                u = by_class[g.gpu_class] = ClassUse(gpu_class=g.gpu_class)
            u.total += 1
            # Unhealthy cards are neither used nor free.
            if not g.healthy:
                u.unhealthy += 1
            elif g.index in held:
                u.used += 1
    s.gpus = sorted(by_class.values(), key=attrgetter("gpu_class"))

    by_fabric: dict[str, FabricUse] = {}
    for n in node_list:
        for f in n.fabrics:
            use = by_fabric.get(f)
            if use is None:
                use = by_fabric[f] = FabricUse(fabric=f)
            use.nodes += 1
            # Entirely free, which is what a multi-node replica needs: a node
            # with one card in use cannot contribute a full-width shard.
            if n.state == "ready" and n.gpu_free == n.gpu_total and n.gpu_total > 0:
                use.largest_free_block += 1
    s.fabrics = sorted(by_fabric.values(), key=attrgetter("fabric"))

    idle: list[IdleReplica] = []
    for r in replicas:
        if r.state == "stopped":
            continue  # gone: neither starting nor anything else
        if r.state == "ready":
            s.replicas.ready += 1
        elif r.state == "draining":
            s.replicas.draining += 1
        elif r.state == "failed":
            s.replicas.failed += 1
        elif r.state == "sleeping":
            s.replicas.sleeping += 1
        elif r.state == "waking":
            s.replicas.waking += 1
        else:
            s.replicas.starting += 1
        # Unknown idleness is -1 in a view, so it is never at or above the threshold.
        if r.state == "ready" and r.idle_seconds >= IDLE_THRESHOLD_S:
            gpus = sum(len(sh.gpus) for sh in r.shards)
            idle.append(IdleReplica(id=r.id, model=r.model, idle_seconds=r.idle_seconds, gpus=gpus))
    idle.sort(key=attrgetter("id"))
    idle.sort(key=attrgetter("idle_seconds"), reverse=True)
    s.idle_replicas = idle

    short: list[ModelView] = []
    for m in models:
        s.models.total += 1
        if m.ready >= m.min:
            s.models.satisfied += 1
            continue
        s.models.short += 1
        # Short of replicas and unable to place more is the actionable case;
        # short and still starting is just a cluster doing its job.
        if m.total <= m.ready:
            short.append(m)
    short.sort(key=attrgetter("name"))
    s.unplaceable = [m.name for m in short]
    s.unplaceable_reasons = [
        UnplaceableModel(model=m.name, reason=m.unplaceable_reason or _fallback_reason(m))
        for m in short
    ]
    return s


def _fallback_reason(m: ModelView) -> str:
    """When placement has not said why (e.g. before the first tick): the shortfall itself."""
    return f"{m.ready} of {m.min} replicas ready and none starting"
