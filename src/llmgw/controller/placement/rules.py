"""Placement: where a replica's shards go, as pure functions over plain values.

Two rules, one per shape of replica:

- A single-node replica (`nodes == 1`) needs `gpus_per_node` healthy free GPUs
  of one acceptable class on one ready node. Best fit: the node it leaves with
  the fewest free cards wins (ties by node name), so whole nodes stay whole for
  the replicas that need them. Within the node the lowest contiguous run of
  indices is preferred (neighbouring cards usually share the fastest links).
- A multi-node replica needs `nodes` ready nodes that are *entirely* free (every
  GPU healthy and unused) on **one** fabric: free cards on the wrong fabric are
  not capacity for it. Of the fabrics that fit, the one with the fewest such
  whole nodes is used (ties by fabric name), keeping the biggest blocks for the
  replicas that need them most; within it the smallest nodes that fit, by name.

A replica uses one GPU class throughout (its pool is "<fabric>/<class>").
Every failure is an `Unplaceable` that names the constraint and its counts, so
"why is my model not running" has an answer.

`FreeMap` indexes free capacity by (class, free count) so one placement costs a
few dictionary lookups, not a walk over the fleet (1,000 placements on 2,000
nodes in well under a second; bench/controller_placement.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from llmgw.controller.fleet.records import FleetState, Node
from llmgw.controller.placement.capacity import FreeMap, gpus_in_use
from llmgw.wire.models import ModelSpec

__all__ = [
    "Constraint",
    "FreeMap",
    "Placement",
    "ShardPlacement",
    "Unplaceable",
    "free_map",
    "gpus_in_use",
    "place",
    "place_many",
]

# What stopped a placement, from the most structural to the most transient.
Constraint = Literal["gpu_class", "gpus_per_node", "fabric_nodes", "free_gpus", "whole_nodes"]
# The failures only a change of the fleet (or of the spec) fixes (_structural_failure).
LASTING: frozenset[Constraint] = frozenset({"gpu_class", "gpus_per_node", "fabric_nodes"})


@dataclass(frozen=True, slots=True)
class ShardPlacement:
    node: str
    rank: int
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    model: str
    shards: tuple[ShardPlacement, ...]
    # "<fabric>/<gpu class>": the fabric the replica was placed on
    # (multi-node) or rank 0's node's first fabric (single-node; "" if it has none).
    pool: str


@dataclass(frozen=True, slots=True)
class Unplaceable:
    model: str
    constraint: Constraint
    # For people: "needs 2 whole H100-80G nodes on one fabric; ib0 has 1, ib1 has 0".
    reason: str
    # The figures behind the reason, for tests and machines.
    counts: Mapping[str, int]

    @property
    def lasting(self) -> bool:
        """Whether the fleet as it is could never hold the model (its class, its width,
        its nodes on one fabric): no eviction, uncordon or wait makes it fit."""
        return self.constraint in LASTING


def free_map(state: FleetState, *, now: float, heartbeat_timeout_s: float) -> FreeMap:
    """Free capacity of the fleet: healthy GPUs on ready nodes that no live replica holds."""
    states = {
        name: node.shown_state(now=now, heartbeat_timeout_s=heartbeat_timeout_s)
        for name, node in state.nodes.items()
    }
    return FreeMap(state.nodes, states=states, used=gpus_in_use(state))


def place(spec: ModelSpec, nodes: Mapping[str, Node], free: FreeMap) -> Placement | Unplaceable:
    """One replica of `spec` on `free` (not changed), or why it cannot land.

    `nodes` must be the mapping `free` was built from; it supplies the pool's fabric.
    """
    if spec.nodes == 1:
        return _place_single(spec, nodes, free)
    return _place_multi(spec, free)


def place_many(
    specs: Sequence[ModelSpec], nodes: Mapping[str, Node], free: FreeMap
) -> list[Placement | Unplaceable]:
    """One replica per spec, in the given order, each taking its GPUs from a copy of `free`."""
    left = free.copy()
    out: list[Placement | Unplaceable] = []
    for spec in specs:
        result = place(spec, nodes, left)
        if isinstance(result, Placement):
            left.take(result)
        out.append(result)
    return out


def _place_single(
    spec: ModelSpec, nodes: Mapping[str, Node], free: FreeMap
) -> Placement | Unplaceable:
    need = spec.gpus_per_node
    found = free.best_fit(spec.gpu_classes, need)
    if found is not None:
        name, gpu_class = found
        gpus = _contiguous_lowest(free.free_of_class(name, gpu_class), need)
        node = nodes.get(name)
        fabric = node.fabrics[0] if node is not None and node.fabrics else ""
        shard = ShardPlacement(node=name, rank=0, gpus=gpus)
        return Placement(model=spec.name, shards=(shard,), pool=f"{fabric}/{gpu_class}")
    structural = _structural_failure(spec, free)
    if structural is not None:
        return structural
    census = free.census(spec.gpu_classes)
    largest = free.largest_free_block(spec.gpu_classes)
    counts = {"needed": need, "largest_free_block": largest, **census.counts()}
    reason = (
        f"needs {need} free {_classes(spec.gpu_classes)} GPUs on one ready node; "
        f"largest free block is {largest}{census.blockers()}"
    )
    return Unplaceable(model=spec.name, constraint="free_gpus", reason=reason, counts=counts)


def _place_multi(spec: ModelSpec, free: FreeMap) -> Placement | Unplaceable:
    need_nodes, need_gpus = spec.nodes, spec.gpus_per_node
    # (whole nodes on it, fabric, class) for every pairing that fits; the
    # smallest count that fits keeps the large blocks for larger replicas.
    fits: list[tuple[int, str, str]] = []
    per_fabric: dict[str, int] = {}
    for gpu_class in spec.gpu_classes:
        for fabric in free.fabrics_of(gpu_class):
            count = free.whole_count(gpu_class, fabric, need_gpus)
            per_fabric[fabric] = max(per_fabric.get(fabric, 0), count)
            if count >= need_nodes:
                fits.append((count, fabric, gpu_class))
    if fits:
        _, fabric, gpu_class = min(fits)
        chosen = free.smallest_whole(gpu_class, fabric, need_gpus, need_nodes)
        shards = tuple(
            ShardPlacement(
                node=name,
                rank=rank,
                gpus=_contiguous_lowest(free.free_of_class(name, gpu_class), need_gpus),
            )
            for rank, name in enumerate(chosen)
        )
        return Placement(model=spec.name, shards=shards, pool=f"{fabric}/{gpu_class}")
    structural = _structural_failure(spec, free)
    if structural is not None:
        return structural
    census = free.census(spec.gpu_classes)
    fabrics = census.fabrics
    head = f"needs {need_nodes} whole {_classes(spec.gpu_classes)} nodes on one fabric"
    counts: dict[str, int] = {"needed": need_nodes, **census.counts()}
    if not fabrics:
        reason = f"{head}; no {_classes(spec.gpu_classes)} node is on a fabric"
    else:
        # Fabrics whose nodes are all blocked have no whole free node: show them as 0.
        listed = ", ".join(f"{f} has {per_fabric.get(f, 0)}" for f in fabrics)
        reason = f"{head}; {listed}{census.blockers()}"
        counts.update({f"fabric:{f}": per_fabric.get(f, 0) for f in fabrics})
    return Unplaceable(model=spec.name, constraint="whole_nodes", reason=reason, counts=counts)


def _structural_failure(spec: ModelSpec, free: FreeMap) -> Unplaceable | None:
    """Failures no amount of waiting fixes: the class, the width, or (multi-node) that
    many wide enough nodes on one fabric does not exist in the fleet."""
    census = free.census(spec.gpu_classes)
    if census.nodes == 0:
        return Unplaceable(
            model=spec.name,
            constraint="gpu_class",
            reason=f"no node has GPU class {_classes(spec.gpu_classes)}",
            counts={"nodes": 0},
        )
    if census.widest < spec.gpus_per_node:
        return Unplaceable(
            model=spec.name,
            constraint="gpus_per_node",
            reason=(
                f"needs {spec.gpus_per_node} {_classes(spec.gpu_classes)} GPUs on one node; "
                f"the largest such node has {census.widest}"
            ),
            counts={"needed": spec.gpus_per_node, "largest_node_gpus": census.widest},
        )
    if spec.nodes > 1:
        return _too_few_on_a_fabric(spec, free)
    return None


def _too_few_on_a_fabric(spec: ModelSpec, free: FreeMap) -> Unplaceable | None:
    """No fabric has `nodes` nodes wide enough, in any state: freeing, uncordoning or
    healing cards would never make the replica fit, so the reason must not suggest it."""
    per_fabric = free.fabric_nodes(spec.gpu_classes, spec.gpus_per_node)
    if max(per_fabric.values(), default=0) >= spec.nodes:
        return None
    classes = _classes(spec.gpu_classes)
    if not free.census(spec.gpu_classes).fabrics:
        reason = (
            f"needs {spec.nodes} whole {classes} nodes on one fabric; "
            f"no {classes} node is on a fabric"
        )
    else:
        listed = ", ".join(f"{f} has {per_fabric[f]}" for f in sorted(per_fabric)) or (
            f"no {classes} node that wide is on a fabric"
        )
        reason = (
            f"needs {spec.nodes} {classes} nodes with at least {spec.gpus_per_node} GPUs "
            f"on one fabric; no fabric has that many: {listed}"
        )
    counts = {"needed": spec.nodes, **{f"fabric:{f}": n for f, n in sorted(per_fabric.items())}}
    return Unplaceable(model=spec.name, constraint="fabric_nodes", reason=reason, counts=counts)


def _classes(gpu_classes: Collection[str]) -> str:
    return " or ".join(gpu_classes)


def _contiguous_lowest(free_sorted: Sequence[int], need: int) -> tuple[int, ...]:
    """The lowest run of `need` consecutive indices, else simply the lowest `need`."""
    for i in range(len(free_sorted) - need + 1):
        if free_sorted[i + need - 1] - free_sorted[i] == need - 1:
            return tuple(free_sorted[i : i + need])
    return tuple(free_sorted[:need])
