"""Operator commands, decided purely: (state, input, now) → Batch, or a ControllerRefusal.

Validation happens here, before anything is written: a command either yields
one Batch that the store applies in one transaction, or raises and changes
nothing. A command that would change nothing yields an empty Batch (applying
the same spec twice is not an event).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import msgspec

from llmgw.controller.errors import Conflict, DoesNotExist, InvalidRequest, InvalidSpec
from llmgw.controller.fleet.adapters import check_adapters, delete_adapter, put_adapters
from llmgw.controller.fleet.batch import LIVE, RUNS, Batch
from llmgw.controller.fleet.index import FleetIndex
from llmgw.controller.fleet.namecase import check_case
from llmgw.controller.fleet.records import FleetState, Model, Node, OperatorState, Replica
from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.agent import env_sources
from llmgw.wire.models import ModelSpec, ScaleRequest
from llmgw.wire.policy import SpecPolicy

# Spec fields an operator may change on a running model without restarting its
# engines; any other change rolls the replicas over (make-before-break).
LIVE_FIELDS = frozenset(
    {
        "min_replicas",
        "max_replicas",
        "idle_timeout_s",
        "priority",
        "sleep_after_s",
        "sleep_level",
        "weights_gb",
    }
)


def require_node(state: FleetState, name: str) -> Node:
    node = state.nodes.get(name)
    if node is None:
        raise DoesNotExist(f"no node named {name!r}", param="name")
    return node


def require_model(state: FleetState, name: str) -> Model:
    model = state.models.get(name)
    if model is None:
        raise DoesNotExist(f"no model named {name!r}{_served_otherwise(state, name)}", param="name")
    return model


def _served_otherwise(state: FleetState, name: str) -> str:
    """What `name` is when clients use it but it names no model, said in a refusal:
    "no model named 'x'" alone reads as if the name were unknown to the fleet."""
    adapter = state.adapters.get(name)
    if adapter is not None:
        return f" ({name!r} is a LoRA adapter of {adapter.base!r}, with no replicas of its own)"
    for model in state.models.values():
        if name in model.spec.aliases:
            return f" ({name!r} is an alias of {model.name!r}: name the model)"
    return ""


def require_replica(state: FleetState, rid: str) -> Replica:
    r = state.replicas.get(rid)
    if r is None:
        raise DoesNotExist(f"no replica with id {rid!r}", param="id")
    return r


def set_operator_state(
    state: FleetState,
    name: str,
    to: OperatorState,
    *,
    now: float,
    grace_s: float | None = None,
    force: bool = False,
    evict_idle: bool = False,
) -> Batch:
    """cordon / uncordon / drain: the operator's intent for a node.

    A drain's grace, force and evict_idle are stored with the node (a restarted controller
    drains as it was told); draining again with other options changes them.
    """
    node = require_node(state, name)
    draining = to == "draining"
    new = dataclasses.replace(
        node,
        operator_state=to,
        drain_grace_s=grace_s if draining else None,
        drain_force=force if draining else False,
        drain_evict_idle=evict_idle if draining else False,
    )
    batch = Batch(state, now)
    if new == node:
        return batch
    batch.put_node(new)
    kind = {"active": "node.uncordoned", "cordoned": "node.cordoned"}.get(to, "node.draining")
    if draining:
        how = _drain_options(new)
        if node.operator_state == "draining":
            msg = f"drain options changed: {how} (was {_drain_options(node)})"
        else:
            msg = (
                "draining: replicas move elsewhere (make-before-break), then it is empty; "
                f"{how} (was {node.operator_state})"
            )
    else:
        msg = {
            "active": "uncordoned: placeable again",
            "cordoned": "cordoned: nothing new is placed here",
        }[to]
        msg += f" (was {node.operator_state})"
    batch.event(kind, "node", name, msg, model=None)
    return batch


def _drain_options(node: Node) -> str:
    grace = "default grace" if node.drain_grace_s is None else f"grace {node.drain_grace_s:g}s"
    evict = (
        ", known-idle replicas of other models may be evicted for replacements that do not fit"
        if node.drain_evict_idle
        else ""
    )
    if node.drain_force:
        return f"{grace}{evict}, forced: replicas with no placeable replacement drain anyway"
    return f"{grace}{evict}; replicas with no placeable replacement keep serving until one fits"


def policy_refusal(
    state: FleetState, policies: Mapping[str, SpecPolicy], spec: ModelSpec
) -> tuple[str, str] | None:
    """(field, why) when every node that could run `spec` refuses it by its agent's policy.

    The nodes judged are those with a GPU of one of the spec's classes. A spec that one
    of them allows passes, and so does one that a node without a reported policy (an
    older agent) could run, or one no node could run yet: only a certain refusal is
    refused, the agent checks every shard again anyway.
    """
    refusals: list[tuple[str, str, str]] = []
    for name in sorted(state.nodes):
        node = state.nodes[name]
        if not any(g.gpu_class in spec.gpu_classes for g in node.gpus):
            continue
        policy = policies.get(name)
        if policy is None:
            return None
        refused = policy.refusal(
            env=spec.env,
            env_from=spec.env_from,
            args=spec.args,
            env_sources=env_sources(spec.env_from),
        )
        if refused is None:
            return None
        refusals.append((name, *refused))
    if not refusals:
        return None
    shown = "; ".join(f"{node}: {why}" for node, _, why in refusals[:3])
    more = f"; and {len(refusals) - 3} more" if len(refusals) > 3 else ""
    return refusals[0][1], (
        f"no node that could run it allows it ({shown}{more}); change the spec, or allow "
        "it in those agents' allow_env / allow_flags / secret_env"
    )


def apply_models(
    state: FleetState,
    entries: Sequence[ModelSpec | AdapterSpec],
    *,
    now: float,
    policies: Mapping[str, SpecPolicy] | None = None,
) -> Batch:
    """Create or update every spec, or none of them (a name clash anywhere, or a spec
    no node's policy allows, refuses all). `policies`: each node's reported spec policy.
    Adapters (docs/sleep-and-adapters.md) may come with their base or after it."""
    specs = [e for e in entries if isinstance(e, ModelSpec)]
    adapters = [(i, e) for i, e in enumerate(entries) if isinstance(e, AdapterSpec)]
    seen: dict[str, str] = {}
    for i, spec in enumerate(entries):
        if not isinstance(spec, ModelSpec):
            continue
        old = state.models.get(spec.name)
        # The same spec again changes nothing, whatever the agents now say.
        refused = (
            None
            if old is not None and old.spec == spec
            else (policy_refusal(state, policies or {}, spec))
        )
        if refused is not None:
            field, why = refused
            raise InvalidSpec(
                f"models[{i}] ({spec.name!r}): {field}: {why}; nothing was applied",
                param=f"[{i}].{field}",
            )
        for n in spec.served_names:
            if n in seen:
                raise InvalidSpec(
                    f"models[{i}] ({spec.name!r}): name {n!r} is also used by {seen[n]!r} "
                    "in the same request",
                    param=f"[{i}].name",
                )
            seen[n] = spec.name
    applied = {s.name for s in specs}
    for m in state.models.values():
        if m.name in applied:
            continue
        for n in m.spec.served_names:
            if n in seen:
                raise Conflict(
                    f"name {n!r} of model {seen[n]!r} is already served by model {m.name!r}",
                    param="aliases" if n != seen[n] else "name",
                )
    check_adapters(state, adapters, {s.name: s for s in specs}, seen)
    check_case(state, entries)
    batch = Batch(state, now)
    for spec in specs:
        if spec.name in state.retired:
            # A deleted model applied again: its spec is current, no longer retired.
            batch.changes.deleted_retired.append(spec.name)
        old = state.models.get(spec.name)
        if old is None:
            batch.put_model(
                Model(spec=spec, created_at=now, updated_at=now, desired_replicas=spec.min_replicas)
            )
            msg = f"applied: {spec.engine}, {spec.gpus_per_node}×{'/'.join(spec.gpu_classes)}"
            msg += f" × {spec.nodes} node(s), replicas {spec.min_replicas}..{spec.max_replicas}"
            batch.event("model.applied", "model", spec.name, msg, model=spec.name)
            continue
        if old.spec == spec:
            continue
        changed = sorted(
            f.name
            for f in msgspec.structs.fields(ModelSpec)
            if getattr(old.spec, f.name) != getattr(spec, f.name)
        )
        restart = any(f not in LIVE_FIELDS for f in changed)
        desired = min(max(old.desired_replicas, spec.min_replicas), spec.max_replicas)
        batch.put_model(
            dataclasses.replace(
                old,
                spec=spec,
                # updated_at marks a change the engines must be restarted for:
                # replicas created before it are rolled over.
                updated_at=now if restart else old.updated_at,
                desired_replicas=desired,
            )
        )
        how = "; replicas roll over" if restart else ""
        msg = f"updated {', '.join(changed)}{how}"
        batch.event("model.updated", "model", spec.name, msg, model=spec.name)
    put_adapters(batch, [a for _, a in adapters])
    return batch


def delete_model(
    state: FleetState, index: FleetIndex, name: str, *, now: float, grace_s: float
) -> Batch:
    batch = Batch(state, now)
    adapter = state.adapters.get(name)
    if adapter is not None:
        delete_adapter(batch, adapter)
        return batch
    model = require_model(state, name)
    served = state.adapters_of(name)
    if served:
        shown = ", ".join(a.name for a in served[:5]) + (" …" if len(served) > 5 else "")
        raise Conflict(
            f"model {name!r} serves {len(served)} LoRA adapter(s) ({shown}): delete them first",
            param="name",
        )
    batch.changes.deleted_models.append(name)
    replicas = [state.replicas[rid] for rid in sorted(index.of_model(name))]
    live = {r.id for r in replicas if r.state in LIVE or r.state == "sleeping"}
    # The cause before its effects: read in id order, the events say the model was
    # deleted and then what became of each replica, not the other way round.
    msg = f"deleted; {len(live)} replica(s) drain"
    batch.event("model.deleted", "model", name, msg, model=name)
    running = False
    for r in replicas:
        if r.id in live:
            r = batch.drain(r, f"model {name} deleted", grace_s=grace_s)
        running = running or r.state in RUNS
    if running:
        # Agents are told to run draining shards until they stop, which takes
        # the spec; stored so a restart in between does not cut them off.
        batch.changes.retired.append(model.spec)
    return batch


def scale_model(state: FleetState, name: str, req: ScaleRequest, *, now: float) -> Batch:
    model = require_model(state, name)
    spec = model.spec
    lo = spec.min_replicas if isinstance(req.min_replicas, msgspec.UnsetType) else req.min_replicas
    hi = spec.max_replicas if isinstance(req.max_replicas, msgspec.UnsetType) else req.max_replicas
    if hi < lo:
        raise InvalidRequest(
            f"max_replicas ({hi}) would be below min_replicas ({lo})", param="max_replicas"
        )
    batch = Batch(state, now)
    if (lo, hi) == (spec.min_replicas, spec.max_replicas):
        return batch
    new = msgspec.structs.replace(spec, min_replicas=lo, max_replicas=hi)
    desired = min(max(model.desired_replicas, lo), hi)
    batch.put_model(dataclasses.replace(model, spec=new, desired_replicas=desired))
    msg = f"replicas {spec.min_replicas}..{spec.max_replicas} → {lo}..{hi} (desired {desired})"
    batch.event("model.scaled", "model", name, msg, model=name)
    return batch


def set_weight(
    state: FleetState,
    rid: str,
    weight: float,
    *,
    now: float,
    capacity_tok_s: float | None = None,
) -> Batch:
    r = require_replica(state, rid)
    if not math.isfinite(weight) or weight <= 0:
        raise InvalidSpec(f"weight must be a positive number, got {weight}", param="weight")
    if capacity_tok_s is not None and (not math.isfinite(capacity_tok_s) or capacity_tok_s <= 0):
        raise InvalidSpec(
            f"capacity_tok_s must be a positive number, got {capacity_tok_s}",
            param="capacity_tok_s",
        )
    batch = Batch(state, now)
    if r.weight != weight or r.capacity_tok_s != capacity_tok_s:
        batch.update(r, weight=weight, capacity_tok_s=capacity_tok_s)
        msg = f"capacity weight {r.weight:g} → {weight:g}"
        if capacity_tok_s is not None:
            msg += f" (measured {capacity_tok_s:.0f} tok/s)"
        batch.event("replica.weight", "replica", rid, msg, model=r.model)
    return batch
