"""Relocation: a sleeper whose wakes keep waiting on a slow swap gets a new home.

Clearing ahead (clearing.py) spares a wake its swap only when the replica awake
on the sleeper's cards is idle and wakes no faster. A rarely used model asleep
under a large one that is in use nearly all the time (a 70 GB sleeper under a
235B) still waits, each time it is asked for, for the 235B's sleep (about 6 s)
before its own wake. Which pairs are slow is a matter of demand, not of sizes
alone (a slow pair never asked for costs nothing), so the controller learns it
from the wakes it ordered.

Learning. Each wake is timed from its order to its replica reported ready. One
onto free cards is plain, and the longest plain wake seen so far is the bound
(the fleet's slowest model waking with nothing in its way). One that first
waited for other replicas to leave its cards (a swap) and took longer than the
bound plus SLOW_MARGIN_S is slow. A sleeper whose wakes were slow SLOW_SWAPS
times within REPEAT_WINDOW_S is moved: once could be a pairing that does not
recur; twice is demand behind a swap that will come again.

Moving. The sleeper's replacement is started on cards where its wakes will be
fast: cards no awake engine holds (never a replica in use, nothing evicted),
whose sleepers each either sleep fast enough that a swap with it (their sleep,
taken as long as their level-1 wake estimate, then this model's wake) costs no
more than the slowest level-1 wake estimate among the specs plus the fastest (a
large model waking behind a small one's sleep, where a large model's sleep
before a medium one's wake costs more), or were not used for QUIET_S; with room
for one more sleeper there without stopping any (wakes.py: memory), at the old
sleeper's level or a faster one. Of those cards, the ones whose sleepers were
used least recently. Once the new replica is ready and nothing is in flight on
it, it sleeps there and the old sleeper stops.

Until then it is no replica of its model's (wakes.relocating): not counted, so
a request for the model wakes the old sleeper instead of waiting for the start
(the new one then replaces it make-before-break, as a move would); never
restarted; and a wake of another model's sleeper that wants its cards stops it
(a stop takes seconds, its start a minute), so it never makes another model
start cold. At most one at a time in the fleet, one completed per model per
EVERY_S, only for a model with no replica awake or on its way, and only for a
model on one node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from llmgw.controller.fleet.endpoints import wake_estimate_s
from llmgw.controller.fleet.records import Model, Node, Replica, Shard
from llmgw.controller.idle import idle_fn
from llmgw.controller.placement.rules import FreeMap, Placement, ShardPlacement, free_map, place
from llmgw.controller.placement.swaps import current_replicas
from llmgw.controller.placement.wakes import (
    card_holders,
    falling_asleep,
    relocating,
    sleep_room,
    sleepers_per_card,
)
from llmgw.controller.tick.context import TickContext
from llmgw.wire.models import ModelSpec

# Over the bound, a swap's wake is slow: the control loop's own delays (a tick,
# heartbeats) vary by about a second from wake to wake.
SLOW_MARGIN_S = 1.0
# Slow wakes of one sleeper, within REPEAT_WINDOW_S, that move it (variant: one).
SLOW_SWAPS = 1
REPEAT_WINDOW_S = 3600.0
# A model's sleeper is relocated at most once in this long: each costs a cold
# start, and a relocation repeated while demand shifts would chase it. One given
# up (its cards wanted meanwhile) does not count; trying again takes SLOW_SWAPS
# slow wakes more.
EVERY_S = 3600.0
# A sleeper unused this long is no neighbour to fear, however slow its sleep.
QUIET_S = 1800.0
# Found no cards for a model due one: looked for again this much later.
RETRY_S = 60.0

Card = tuple[str, int]


def relocate(t: TickContext) -> None:
    """Learn from the wakes that ended, advance the relocation under way, or start one."""
    _observe(t)
    if not _advance(t):
        _start(t)


def _observe(t: TickContext) -> None:
    """Time the wakes ordered earlier whose replica is ready now (module docstring)."""
    batch, mem = t.batch, t.memory
    now = batch.now
    for rid, seen in sorted(mem.waking.items()):
        # As reported (the tick's start): this tick may already have put it back to sleep.
        r = batch.base.replicas.get(rid)
        if seen.at >= now or (r is not None and r.state == "waking"):
            continue  # ordered this very tick, or still under way
        del mem.waking[rid]
        if r is None or r.state != "ready":
            continue  # stopped or failed on the way: nothing to learn
        took = r.state_since - seen.at
        if not seen.swap:
            mem.plain_wake_s = took if mem.plain_wake_s is None else max(mem.plain_wake_s, took)
        elif mem.plain_wake_s is not None and took > mem.plain_wake_s + SLOW_MARGIN_S:
            mem.slow_swaps[rid] = (*_recent(mem.slow_swaps.get(rid, ()), now), now)


def _recent(times: tuple[float, ...], now: float) -> tuple[float, ...]:
    return tuple(at for at in times if now - at <= REPEAT_WINDOW_S)


def _advance(t: TickContext) -> bool:
    """Settle the relocation under way; True while one still is."""
    batch = t.batch
    busy = False
    for state in ("pending", "starting", "ready", "failed"):
        for rid in sorted(t.index.in_state(state)):
            r = batch.replica(rid)
            old = None if r is None else relocating(r, batch.replica)
            if r is None or old is None:
                continue
            if r.state == "failed":
                batch.stop(r, f"relocation of {old.id} failed; it stays asleep where it is")
            elif r.state == "ready":
                busy = not _settle(t, r, old) or busy
            else:
                busy = True
    return busy


def _settle(t: TickContext, new: Replica, old: Replica) -> bool:
    """`new` is ready: it sleeps where it is and `old` stops. False: not yet."""
    batch = t.batch
    if batch.touched(old.id) or falling_asleep(old):
        return False
    inflight = t.usage.inflight(new.id)
    if inflight is not None and inflight > 0:
        return False  # a router found it ready: it sleeps once that is answered
    model = batch.model(new.model)
    if model is None:
        return False
    specs = {name: m.spec for name, m in batch.base.models.items()}
    others = {rid: r for rid, r in current_replicas(t).items() if rid != old.id}
    room = sleep_room(new, model.spec, others, batch.base.nodes, specs)
    if room is None or room.stop or room.level > (old.sleep_level or 2):
        # Its cards filled up while it started: stopping another sleeper for it
        # would trade one model's fast wake for another's cold start.
        why = f"relocation of {old.id} given up: no room to sleep there any more"
        batch.drain(new, why, grace_s=t.config.drain_grace_s)
        return True
    where = _where(new.shards)
    t.memory.relocated_at[new.model] = batch.now
    batch.stop(old, f"relocated: {new.id} sleeps in its place on {where}")
    new = batch.update(new, replaces=None)
    batch.sleep(new, room.level, f"relocated from {old.id}; sleeps at level {room.level}")
    return True


def _start(t: TickContext) -> None:
    """Start a relocation for the sleeper most often slow, when one is due and fits."""
    batch, mem = t.batch, t.memory
    now = batch.now
    if mem.relocation_tried_at is not None and now - mem.relocation_tried_at < RETRY_S:
        return
    due = {
        rid: len(recent)
        for rid, times in mem.slow_swaps.items()
        if len(recent := _recent(times, now)) >= SLOW_SWAPS
    }
    if not due:
        return
    for rid in sorted(due, key=lambda r: (-due[r], r)):
        old = batch.replica(rid)
        if old is None or old.state in ("stopped", "failed"):
            del mem.slow_swaps[rid]  # gone: nothing left to move
            continue
        m = batch.model(old.model)
        if m is None or now - mem.relocated_at.get(m.name, -math.inf) < EVERY_S:
            continue
        if not _movable(t, m, old):
            continue
        p = _destination(t, m.spec, old)
        if p is None:
            continue
        _create(t, m, old, p)
        # Another try needs as many slow wakes again, whatever becomes of this one.
        del mem.slow_swaps[rid]
        mem.relocation_tried_at = None
        return
    mem.relocation_tried_at = now


def _movable(t: TickContext, m: Model, old: Replica) -> bool:
    """Whether `old` may move: fully asleep, untouched this tick, on one node, and its
    model has no replica awake or on its way (only sleepers, or ones stopped)."""
    spec = m.spec
    batch = t.batch
    if (
        not spec.sleep_mode
        or spec.nodes != 1
        or old.state != "sleeping"
        or falling_asleep(old)
        or batch.touched(old.id)
    ):
        return False
    for rid in t.index.of_model(m.name):
        r = batch.replica(rid)
        if r is not None and r.state not in ("sleeping", "stopped"):
            return False
    return True


def _destination(t: TickContext, spec: ModelSpec, old: Replica) -> Placement | None:
    """Where `old`'s replacement may start (module docstring, "Moving"); None: nowhere."""
    batch, cfg = t.batch, t.config
    specs = {name: m.spec for name, m in batch.base.models.items()}
    level = old.sleep_level or 2
    own = wake_estimate_s(spec, level)
    ests = [
        est for s in specs.values() if s.sleep_mode and (est := wake_estimate_s(s, 1)) is not None
    ]
    if own is None or not ests:
        return None
    bound = max(ests) + min(ests)
    current = current_replicas(t)
    held = card_holders(current.values())
    asleep: dict[Card, list[Replica]] = {}
    for r in current.values():
        if r.state == "sleeping" and r.id != old.id:
            for s in r.shards:
                for g in s.gpus:
                    asleep.setdefault((s.node, g), []).append(r)
    mine = {(s.node, g) for s in old.shards for g in s.gpus}
    free = free_map(batch.base, now=batch.now, heartbeat_timeout_s=cfg.heartbeat_timeout_s)
    idle = idle_fn(t.usage, now=batch.now)
    quiet: dict[Card, float] = {}
    for name in free.nodes:
        node = batch.node(name)
        memory = {} if node is None else {g.index: g.memory_mib for g in node.gpus}
        bad: list[int] = []
        for g in sorted(free.free_gpus(name)):
            here = asleep.get((name, g), [])
            if (
                (name, g) in mine
                or held.get((name, g))
                or len(here) + 1 > sleepers_per_card(memory.get(g, 0))
                or not all(
                    _swaps_fast(s, specs, own, bound) or (idle(s.id) or 0.0) >= QUIET_S
                    for s in here
                )
            ):
                bad.append(g)
            else:
                # Unknown is never idle (a sleeper no router has reported may be wanted).
                quiet[(name, g)] = min((idle(s.id) or 0.0 for s in here), default=math.inf)
        _take(free, name, bad)
    p = _quietest(spec, batch.base.nodes, free, quiet)
    if p is None:
        return None
    there = Replica(
        id="",
        model=spec.name,
        state="ready",
        shards=tuple(Shard(node=s.node, rank=s.rank, gpus=s.gpus) for s in p.shards),
        created_at=batch.now,
        state_since=batch.now,
        updated_at=batch.now,
    )
    others = {rid: r for rid, r in current.items() if rid != old.id}
    room = sleep_room(there, spec, others, batch.base.nodes, specs)
    if room is None or room.stop or room.level > level:
        return None
    return p


def _quietest(
    spec: ModelSpec, nodes: Mapping[str, Node], free: FreeMap, quiet: Mapping[Card, float]
) -> Placement | None:
    """A placement on `free` whose cards' sleepers were used least recently (the least
    likely to be wanted while it starts, which would give it up): the largest q such
    that the cards quiet for q or longer still fit it (fewer cards never fit better)."""
    levels = sorted(set(quiet.values()))
    best: Placement | None = None
    lo, hi = 0, len(levels) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        left = free.copy()
        for (name, g), q in quiet.items():
            if q < levels[mid]:
                _take(left, name, [g])
        p = place(spec, nodes, left)
        if isinstance(p, Placement):
            best, lo = p, mid + 1
        else:
            hi = mid - 1
    return best


def _swaps_fast(s: Replica, specs: Mapping[str, ModelSpec], own: float, bound: float) -> bool:
    """Whether a wake here costs no more than `bound` with `s` awake in the way."""
    spec = specs.get(s.model)
    sleep_s = None if spec is None else wake_estimate_s(spec, 1)
    return sleep_s is not None and sleep_s + own <= bound


def _take(free: FreeMap, node: str, gpus: list[int]) -> None:
    if gpus:
        shard = ShardPlacement(node=node, rank=0, gpus=tuple(gpus))
        free.take(Placement(model="", shards=(shard,), pool=""))


def _create(t: TickContext, m: Model, old: Replica, p: Placement) -> None:
    batch = t.batch
    now = batch.now
    shards = tuple(Shard(node=s.node, rank=s.rank, gpus=s.gpus) for s in p.shards)
    why = f"relocating {old.id} (its wakes waited on slow swaps) to {_where(p.shards)}"
    new = Replica(
        id=batch.new_id(),
        model=m.name,
        state="pending",
        shards=shards,
        created_at=now,
        state_since=now,
        updated_at=now,
        reason=why,
        pool=p.pool,
        weight=old.weight if old.pool == p.pool else 1.0,
        replaces=old.id,
    )
    batch.put_replica(new)
    batch.event("replica.placed", "replica", new.id, why, model=m.name)


def _where(shards: tuple[Shard, ...] | tuple[ShardPlacement, ...]) -> str:
    return "; ".join(f"{s.node} GPUs {','.join(map(str, s.gpus))}" for s in shards)
