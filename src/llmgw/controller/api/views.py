"""What the admin tables show, built from the fleet state by pure functions.

The summary (summary.py) is computed from these very views, never from anything of
its own, so a table and the summary can never disagree: they are two questions
asked of the same facts. Bulk builders compute the per-fleet indexes (GPUs in
use, replica counts per model) once instead of once per row.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from operator import attrgetter

from llmgw.controller.fleet.records import FleetState, Model, Node, Replica, Reservation
from llmgw.controller.idle import IdleFor
from llmgw.controller.placement.capacity import gpus_in_use
from llmgw.controller.placement.requests import making_room_text
from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.admin import (
    DrainWait,
    ModelView,
    NodeView,
    ReplicaView,
    ShardView,
    idle_seconds_json,
)


def drain_waits(
    state: FleetState,
    unplaceable: Mapping[str, str],
    *,
    only: str | None = None,
) -> dict[str, tuple[DrainWait, ...]]:
    """Draining node → every replica still holding its cards, by id, with what it waits for.

    One walk over the replicas for all draining nodes (`only`: just that one).
    `unplaceable` is model → why it cannot be placed now (the reconcile memory's):
    a serving replica whose replacement cannot be placed is what stalls a drain.
    """
    draining = {
        name: n
        for name, n in state.nodes.items()
        if n.operator_state == "draining" and (only is None or name == only)
    }
    if not draining:
        return {}
    replacements: dict[str, Replica] = {}
    here: dict[str, list[Replica]] = {name: [] for name in draining}
    for r in state.replicas.values():
        if r.replaces is not None and r.state in ("pending", "starting", "ready"):
            replacements[r.replaces] = r
        if r.holds_gpus:
            for name in dict.fromkeys(s.node for s in r.shards):
                if name in here:
                    here[name].append(r)
    return {
        name: tuple(
            _wait(
                r,
                replacements.get(r.id),
                unplaceable,
                draining[name],
                state.reservations.get(r.model),
            )
            for r in sorted(here[name], key=attrgetter("id"))
        )
        for name in sorted(draining)
    }


def _wait(
    r: Replica,
    new: Replica | None,
    unplaceable: Mapping[str, str],
    node: Node,
    room: Reservation | None,
) -> DrainWait:
    """What the drain waits for on `r`; `room`: the room being made for its model by
    eviction (a drain with evict_idle makes it for the replacement)."""
    blocked = False
    if r.state == "draining":
        why = f"draining ({r.reason}): stops when its in-flight requests finish or its grace ends"
    elif r.state in ("stopped", "failed"):
        why = f"{r.state}; its agent still reports its engine running (exiting)"
    elif r.state != "ready":
        why = f"{r.state}, not serving yet: stopped and placed elsewhere on the next tick"
    elif new is not None:
        why = f"serving until its replacement {new.id} is ready ({new.state})"
    elif r.model in unplaceable and room is not None and node.drain_evict_idle:
        why = making_room_text(room.victims)
    elif r.model in unplaceable:
        reason = unplaceable[r.model]
        if node.drain_force:
            why = f"no replacement fits ({reason}); the drain is forced: it drains anyway"
        else:
            blocked = True
            hint = (
                "nothing idle can be evicted for it"
                if node.drain_evict_idle
                else "drain with force to move it anyway"
            )
            why = f"no replacement fits: {reason}; it keeps serving until one does ({hint})"
    else:
        why = "serving until a replacement is placed (next tick)"
    return DrainWait(replica=r.id, model=r.model, reason=why, blocked=blocked)


def node_view(
    node: Node,
    state: FleetState,
    *,
    now: float,
    heartbeat_timeout_s: float,
    used: Mapping[str, Collection[int]] | None = None,
    unplaceable: Mapping[str, str] | None = None,
    waits: Mapping[str, tuple[DrainWait, ...]] | None = None,
) -> NodeView:
    """One node as the tables show it. `used` (from `gpus_in_use`) and `waits` (from
    `drain_waits`) save a walk per node; `unplaceable` (model → reason) explains
    what a draining node waits for when `waits` is not given."""
    held = (used if used is not None else gpus_in_use(state)).get(node.name, ())
    held_set = set(held)
    unhealthy = tuple(sorted(g.index for g in node.gpus if not g.healthy))
    # Free is healthy and held by nobody: an unhealthy card is neither used nor free.
    free = sum(1 for g in node.gpus if g.healthy and g.index not in held_set)
    draining = node.operator_state == "draining"
    return NodeView(
        name=node.name,
        address=node.address,
        state=node.shown_state(now=now, heartbeat_timeout_s=heartbeat_timeout_s),
        fabrics=node.fabrics,
        labels=dict(node.labels),
        gpus=node.gpus,
        gpus_used=tuple(sorted(held_set)),
        last_heartbeat=node.last_heartbeat_at,
        classes=tuple(sorted({g.gpu_class for g in node.gpus})),
        gpu_total=len(node.gpus),
        gpu_free=free,
        unhealthy=unhealthy,
        drain_grace_s=node.drain_grace_s if draining else None,
        drain_force=node.drain_force if draining else False,
        drain_evict_idle=node.drain_evict_idle if draining else False,
        drain_waiting=(
            (
                waits
                if waits is not None
                else drain_waits(state, unplaceable or {}, only=node.name)
            ).get(node.name, ())
            if draining
            else ()
        ),
    )


def node_views(
    state: FleetState,
    *,
    now: float,
    heartbeat_timeout_s: float,
    unplaceable: Mapping[str, str] | None = None,
) -> list[NodeView]:
    """Every node, sorted by name."""
    used = gpus_in_use(state)
    waits = drain_waits(state, unplaceable or {})
    return [
        node_view(
            state.nodes[name],
            state,
            now=now,
            heartbeat_timeout_s=heartbeat_timeout_s,
            used=used,
            waits=waits,
        )
        for name in sorted(state.nodes)
    ]


def replica_view(replica: Replica, idle_for: IdleFor) -> ReplicaView:
    """One replica; unknown idleness becomes -1 here and only here (via idle_seconds_json)."""
    return ReplicaView(
        id=replica.id,
        model=replica.model,
        state=replica.state,
        reason=replica.reason,
        shards=tuple(
            ShardView(
                node=s.node,
                rank=s.rank,
                gpus=s.gpus,
                port=s.port,
                state=s.state,
                pid=s.pid,
                exit_code=s.exit_code,
                kv_events_port=s.kv_events_port,
                kv_events_replay_port=s.kv_events_replay_port,
                note=s.note,
            )
            for s in replica.shards
        ),
        endpoint_url=replica.endpoint_url,
        created_at=replica.created_at,
        updated_at=replica.updated_at,
        restarts=replica.restarts,
        idle_seconds=idle_seconds_json(idle_for(replica.id)),
        pool=replica.pool,
        weight=replica.weight,
        capacity_tok_s=replica.capacity_tok_s,
        sleep_level=replica.sleep_level,
    )


def replica_views(state: FleetState, idle_for: IdleFor) -> list[ReplicaView]:
    """Every replica the state holds, sorted by id."""
    return [replica_view(state.replicas[rid], idle_for) for rid in sorted(state.replicas)]


def replica_counts(state: FleetState) -> dict[str, tuple[int, int]]:
    """Model → (ready replicas, replicas not stopped), in one walk over the replicas."""
    counts: dict[str, tuple[int, int]] = {}
    for r in state.replicas.values():
        if r.state == "stopped":
            continue
        ready, total = counts.get(r.model, (0, 0))
        counts[r.model] = (ready + (r.state == "ready"), total + 1)
    return counts


def model_view(
    model: Model,
    state: FleetState,
    unplaceable_reason: str | None,
    *,
    counts: Mapping[str, tuple[int, int]] | None = None,
    adapters: Mapping[str, tuple[AdapterSpec, ...]] | None = None,
) -> ModelView:
    """One model with its replica counts and LoRA adapters. `counts` (from
    `replica_counts`) and `adapters` (from `adapters_by_base`) save a walk per model.

    total counts every replica not stopped (pending, starting, ready, draining,
    failed awaiting restart), as wire.admin.ModelView documents.
    """
    ready, total = (counts if counts is not None else replica_counts(state)).get(model.name, (0, 0))
    served = (adapters if adapters is not None else adapters_by_base(state)).get(model.name, ())
    return ModelView(
        spec=model.spec,
        name=model.name,
        ready=ready,
        total=total,
        min=model.spec.min_replicas,
        max=model.spec.max_replicas,
        desired=model.desired_replicas,
        unplaceable_reason=unplaceable_reason,
        adapters=served,
    )


def adapters_by_base(state: FleetState) -> dict[str, tuple[AdapterSpec, ...]]:
    """Base model → its adapters' specs, sorted by name."""
    out: dict[str, list[AdapterSpec]] = {}
    for name in sorted(state.adapters):
        a = state.adapters[name]
        out.setdefault(a.base, []).append(a.spec)
    return {base: tuple(specs) for base, specs in out.items()}


def model_views(
    state: FleetState, unplaceable: Mapping[str, str], *, names: Sequence[str] | None = None
) -> list[ModelView]:
    """Every model (or those `names` lists), sorted by name, with its reason when it
    cannot be placed."""
    counts = replica_counts(state)
    by_base = adapters_by_base(state)
    models = state.models.values() if names is None else [state.models[n] for n in names]
    out = [
        model_view(m, state, unplaceable.get(m.name), counts=counts, adapters=by_base)
        for m in models
    ]
    return sorted(out, key=attrgetter("name"))
