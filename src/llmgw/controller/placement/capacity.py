"""Free capacity, indexed for placement. Pure values, no I/O.

`FreeMap` holds, per placeable node (shown state "ready"), the set of GPU
indices that are healthy and held by no live replica, and keeps two indexes
over it so a placement is a few lookups rather than a walk over 2,000 nodes:

- class → free count (of that class) → nodes, for best fit of single-node replicas;
- (class, fabric) → GPUs of that class on the node → nodes that are *entirely*
  free, for multi-node replicas.

Unplaceable reasons need the whole fleet (cordoned and unreachable nodes,
unhealthy cards), which never changes while a FreeMap is used, so that census
is built once and shared by every copy.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmgw.controller.fleet.records import HOLDS_GPUS, SHARD_RUNNING, FleetState, Node
from llmgw.wire.admin import NodeState

if TYPE_CHECKING:
    from llmgw.controller.placement.rules import Placement

_BLOCKED_STATES: tuple[NodeState, ...] = ("cordoned", "draining", "unreachable")


def gpus_in_use(state: FleetState) -> dict[str, set[int]]:
    """Node → GPU indices held: every shard of a replica whose state holds GPUs
    (records.HOLDS_GPUS), and the shards of stopped or failed ones whose engine
    its agent last reported running (records.SHARD_RUNNING: still exiting)."""
    used: dict[str, set[int]] = {}
    for replica in state.replicas.values():
        if replica.state in HOLDS_GPUS:
            for shard in replica.shards:
                used.setdefault(shard.node, set()).update(shard.gpus)
        elif replica.holds_gpus:
            for shard in replica.shards:
                if shard.state in SHARD_RUNNING:
                    used.setdefault(shard.node, set()).update(shard.gpus)
    return used


@dataclass(frozen=True, slots=True)
class Census:
    """The fleet as seen by the GPU classes a model accepts (every node, any state)."""

    # Nodes with at least one GPU of the classes.
    nodes: int
    # Most GPUs of one of the classes on any single node.
    widest: int
    by_state: Mapping[NodeState, int]
    # Unhealthy GPUs of the classes on ready nodes: what shrinks the free blocks.
    unhealthy: int
    # Fabrics of those nodes, sorted.
    fabrics: tuple[str, ...]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {s: self.by_state.get(s, 0) for s in ("ready", *_BLOCKED_STATES)}
        out["unhealthy_gpus"] = self.unhealthy
        return out

    def blockers(self) -> str:
        """' (3 nodes cordoned, 1 unreachable, 2 GPUs unhealthy)', or '' when nothing blocks."""
        parts: list[str] = []
        for state in _BLOCKED_STATES:
            n = self.by_state.get(state, 0)
            if n:
                # Only the first figure says "nodes": "3 nodes cordoned, 1 unreachable".
                noun = "" if parts else ("node " if n == 1 else "nodes ")
                parts.append(f"{n} {noun}{state}")
        if self.unhealthy:
            parts.append(f"{self.unhealthy} {'GPU' if self.unhealthy == 1 else 'GPUs'} unhealthy")
        return f" ({', '.join(parts)})" if parts else ""


@dataclass(frozen=True, slots=True)
class _NodeInfo:
    fabrics: tuple[str, ...]
    # Every GPU on the node, healthy or not.
    size: int
    healthy: frozenset[int]
    # Class → indices of that class (healthy or not), sorted.
    by_class: Mapping[str, tuple[int, ...]]


@dataclass(slots=True)
class _Shared:
    """What every copy of one FreeMap shares: it never changes."""

    info: dict[str, _NodeInfo]
    # Placeable nodes' fabrics per class: the keys of the whole-node index.
    fabrics: dict[str, tuple[str, ...]]
    top: dict[str, int]
    classes_of: dict[str, tuple[str, ...]]
    # Every node's fabrics, placeable or not (reasons list blocked fabrics as 0).
    fabrics_of: dict[str, tuple[str, ...]]
    states: dict[str, NodeState]
    unhealthy_ready: dict[str, Counter[str]]
    widest: dict[str, int]
    # Every node's GPUs per class, placeable or not.
    sizes_of: dict[str, dict[str, int]] = field(default_factory=dict)
    census_memo: dict[tuple[str, ...], Census] = field(default_factory=dict)
    fabric_memo: dict[tuple[tuple[str, ...], int], dict[str, int]] = field(default_factory=dict)


class _Bucket:
    """A set of node names that also yields its smallest name cheaply (lazy-deletion heap)."""

    __slots__ = ("heap", "members")

    def __init__(self) -> None:
        self.members: set[str] = set()
        self.heap: list[str] = []

    def add(self, name: str) -> None:
        if name not in self.members:
            self.members.add(name)
            heapq.heappush(self.heap, name)

    def first(self) -> str | None:
        heap = self.heap
        while heap and heap[0] not in self.members:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def copy(self) -> _Bucket:
        out = _Bucket()
        out.members = set(self.members)
        out.heap = list(self.heap)
        return out


class FreeMap:
    """Per placeable node, its free healthy GPU indices, indexed by class and free count.

    `states` gives every node's shown state (a node absent from it counts as
    unreachable: unknown is not ready); `used` the indices live replicas hold.
    """

    __slots__ = ("_free", "_shared", "_single", "_whole")

    def __init__(
        self,
        nodes: Mapping[str, Node],
        *,
        states: Mapping[str, NodeState],
        used: Mapping[str, Collection[int]],
    ) -> None:
        shared = _Shared(
            info={},
            fabrics={},
            top={},
            classes_of={},
            fabrics_of={},
            states={},
            unhealthy_ready={},
            widest={},
        )
        fabric_sets: dict[str, set[str]] = {}
        self._free: dict[str, set[int]] = {}
        for name, node in nodes.items():
            state = states.get(name, "unreachable")
            shared.states[name] = state
            by_class: dict[str, list[int]] = {}
            for gpu in node.gpus:
                by_class.setdefault(gpu.gpu_class, []).append(gpu.index)
            shared.classes_of[name] = tuple(by_class)
            shared.sizes_of[name] = {c: len(i) for c, i in by_class.items()}
            shared.fabrics_of[name] = node.fabrics
            for gpu_class, indices in by_class.items():
                shared.widest[gpu_class] = max(shared.widest.get(gpu_class, 0), len(indices))
            if state != "ready":
                continue
            shared.unhealthy_ready[name] = Counter(g.gpu_class for g in node.gpus if not g.healthy)
            healthy = frozenset(g.index for g in node.gpus if g.healthy)
            shared.info[name] = _NodeInfo(
                fabrics=node.fabrics,
                size=len(node.gpus),
                healthy=healthy,
                by_class={c: tuple(sorted(i)) for c, i in by_class.items()},
            )
            for gpu_class, indices in by_class.items():
                shared.top[gpu_class] = max(shared.top.get(gpu_class, 0), len(indices))
                fabric_sets.setdefault(gpu_class, set()).update(node.fabrics)
            self._free[name] = set(healthy.difference(used.get(name, ())))
        shared.fabrics = {c: tuple(sorted(f)) for c, f in fabric_sets.items()}
        self._shared = shared
        self._single: dict[str, dict[int, _Bucket]] = {}
        self._whole: dict[tuple[str, str], dict[int, set[str]]] = {}
        for name in self._free:
            self._index(name)

    # -- reading --------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self._free

    @property
    def nodes(self) -> tuple[str, ...]:
        """Placeable node names, sorted."""
        return tuple(sorted(self._free))

    def free_gpus(self, name: str) -> frozenset[int]:
        """Free healthy indices on a placeable node; empty for any other node."""
        return frozenset(self._free.get(name, ()))

    def free_of_class(self, name: str, gpu_class: str) -> list[int]:
        info = self._shared.info[name]
        indices = info.by_class.get(gpu_class, ())
        free = self._free[name]
        return [i for i in indices if i in free]

    def best_fit(self, gpu_classes: Iterable[str], need: int) -> tuple[str, str] | None:
        """(node, class) with at least `need` free GPUs of the class and the fewest left over."""
        best: tuple[int, str, str] | None = None
        for gpu_class in gpu_classes:
            buckets = self._single.get(gpu_class)
            if not buckets:
                continue
            for count in range(need, self._shared.top[gpu_class] + 1):
                if best is not None and count > best[0]:
                    break
                bucket = buckets.get(count)
                name = bucket.first() if bucket is not None else None
                if name is not None:
                    if best is None or (count, name, gpu_class) < best:
                        best = (count, name, gpu_class)
                    break
        return None if best is None else (best[1], best[2])

    def largest_free_block(self, gpu_classes: Iterable[str]) -> int:
        """Most free GPUs of one accepted class on one placeable node."""
        largest = 0
        for gpu_class in gpu_classes:
            buckets = self._single.get(gpu_class, {})
            for count in range(self._shared.top.get(gpu_class, 0), largest, -1):
                bucket = buckets.get(count)
                if bucket is not None and bucket.first() is not None:
                    largest = count
                    break
        return largest

    def fabrics_of(self, gpu_class: str) -> tuple[str, ...]:
        """Fabrics of the placeable nodes that have this class, sorted."""
        return self._shared.fabrics.get(gpu_class, ())

    def whole_count(self, gpu_class: str, fabric: str, need: int) -> int:
        """Entirely free placeable nodes on `fabric` with at least `need` GPUs of the class."""
        sizes = self._whole.get((gpu_class, fabric), {})
        return sum(len(names) for size, names in sizes.items() if size >= need)

    def smallest_whole(self, gpu_class: str, fabric: str, need: int, n: int) -> list[str]:
        """The `n` smallest entirely free nodes that fit, by (GPUs of the class, name)."""
        sizes = self._whole.get((gpu_class, fabric), {})
        fits = [(size, name) for size, names in sizes.items() if size >= need for name in names]
        return [name for _, name in heapq.nsmallest(n, fits)]

    def census(self, gpu_classes: tuple[str, ...]) -> Census:
        """The fleet seen by these classes; built once per tuple of classes, then reused."""
        memo = self._shared.census_memo
        found = memo.get(gpu_classes)
        if found is None:
            found = memo[gpu_classes] = self._build_census(gpu_classes)
        return found

    def fabric_nodes(self, gpu_classes: tuple[str, ...], need: int) -> Mapping[str, int]:
        """Fabric → nodes on it (any state) with at least `need` GPUs of one of the
        classes: the most nodes a multi-node replica could ever span there."""
        memo = self._shared.fabric_memo
        found = memo.get((gpu_classes, need))
        if found is None:
            found = memo[(gpu_classes, need)] = {}
            shared = self._shared
            for name, sizes in shared.sizes_of.items():
                if any(sizes.get(c, 0) >= need for c in gpu_classes):
                    for fabric in shared.fabrics_of[name]:
                        found[fabric] = found.get(fabric, 0) + 1
        return found

    # -- changing -------------------------------------------------------------

    def copy(self) -> FreeMap:
        out = object.__new__(FreeMap)
        out._shared = self._shared
        out._free = {name: set(gpus) for name, gpus in self._free.items()}
        out._single = {
            c: {count: b.copy() for count, b in buckets.items()}
            for c, buckets in self._single.items()
        }
        out._whole = {
            key: {size: set(names) for size, names in sizes.items()}
            for key, sizes in self._whole.items()
        }
        return out

    def take(self, placement: Placement) -> None:
        """Mark a placement's GPUs given. All or nothing: a GPU already given is an error."""
        for shard in placement.shards:
            free = self._free.get(shard.node)
            missing = set(shard.gpus) - free if free is not None else set(shard.gpus)
            if missing:
                raise ValueError(
                    f"{placement.model}: GPUs {sorted(missing)} on {shard.node} are not free"
                )
        for shard in placement.shards:
            self._unindex(shard.node)
            self._free[shard.node].difference_update(shard.gpus)
            self._index(shard.node)

    def take_free(self, node: str, gpus: Iterable[int]) -> tuple[int, ...]:
        """Take whichever of `gpus` are free on `node` now (room held for a model while
        the rest of it is still being freed); returns those taken."""
        free = self._free.get(node)
        if free is None:
            return ()
        taken = tuple(g for g in gpus if g in free)
        if taken:
            self._unindex(node)
            free.difference_update(taken)
            self._index(node)
        return taken

    def release(self, node: str, gpus: Iterable[int]) -> None:
        """Give GPUs back (a simulated eviction). Only healthy cards of placeable nodes count."""
        info = self._shared.info.get(node)
        if info is None:
            return
        self._unindex(node)
        self._free[node].update(info.healthy.intersection(gpus))
        self._index(node)

    # -- index upkeep ---------------------------------------------------------

    def _class_counts(self, name: str) -> Iterable[tuple[str, int]]:
        info = self._shared.info[name]
        free = self._free[name]
        if len(info.by_class) == 1:
            for gpu_class in info.by_class:
                yield gpu_class, len(free)
            return
        for gpu_class, indices in info.by_class.items():
            yield gpu_class, sum(1 for i in indices if i in free)

    def _is_whole(self, name: str) -> bool:
        info = self._shared.info[name]
        return info.size > 0 and len(self._free[name]) == info.size

    def _index(self, name: str) -> None:
        for gpu_class, count in self._class_counts(name):
            if count:
                self._single.setdefault(gpu_class, {}).setdefault(count, _Bucket()).add(name)
        if self._is_whole(name):
            info = self._shared.info[name]
            for gpu_class, indices in info.by_class.items():
                for fabric in info.fabrics:
                    sizes = self._whole.setdefault((gpu_class, fabric), {})
                    sizes.setdefault(len(indices), set()).add(name)

    def _unindex(self, name: str) -> None:
        for gpu_class, count in self._class_counts(name):
            if count:
                self._single[gpu_class][count].members.discard(name)
        if self._is_whole(name):
            info = self._shared.info[name]
            for gpu_class, indices in info.by_class.items():
                for fabric in info.fabrics:
                    self._whole[(gpu_class, fabric)][len(indices)].discard(name)

    def _build_census(self, gpu_classes: tuple[str, ...]) -> Census:
        shared = self._shared
        wanted = set(gpu_classes)
        by_state: Counter[NodeState] = Counter()
        fabrics: set[str] = set()
        unhealthy = 0
        nodes = 0
        for name, classes in shared.classes_of.items():
            if wanted.isdisjoint(classes):
                continue
            nodes += 1
            by_state[shared.states[name]] += 1
            fabrics.update(shared.fabrics_of[name])
            counter = shared.unhealthy_ready.get(name)
            if counter:
                unhealthy += sum(counter[c] for c in wanted)
        widest = max((shared.widest.get(c, 0) for c in gpu_classes), default=0)
        return Census(
            nodes=nodes,
            widest=widest,
            by_state=dict(by_state),
            unhealthy=unhealthy,
            fabrics=tuple(sorted(fabrics)),
        )
