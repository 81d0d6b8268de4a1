"""Compaction: which serving replicas to move so a fragmented fleet holds a model.

A model can be unplaceable while the fleet has enough free cards of its class in
total: they are spread over nodes (a 4-card replica finds 2 free on every node) or
over fabrics (two whole nodes, one on each). When idle eviction finds nothing,
moving a few ready replicas elsewhere can make the room; nothing stops serving for
it, since each moved replica gets a replacement first (make-before-break) and
drains only once that is ready (tick/per_model.py `_settle_pairs`).

The plan, in order:

- only when the shortfall is fragmentation: the free cards of the model's classes
  add up to what it needs (compaction moves cards around, it makes none);
- targets: for a single-node model, each node where moving the fewest replicas
  frees enough cards of one class (largest holders first); for a multi-node model,
  each fabric's cheapest nodes to empty entirely. A card held by anything that may
  not move (a starting, draining or sleeping replica, the room held for another
  model) rules its node out;
- a replica whose model fits nowhere on the free cards now is never a mover (one
  `place` per model);
- targets are tried fewest moves first; one counts only when the model then fits
  (`place` on the free cards plus the movers' cards) and every mover's replacement
  fits *now* on free cards outside the model's room (for a multi-node model, outside
  its whole nodes). The first that does is the plan; none: nothing moves.

Which replicas may move is the caller's rule (`movable`): placement/requests.py
allows ready replicas of any model and priority that are not already moving,
leaving, or part of another model's room.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmgw.controller.fleet.records import Node, Replica
from llmgw.controller.placement.capacity import FreeMap
from llmgw.controller.placement.rules import Placement, place
from llmgw.wire.models import ModelSpec

Card = tuple[str, int]
# How many targets are checked (each costs a free-map copy and a few placements).
_MAX_TRIES = 16
# How many sets of movers one node offers a single-node model.
_SETS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class Relocation:
    """One replica to move: its replacement goes to `placement` now."""

    replica: Replica
    placement: Placement


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    model: str
    # The replicas to move, each with its replacement's placement, by replica id.
    moves: tuple[Relocation, ...]
    # Where the model lands once the moved replicas have drained.
    placement: Placement
    # The cards held for the model meanwhile: its placement's, and for a multi-node
    # model every healthy card of its nodes (they must be entirely free).
    room: tuple[tuple[str, tuple[int, ...]], ...]


def fragmented(spec: ModelSpec, nodes: Mapping[str, Node], free: FreeMap) -> bool:
    """Whether the free cards of `spec`'s classes on placeable nodes add up to its need."""
    need = spec.gpus_per_node * spec.nodes
    total = 0
    for name in free.nodes:
        node = nodes.get(name)
        if node is None:
            continue
        classes = {g.gpu_class for g in node.gpus}
        total += sum(len(free.free_of_class(name, c)) for c in spec.gpu_classes if c in classes)
        if total >= need:
            return True
    return False


def plan_compaction(
    spec: ModelSpec,
    nodes: Mapping[str, Node],
    free: FreeMap,
    *,
    holders: Mapping[Card, Sequence[Replica]],
    movable: Callable[[Replica], bool],
    specs: Mapping[str, ModelSpec],
) -> CompactionPlan | None:
    """The fewest moves that make `spec` placeable, or None (module docstring).

    `free`: the free cards now (not changed); `holders`: (node, GPU) → the replicas
    on it (wakes.card_holders: only those that hold cards count); `specs`: every
    model's spec, for the movers' replacements.
    """
    if not fragmented(spec, nodes, free):
        return None
    # A replica whose model fits nowhere on the free cards now cannot move: left out
    # before targets are built, so the tries go to sets that may work (one place()
    # per model, however many of its replicas are looked at).
    fits: dict[str, bool] = {}

    def may_move(r: Replica) -> bool:
        if not movable(r):
            return False
        ok = fits.get(r.model)
        if ok is None:
            own = specs.get(r.model)
            ok = fits[r.model] = own is not None and isinstance(place(own, nodes, free), Placement)
        return ok

    targets = (
        _multi_targets(spec, nodes, free, holders, may_move)
        if spec.nodes > 1
        else (_single_targets(spec, nodes, free, holders, may_move))
    )
    targets.sort(key=lambda t: (len(t[0]), sum(r.gpu_count for r in t[0]), t[1]))
    for movers, _key in targets[:_MAX_TRIES]:
        found = _check(spec, nodes, free, movers, specs)
        if found is not None:
            return found
    return None


Target = tuple[list[Replica], str]


def _single_targets(
    spec: ModelSpec,
    nodes: Mapping[str, Node],
    free: FreeMap,
    holders: Mapping[Card, Sequence[Replica]],
    movable: Callable[[Replica], bool],
) -> list[Target]:
    """Per node and class: the fewest movers whose cards there, with the free ones, suffice."""
    out: list[Target] = []
    need = spec.gpus_per_node
    for name in free.nodes:
        node = nodes[name]
        for gpu_class in spec.gpu_classes:
            cards = [g.index for g in node.gpus if g.gpu_class == gpu_class and g.healthy]
            if len(cards) < need:
                continue
            have = len(free.free_of_class(name, gpu_class))
            gain: dict[str, int] = {}
            by_id: dict[str, Replica] = {}
            for g in cards:
                held = [h for h in holders.get((name, g), ()) if h.holds_gpus]
                if len(held) == 1 and movable(held[0]):
                    gain[held[0].id] = gain.get(held[0].id, 0) + 1
                    by_id[held[0].id] = held[0]
            short = need - have
            if short <= 0 or sum(gain.values()) < short:
                continue
            order = sorted(gain, key=lambda rid: (-gain[rid], by_id[rid].gpu_count, rid))
            fewest = next(k for k in range(1, len(order) + 1) if _sum(order[:k], gain) >= short)
            # Every set of the fewest movers (and one more) that frees enough: the
            # first one's replacement may fit nowhere where another's does.
            sets = 0
            for k in range(fewest, min(fewest + 1, len(order)) + 1):
                for combo in itertools.combinations(order, k):
                    if sets == _SETS_PER_NODE:
                        break
                    if _sum(combo, gain) >= short:
                        sets += 1
                        out.append(([by_id[rid] for rid in combo], f"{name}/{gpu_class}"))
    return out


def _sum(rids: Iterable[str], gain: Mapping[str, int]) -> int:
    return sum(gain[rid] for rid in rids)


def _multi_targets(
    spec: ModelSpec,
    nodes: Mapping[str, Node],
    free: FreeMap,
    holders: Mapping[Card, Sequence[Replica]],
    movable: Callable[[Replica], bool],
) -> list[Target]:
    """Per fabric and class: the cheapest `spec.nodes` nodes to empty entirely."""
    # (class, fabric) → [(movers on the node, node name)]
    options: dict[tuple[str, str], list[tuple[list[Replica], str]]] = {}
    for name in free.nodes:
        node = nodes[name]
        if not all(g.healthy for g in node.gpus):
            continue  # never entirely free
        movers = _emptying(name, node, free, holders, movable)
        if movers is None:
            continue
        for gpu_class in spec.gpu_classes:
            if sum(g.gpu_class == gpu_class for g in node.gpus) < spec.gpus_per_node:
                continue
            for fabric in node.fabrics:
                options.setdefault((gpu_class, fabric), []).append((movers, name))
    out: list[Target] = []
    for (gpu_class, fabric), found in sorted(options.items()):
        if len(found) < spec.nodes:
            continue
        found.sort(key=lambda mn: (len(mn[0]), mn[1]))
        union: dict[str, Replica] = {}
        for movers, _name in found[: spec.nodes]:
            union.update((r.id, r) for r in movers)
        if union:
            out.append((sorted(union.values(), key=lambda r: r.id), f"{fabric}/{gpu_class}"))
    return out


def _emptying(
    name: str,
    node: Node,
    free: FreeMap,
    holders: Mapping[Card, Sequence[Replica]],
    movable: Callable[[Replica], bool],
) -> list[Replica] | None:
    """The replicas to move for `node` to be entirely free; None when something there
    may not move (or holds a card no replica accounts for: another model's room)."""
    here = free.free_gpus(name)
    movers: dict[str, Replica] = {}
    for g in node.gpus:
        if g.index in here:
            continue
        held = [h for h in holders.get((name, g.index), ()) if h.holds_gpus]
        if not held or not all(movable(h) for h in held):
            return None
        movers.update((h.id, h) for h in held)
    return list(movers.values())


def _check(
    spec: ModelSpec,
    nodes: Mapping[str, Node],
    free: FreeMap,
    movers: list[Replica],
    specs: Mapping[str, ModelSpec],
) -> CompactionPlan | None:
    """The plan for moving `movers`, if the model then fits and each replacement fits now."""
    after = free.copy()
    for r in movers:
        for s in r.shards:
            after.release(s.node, s.gpus)
    landed = place(spec, nodes, after)
    if not isinstance(landed, Placement):
        return None
    room = _room(spec, nodes, landed)
    now = free.copy()
    for node, gpus in room:
        now.take_free(node, gpus)  # the rest is the movers' for now
    moves: list[Relocation] = []
    # Largest first: they are the hardest to fit.
    for r in sorted(movers, key=lambda r: (-r.gpu_count, r.id)):
        own = specs.get(r.model)
        if own is None:
            return None
        to = place(own, nodes, now)
        if not isinstance(to, Placement):
            return None
        now.take(to)
        moves.append(Relocation(replica=r, placement=to))
    moves.sort(key=lambda m: m.replica.id)
    return CompactionPlan(model=spec.name, moves=tuple(moves), placement=landed, room=room)


def _room(
    spec: ModelSpec, nodes: Mapping[str, Node], landed: Placement
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if spec.nodes == 1:
        return tuple((s.node, s.gpus) for s in landed.shards)
    return tuple(
        (s.node, tuple(g.index for g in nodes[s.node].gpus if g.healthy)) for s in landed.shards
    )


def why(spec: ModelSpec, plan: CompactionPlan) -> str:
    """For the model's event: what moves where, and where the model lands."""
    moves = "; ".join(
        f"{m.replica.id} ({m.replica.model}) to "
        + ", ".join(f"{s.node} GPUs {','.join(map(str, s.gpus))}" for s in m.placement.shards)
        for m in plan.moves
    )
    lands = ", ".join(s.node for s in plan.placement.shards)
    return f"{spec.name} lands on {lands} once they have drained: {moves}"
