"""Idle eviction: which idle replicas to drain so an unplaceable model fits.

Candidates are ready replicas *known* idle at least their own model's
`idle_timeout_s`. Never one whose idleness is unknown (a restarted router knows
nothing, and treating that as idle would empty the fleet), never one that
would take its model below `min_replicas`, never one still serving a request (its
last dispatch is old, but a long generation is still streaming: drained, it would
be cut off at the end of the drain grace), never one of a model with a higher
priority than the requester's. Equal priority is allowed: the victim is by
definition unused past its own timeout, and a model someone is waiting for
should not stay unplaceable behind it. Lower priority goes first, then the
longest idle.

Only a set that actually makes the placement feasible is chosen: candidates are
freed one by one, in that order, on a copy of the free map until `place`
succeeds; then members that did not contribute are dropped, so the plan evicts
no more than it needs. Nothing is evicted when no set works.

A tick asks this for every model it cannot place; it passes a `CandidatePool`
(placement/tickview.py) that has worked out each replica's part of the rules once
for the tick, so a request filters a list instead of walking every replica.
Without one (tests, benchmarks) the rules are applied to the state as given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from llmgw.controller.fleet.records import FleetState, Replica
from llmgw.controller.idle import IdleFor, IdleSource, InflightFor, idle_fn
from llmgw.controller.placement.capacity import FreeMap
from llmgw.controller.placement.rules import Placement, place
from llmgw.wire.models import ModelSpec


@dataclass(frozen=True)
class EvictionPlan:
    model: str
    # Replica ids to drain, in the order they were chosen; empty when the model
    # fits without evicting anything.
    evict: tuple[str, ...]
    # Where the model lands once the evicted replicas have stopped and given
    # their cards back (draining replicas still hold them, records.HOLDS_GPUS).
    placement: Placement
    # For the event log: each evicted replica with its model, priority and idle time.
    why: str


@dataclass(frozen=True, slots=True)
class Candidate:
    replica: Replica
    priority: int
    idle_s: float


class CandidatePool(Protocol):
    """One tick's replicas with the rules' per-replica parts worked out once
    (placement/tickview.py): what `idle_candidates` and `_spare_per_model` would
    give for the same state, idle times, in-flight counts and `exclude`."""

    @property
    def spare(self) -> Mapping[str, int]:
        """Model → ready replicas above its min_replicas, those leaving not counted."""
        ...

    def candidates(
        self, spec: ModelSpec, *, wait_s: float = 0.0, busy_ok: bool = False
    ) -> list[Candidate]:
        """`idle_candidates` for `spec` with every idle time `wait_s` longer (`busy_ok`:
        without the in-flight rule, as wakes.py asks), less those no rule could take."""
        ...

    def waits(self, spec: ModelSpec, n: int) -> list[float]:
        """The `n` shortest distinct waits `idle_enough_in` would try for `spec`."""
        ...

    def sleeping(self, model: str) -> Sequence[Replica]:
        """The model's sleeping replicas, in the state's order."""
        ...


def plan_eviction(
    spec: ModelSpec,
    state: FleetState,
    idle: IdleFor | IdleSource,
    free: FreeMap,
    *,
    now: float,
    heartbeat_timeout_s: float,
    exclude: Collection[str] = (),
    inflight: InflightFor | None = None,
    pool: CandidatePool | None = None,
    wait_s: float = 0.0,
    keep: Collection[str] = (),
) -> EvictionPlan | None:
    """A minimal set of idle replicas whose cards make `spec` placeable, or None.

    `idle`: replica id → idle seconds (None when unknown), or an IdleTracker.
    `free` is not changed. `exclude`: replicas already chosen for eviction this
    tick (they must not be counted twice). `inflight`: replica id → requests in
    flight there (None when no router reported any); None: none known. `pool`:
    the same facts worked out for the tick (then `idle`, `exclude` and `inflight`
    are its own), with every idle time `wait_s` longer. `keep`: replicas whose cards
    are room held for another model (moving for it, placement/compaction.py): never
    candidates, or two models would wait for the same cards.
    """
    direct = place(spec, state.nodes, free)
    if isinstance(direct, Placement):
        return EvictionPlan(
            model=spec.name, evict=(), placement=direct, why="fits without eviction"
        )
    if pool is None:
        candidates = idle_candidates(
            spec, state, idle_fn(idle, now=now), now, heartbeat_timeout_s, exclude, inflight
        )
        spare: Mapping[str, int] = _spare_per_model(state, exclude)
    else:
        candidates = pool.candidates(spec, wait_s=wait_s)
        spare = pool.spare
    if keep:
        candidates = [c for c in candidates if c.replica.id not in keep]
    found = _greedy(spec, state, free, candidates, spare)
    if found is None:
        return None
    chosen = _shrink(spec, state, free, *found)
    placement = _place_after(spec, state, free, chosen)
    if placement is None:  # cannot happen: _shrink only keeps feasible sets
        return None
    return EvictionPlan(
        model=spec.name,
        evict=tuple(c.replica.id for c in chosen),
        placement=placement,
        why=_why(spec, chosen),
    )


def idle_candidates(
    spec: ModelSpec,
    state: FleetState,
    idle: IdleFor,
    now: float,
    heartbeat_timeout_s: float,
    exclude: Collection[str],
    inflight: InflightFor | None = None,
) -> list[Candidate]:
    """Ready replicas of other models that eviction may take for `spec`, in the
    order it takes them (module docstring: the rules)."""
    out: list[Candidate] = []
    for r in state.replicas.values():
        if r.state != "ready" or r.model == spec.name or r.id in exclude:
            continue
        model = state.models.get(r.model)
        if model is None or model.spec.priority > spec.priority:
            continue
        idle_s = idle(r.id)
        if idle_s is not None and model.spec.sleep_mode:
            # Not idle for longer than it has been ready: a replica just woken still
            # carries its last use from before it slept, and taking it at once for
            # another model would undo the wake it was woken for.
            idle_s = min(idle_s, max(0.0, now - r.state_since))
        if idle_s is None or idle_s < model.spec.evictable_after_s:
            continue  # unknown is never idle
        busy = inflight(r.id) if inflight is not None else None
        if busy is not None and busy > 0:
            continue
        # Cards on a node that is not ready are not capacity even once freed.
        if not any(node_ready(state, s.node, now, heartbeat_timeout_s) for s in r.shards):
            continue
        out.append(Candidate(replica=r, priority=model.spec.priority, idle_s=idle_s))
    out.sort(key=lambda c: (c.priority, -c.idle_s, c.replica.id))
    return out


def node_ready(state: FleetState, node: str, now: float, heartbeat_timeout_s: float) -> bool:
    """Whether `node` is shown ready: only its cards are capacity."""
    n = state.nodes.get(node)
    return n is not None and n.shown_state(now=now, heartbeat_timeout_s=heartbeat_timeout_s) == (
        "ready"
    )


def _greedy(
    spec: ModelSpec,
    state: FleetState,
    free: FreeMap,
    candidates: Sequence[Candidate],
    spare: Mapping[str, int],
) -> tuple[list[Candidate], Placement] | None:
    """Free candidates in order until the model fits; None if even all of them do not suffice.

    `spare`: model → how many may go (`_spare_per_model`); not changed.
    """
    taken: Counter[str] = Counter()
    # Copied on the first candidate taken: most requests have none, and a copy
    # costs a walk over every node.
    sim: FreeMap | None = None
    chosen: list[Candidate] = []
    for c in candidates:
        model = c.replica.model
        if spare.get(model, 0) - taken[model] <= 0:
            continue  # never below the model's min_replicas
        taken[model] += 1
        chosen.append(c)
        if sim is None:
            sim = free.copy()
        for shard in c.replica.shards:
            sim.release(shard.node, shard.gpus)
        result = place(spec, state.nodes, sim)
        if isinstance(result, Placement):
            return chosen, result
    return None


def _spare_per_model(state: FleetState, leaving: Collection[str]) -> Counter[str]:
    """Model → ready replicas above its min_replicas: how many may go.

    Replicas already leaving this tick (`leaving`: surplus, another model's
    eviction) are still ready in `state` but no longer count: two evictions in
    one tick must not each take "the one spare" of the same model.
    """
    ready = Counter(
        r.model for r in state.replicas.values() if r.state == "ready" and r.id not in leaving
    )
    return Counter({name: ready[name] - m.spec.min_replicas for name, m in state.models.items()})


def _shrink(
    spec: ModelSpec,
    state: FleetState,
    free: FreeMap,
    chosen: list[Candidate],
    placement: Placement,
) -> list[Candidate]:
    """Drop members not needed, most valuable (last chosen) first; the set stays feasible."""
    # First cut: the victims on the cards (multi-node: the whole nodes) the
    # placement landed on; whatever else greedy freed did not contribute.
    whole_nodes = spec.nodes > 1
    landed = {(s.node, g) for s in placement.shards for g in s.gpus}
    landed_nodes = {s.node for s in placement.shards}

    def contributed(c: Candidate) -> bool:
        for shard in c.replica.shards:
            if whole_nodes and shard.node in landed_nodes:
                return True
            if any((shard.node, g) in landed for g in shard.gpus):
                return True
        return False

    kept = [c for c in chosen if contributed(c)]
    if _place_after(spec, state, free, kept) is None:
        kept = list(chosen)
    for c in reversed(list(kept)):
        trial = [k for k in kept if k is not c]
        if _place_after(spec, state, free, trial) is not None:
            kept = trial
    return kept


def _place_after(
    spec: ModelSpec, state: FleetState, free: FreeMap, evicted: Sequence[Candidate]
) -> Placement | None:
    sim = free.copy()
    for c in evicted:
        for shard in c.replica.shards:
            sim.release(shard.node, shard.gpus)
    result = place(spec, state.nodes, sim)
    return result if isinstance(result, Placement) else None


def _why(spec: ModelSpec, chosen: Sequence[Candidate]) -> str:
    victims = ", ".join(
        f"{c.replica.id} ({c.replica.model}, priority {c.priority}, idle {int(c.idle_s)} s)"
        for c in chosen
    )
    return f"to place {spec.name} (priority {spec.priority}): evicting {victims}"


# How many future moments `idle_enough_in` tries: each is one eviction plan.
_ETA_TRIES = 4


def idle_enough_in(
    spec: ModelSpec,
    state: FleetState,
    idle: IdleFor | IdleSource,
    free: FreeMap,
    *,
    now: float,
    heartbeat_timeout_s: float,
    exclude: Collection[str] = (),
    inflight: InflightFor | None = None,
    pool: CandidatePool | None = None,
) -> float | None:
    """Seconds until enough replicas are idle long enough for an eviction to place `spec`,
    if none of them is used meanwhile; None when waiting would not help. `pool`: as
    for `plan_eviction`.

    Called when `plan_eviction` found nothing now. Only replicas whose idleness is
    known can become candidates (unknown stays unknown however long one waits), and
    every other rule holds (min_replicas, priority, ready nodes): each moment at which
    one more replica crosses its model's idle_timeout_s is tried, earliest first, as
    an eviction plan with every known idle time moved on by that much.
    """
    idle_now = idle_fn(idle, now=now)
    if pool is not None:
        for wait in pool.waits(spec, _ETA_TRIES):
            found = plan_eviction(
                spec,
                state,
                idle_now,
                free,
                now=now,
                heartbeat_timeout_s=heartbeat_timeout_s,
                pool=pool,
                wait_s=wait,
            )
            if found is not None and found.evict:
                return wait
        return None
    for wait in eta_waits(spec, state, idle_now, exclude, _ETA_TRIES):

        def later(rid: str, _w: float = wait) -> float | None:
            s = idle_now(rid)
            return None if s is None else s + _w

        found = plan_eviction(
            spec,
            state,
            later,
            free,
            now=now,
            heartbeat_timeout_s=heartbeat_timeout_s,
            exclude=exclude,
            inflight=inflight,
        )
        if found is not None and found.evict:
            return wait
    return None


def eta_waits(
    spec: ModelSpec, state: FleetState, idle: IdleFor, exclude: Collection[str], n: int
) -> list[float]:
    """The `n` shortest distinct waits after which one more ready replica of another
    model, not above `spec`'s priority, is idle past its model's timeout."""
    waits: set[float] = set()
    for r in state.replicas.values():
        if r.state != "ready" or r.model == spec.name or r.id in exclude:
            continue
        model = state.models.get(r.model)
        idle_s = idle(r.id)
        if model is None or model.spec.priority > spec.priority or idle_s is None:
            continue
        if idle_s < model.spec.evictable_after_s:
            waits.add(model.spec.evictable_after_s - idle_s)
    return sorted(waits)[:n]
