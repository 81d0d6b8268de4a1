"""Sleeping instead of stopping: where a replica may sleep, and which sleeping replica wakes.

A card holds one awake replica and any number of sleeping ones while their
memory allows (docs/sleep-and-adapters.md). The memory model:

- an awake engine takes AWAKE_SHARE of each of its cards (vLLM's default
  `--gpu-memory-utilization`); a sleeping one keeps SLEEP_RESIDUAL_MIB of each
  (an H100 engine asleep holds 1.4 GiB). So a card keeps room for one awake
  engine and as many sleepers as fit in the rest: `sleepers_per_card`. Capping
  sleepers that way means an awake placement is never blocked by sleepers, and
  the placement rules (rules.py) need not know about them;
- a level-1 sleeper keeps its weights in the node's host memory (the spec's
  `weights_gb`, split over the replica's nodes), within HOST_SHARE of what the
  agent reports; level 2 keeps nothing there but wakes slower. With no
  `sleep_level` in the spec, level 1 is chosen when the weights fit as they
  are, else 2; unknown weights or unknown host memory choose 2.

A sleeping replica is stopped only when its memory is needed by another
sleeper: the least valuable first (lower priority, then asleep the longest).

Waking (`plan_wake`): a model that needs a replica wakes one of its sleepers
when that sleeper's cards are free, or can be made free by the same rules as
eviction (eviction.py: known idle past the timeout, never below min_replicas,
never a higher priority); the awake replicas holding them go to sleep or stop
in turn, a swap. Only a sleeper whose every card is placeable counts (its node
ready, the card healthy). Fewest victims first, then the lowest priority among
them, then the sleeper asleep the shortest time.

Moves: a replica in use on a sleeper's cards (not idle long enough to be a
victim) may still make way when its own model has a sleeper that can wake
elsewhere without moving anything in turn, and its model's priority is not
above the waking one's: it sleeps here (its requests in flight finish first)
and its sleeper wakes there, so its model keeps its replica count and its
clients wait one wake instead of the waking model's clients waiting a cold
start. A plan without moves is always preferred.

Falling asleep: a replica told to sleep keeps its cards until its agent reports
the engine asleep (records.HOLDS_GPUS); its shards read `ready` meanwhile. One
wanted again in that time is neither woken at once (its shards' `ready` would
read as awake, and routers would send to an engine still falling asleep) nor
replaced by a cold start: its plan is `settling`, the model waits, and the
first tick after the sleep ends wakes it in place (its cards are then free).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmgw.controller.fleet.records import SHARD_RUNNING, FleetState, Node, Replica
from llmgw.controller.idle import IdleFor, IdleSource, idle_fn
from llmgw.controller.placement.capacity import FreeMap
from llmgw.controller.placement.eviction import Candidate, CandidatePool, idle_candidates
from llmgw.wire.models import ModelSpec

AWAKE_SHARE = 0.9
SLEEP_RESIDUAL_MIB = 1434
HOST_SHARE = 0.8
MIB_PER_GB = 1e9 / 2**20

# The states whose engines may hold memory while asleep.
_SLEEPING = "sleeping"


def sleepers_per_card(memory_mib: int) -> int:
    """Sleeping engines a card keeps beside room for one awake engine."""
    return int(memory_mib * (1.0 - AWAKE_SHARE) // SLEEP_RESIDUAL_MIB)


def weights_mib_per_node(spec: ModelSpec) -> float | None:
    """Host memory a level-1 sleep of `spec` takes on each of its nodes; None: unknown."""
    if spec.weights_gb is None:
        return None
    return spec.weights_gb * MIB_PER_GB / spec.nodes


@dataclass(frozen=True, slots=True)
class SleepRoom:
    """Where a ready replica may sleep: at `level`, once the sleepers in `stop` have gone."""

    level: int
    stop: tuple[str, ...]


def sleep_room(
    r: Replica,
    spec: ModelSpec,
    replicas: Mapping[str, Replica],
    nodes: Mapping[str, Node],
    specs: Mapping[str, ModelSpec],
) -> SleepRoom | None:
    """Whether `r` may sleep where it is; None: it must stop (no sleep mode, no room).

    `replicas` is the fleet as this tick sees it (with its own changes); `specs`
    model name → spec, for the sleepers' priorities and sizes.
    """
    if not spec.sleep_mode:
        return None
    sleepers = [s for s in replicas.values() if s.state == _SLEEPING and s.id != r.id]
    by_value = sorted(sleepers, key=lambda s: _value(s, specs))
    stop: list[str] = []
    # Per card: room for one more sleeper.
    for shard in r.shards:
        node = nodes.get(shard.node)
        if node is None:
            return None
        memory = {g.index: g.memory_mib for g in node.gpus}
        for gpu in shard.gpus:
            cap = sleepers_per_card(memory.get(gpu, 0))
            if cap < 1:
                return None
            here = [s for s in by_value if _on(s, shard.node, gpu) and s.id not in stop]
            stop.extend(s.id for s in here[: max(0, len(here) + 1 - cap)])
    level = _level(spec, r, by_value, stop, nodes, specs)
    if level is None:
        return None
    return SleepRoom(level=level[0], stop=tuple(stop + [s for s in level[1] if s not in stop]))


def _level(
    spec: ModelSpec,
    r: Replica,
    sleepers: list[Replica],
    stopping: Collection[str],
    nodes: Mapping[str, Node],
    specs: Mapping[str, ModelSpec],
) -> tuple[int, list[str]] | None:
    """(level, level-1 sleepers to stop for host memory), or None when level 1 is
    demanded and cannot fit."""
    need = weights_mib_per_node(spec)
    if spec.sleep_level == 2:
        return 2, []
    extra: list[str] = []
    fits = need is not None
    for name in {s.node for s in r.shards}:
        node = nodes.get(name)
        if need is None or node is None or node.host_memory_mib is None:
            fits = False
            break
        budget = node.host_memory_mib * HOST_SHARE - need
        here = [
            s
            for s in sleepers
            if s.sleep_level == 1 and s.id not in stopping and any(x.node == name for x in s.shards)
        ]
        used = sum(_host_mib(s, specs) for s in here)
        if used <= budget:
            continue
        if spec.sleep_level is None:
            fits = False  # level 2 instead of stopping anyone
            break
        for s in here:  # least valuable first
            extra.append(s.id)
            used -= _host_mib(s, specs)
            if used <= budget:
                break
        if used > budget:
            return None
    if spec.sleep_level == 1:
        return (1, extra) if fits else None
    return (1, []) if fits else (2, [])


def _host_mib(s: Replica, specs: Mapping[str, ModelSpec]) -> float:
    spec = specs.get(s.model)
    got = weights_mib_per_node(spec) if spec is not None else None
    return 0.0 if got is None else got


def _on(r: Replica, node: str, gpu: int) -> bool:
    return any(s.node == node and gpu in s.gpus for s in r.shards)


def _value(r: Replica, specs: Mapping[str, ModelSpec]) -> tuple[int, float, str]:
    """Sort key, least valuable sleeper first: lower priority, asleep longest."""
    spec = specs.get(r.model)
    return (spec.priority if spec is not None else 0, r.state_since, r.id)


@dataclass(frozen=True, slots=True)
class WakePlan:
    """One sleeping replica of a model to wake, and what stands in its way."""

    replica: str
    # Awake replicas on its cards to put to sleep (or stop) first: a swap.
    evict: tuple[str, ...] = ()
    # Its cards are still being given back (earlier victims falling asleep or
    # draining): it wakes once they have (its agent waits for them).
    wait: bool = False
    why: str = ""
    # Replicas in use on its cards that move instead (module docstring, "Moves"): each
    # sleeps here while a sleeper of its own model wakes elsewhere (`moves`).
    moved: tuple[str, ...] = ()
    moves: tuple[WakePlan, ...] = ()
    # Another model's sleeper is waking on its cards: hold, neither wake nor start
    # one cold; once that one is awake it may be swapped out or moved (seconds,
    # where a cold start takes a minute or more).
    hold: bool = False
    # The sleeper is itself still falling asleep (a shard still reported running):
    # it wakes once its agent reports it asleep, neither now nor cold elsewhere.
    # Woken now, the shard's `ready` would read as awake and routers would send to
    # an engine whose sleep is still under way (module docstring, "Falling asleep").
    settling: bool = False


def plan_wake(
    spec: ModelSpec,
    state: FleetState,
    idle: IdleFor | IdleSource,
    free: FreeMap,
    *,
    now: float,
    heartbeat_timeout_s: float,
    exclude: Collection[str] = (),
    holders: Mapping[tuple[str, int], Iterable[Replica]] | None = None,
    pool: CandidatePool | None = None,
) -> WakePlan | None:
    """The sleeper of `spec` to wake and what must make way; None when none can wake.

    `exclude`: replicas already leaving this tick (as eviction's). `holders`:
    (node, GPU) → replicas holding that card, when the caller has it. `pool`: the
    candidates worked out for the tick (eviction.CandidatePool), when it has them.
    """
    mine = _sleeping(state, spec.name, pool)
    if not mine:
        return None
    held = holders if holders is not None else card_holders(state.replicas.values())
    idle_now = idle_fn(idle, now=now)

    def candidates(of: ModelSpec) -> dict[str, Candidate]:
        found = (
            idle_candidates(of, state, idle_now, now, heartbeat_timeout_s, exclude)
            if pool is None
            else pool.candidates(of, busy_ok=True)
        )
        return {c.replica.id: c for c in found}

    cands = candidates(spec)
    spare = _spare(state, exclude) if pool is None else pool.spare
    their: dict[str, dict[str, Candidate]] = {}

    def move(h: Replica, away_from: set[tuple[str, int]]) -> WakePlan | None:
        """A wake of a sleeper of `h`'s model off `away_from`, so `h` may move there."""
        m = state.models.get(h.model)
        if m is None or not m.spec.sleep_mode or m.spec.priority > spec.priority:
            return None
        if h.model not in their:
            their[h.model] = candidates(m.spec)
        others = [s for s in _sleeping(state, h.model, pool) if not (_cards(s) & away_from)]
        for s in sorted(others, key=lambda s: (-s.state_since, s.id)):
            p = _wake_one(s, free, held, their[h.model], spare, exclude, state, None)
            if p is not None and not (p.wait or p.hold or p.settling) and h.id not in p.evict:
                return p
        return None

    best: tuple[tuple[bool, int, int, int, float, str], WakePlan] | None = None
    for r in mine:
        plan = _wake_one(r, free, held, cands, spare, exclude, state, move)
        if plan is None:
            continue
        worst = max((cands[v].priority for v in plan.evict if v in cands), default=-(2**31))
        size = len(plan.evict) + (1 if plan.wait or plan.settling else 0)
        key = (plan.hold, len(plan.moved), size, worst, -r.state_since, r.id)
        if best is None or key < best[0]:
            best = (key, plan)
    return None if best is None else best[1]


def _sleeping(state: FleetState, model: str, pool: CandidatePool | None) -> Sequence[Replica]:
    if pool is not None:
        return pool.sleeping(model)
    return [r for r in state.replicas.values() if r.model == model and r.state == _SLEEPING]


def _cards(r: Replica) -> set[tuple[str, int]]:
    return {(s.node, g) for s in r.shards for g in s.gpus}


def _wake_one(
    r: Replica,
    free: FreeMap,
    held: Mapping[tuple[str, int], Iterable[Replica]],
    cands: Mapping[str, Candidate],
    spare: Mapping[str, int],
    leaving: Collection[str],
    state: FleetState,
    move: Callable[[Replica, set[tuple[str, int]]], WakePlan | None] | None,
) -> WakePlan | None:
    victims: list[str] = []
    moved: list[str] = []
    moves: list[WakePlan] = []
    wait = False
    hold = False
    # Victims taken per model by this plan, against `spare` (which is shared and
    # not changed: a copy per sleeper would walk every model).
    gone: Counter[str] = Counter()
    settling = falling_asleep(r)
    for shard in r.shards:
        if shard.node not in free:
            return None  # node not placeable (cordoned, draining, unreachable)
        free_here = free.free_gpus(shard.node)
        for gpu in shard.gpus:
            if gpu in free_here:
                continue
            others = [h for h in held.get((shard.node, gpu), ()) if h.id != r.id]
            if not others:
                if settling and _on(r, shard.node, gpu):
                    continue  # held by its own engine, still falling asleep
                return None  # unhealthy, or held for another model's reservation
            for h in others:
                if h.id in victims or h.id in moved:
                    continue
                if h.id in leaving or h.state in ("draining", "stopped", "failed", _SLEEPING):
                    wait = True  # being given back already
                elif h.state == "waking":
                    hold = True
                elif h.state == "ready" and h.id in cands and spare.get(h.model, 0) > gone[h.model]:
                    gone[h.model] += 1
                    victims.append(h.id)
                elif h.state == "ready" and move is not None:
                    there = move(h, _cards(r))
                    taken = {v for p in moves for v in (p.replica, *p.evict)}
                    if there is None or taken & {there.replica, *there.evict}:
                        return None
                    moved.append(h.id)
                    moves.append(there)
                else:
                    return None
    if set(victims) & {v for p in moves for v in (p.replica, *p.evict)}:
        return None
    if hold:
        return WakePlan(replica=r.id, hold=True, why=f"{r.id}'s cards are being woken for another")
    if settling:
        # What else stands in its way is dealt with once it is asleep (a tick later).
        return WakePlan(replica=r.id, settling=True, why=f"{r.id} wakes once asleep")
    why = f"waking {r.id}"
    if victims:
        why += f": {', '.join(sorted(victims))} make way (idle past their timeout)"
    if moved:
        why += "; in use, moving: " + ", ".join(
            f"{h} (its sleeper {p.replica} wakes)" for h, p in zip(moved, moves, strict=True)
        )
    return WakePlan(
        replica=r.id,
        evict=tuple(victims),
        wait=wait and not victims and not moved,
        why=why,
        moved=tuple(moved),
        moves=tuple(moves),
    )


def falling_asleep(r: Replica) -> bool:
    """A sleeping replica whose engine has not fallen asleep yet (a shard still running)."""
    return r.state == _SLEEPING and any(s.state in SHARD_RUNNING for s in r.shards)


def _spare(state: FleetState, leaving: Collection[str]) -> Counter[str]:
    ready = Counter(
        r.model for r in state.replicas.values() if r.state == "ready" and r.id not in leaving
    )
    return Counter({name: ready[name] - m.spec.min_replicas for name, m in state.models.items()})


def card_holders(replicas: Iterable[Replica]) -> dict[tuple[str, int], list[Replica]]:
    """(node, GPU) → the replicas holding that card (records.Replica.holds_gpus)."""
    out: dict[tuple[str, int], list[Replica]] = {}
    for r in replicas:
        if not r.holds_gpus:
            continue
        for s in r.shards:
            for g in s.gpus:
                out.setdefault((s.node, g), []).append(r)
    return out
