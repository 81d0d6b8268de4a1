"""Swaps: a tick's sleeps and wakes, written into its batch (wakes.py decides them).

Where a replica used to be drained (evicted for another model, surplus), one
whose spec allows it sleeps instead when its cards' memory, and for level 1
its node's host memory, allow (`sleep_or_drain`); sleepers in the way of that
memory stop first. Where a model needs one more replica, one of its sleepers
is woken rather than a new one started (`try_wake`), after the awake replicas
on its cards have been put to sleep (or stopped) by eviction's rules, in the same
tick: its agent wakes it once they are asleep.
"""

from __future__ import annotations

import dataclasses
from enum import Enum

from llmgw.controller.fleet.records import Replica
from llmgw.controller.placement.rules import FreeMap, Placement, ShardPlacement
from llmgw.controller.placement.wakes import WakePlan, plan_wake, sleep_room
from llmgw.controller.tick.context import TickContext
from llmgw.wire.models import ModelSpec


class Woke(Enum):
    """What `try_wake` did for a model that needs a replica."""

    NONE = "none"  # no sleeper can wake: place one as before
    WOKEN = "woken"  # a sleeper wakes once what was in its way has left; cards taken
    # Its sleeper's cards are waking for another model, or the sleeper is itself
    # still falling asleep: neither wake nor place now; a later tick wakes it.
    HOLDING = "holding"


def sleep_or_drain(t: TickContext, r: Replica, reason: str, *, kind: str | None = None) -> Replica:
    """`r` leaves service: asleep where its spec and memory allow, else drained."""
    batch = t.batch
    model = batch.model(r.model)
    if r.state != "ready" or model is None or not model.spec.sleep_mode:
        return batch.drain(r, reason, grace_s=t.config.drain_grace_s, kind=kind)
    replicas = current_replicas(t)
    specs = {name: m.spec for name, m in batch.base.models.items()}
    room = sleep_room(r, model.spec, replicas, batch.base.nodes, specs)
    if room is None:
        why = f"{reason}; no room to sleep (GPU or host memory), stopped instead"
        return batch.drain(r, why, grace_s=t.config.drain_grace_s, kind=kind)
    for rid in room.stop:
        s = replicas.get(rid)
        if s is not None and s.state == "sleeping":
            batch.stop(s, f"stopped asleep: its memory is needed for {r.id} ({r.model}) to sleep")
    return batch.sleep(r, room.level, f"{reason}; sleeps at level {room.level}", kind=kind)


def current_replicas(t: TickContext) -> dict[str, Replica]:
    """The replicas as this tick sees them: its start, with its own changes over it."""
    out = dict(t.batch.base.replicas)
    for r in t.batch.changes.replicas:
        out[r.id] = r
    return out


def try_wake(t: TickContext, spec: ModelSpec, free: FreeMap) -> Woke:
    """Wake a sleeper of `spec` if one can wake, swapping out what is in its way."""
    batch, mem, cfg = t.batch, t.memory, t.config
    plan = plan_wake(
        spec,
        batch.base,
        t.usage,
        free,
        now=batch.now,
        heartbeat_timeout_s=cfg.heartbeat_timeout_s,
        exclude=t.view.leaving(),
        # Who holds each card with this tick's changes: a card another model's sleeper
        # was woken onto earlier in this tick is held by it, not up for a second wake
        # (two engines waking on one card would each wait for the other forever).
        holders=t.view.holders(),
        pool=t.view.pool(),
    )
    if plan is None:
        return Woke.NONE
    sleeper = batch.replica(plan.replica)
    if sleeper is None or sleeper.state != "sleeping":
        return Woke.NONE
    if plan.hold or plan.settling:
        return Woke.HOLDING
    for sub_plan in plan.moves:
        # The replicas in use on its cards move: their own sleepers wake elsewhere.
        other = batch.replica(sub_plan.replica)
        if other is None or other.state != "sleeping":
            return Woke.NONE
    for rid in plan.moved:
        h = batch.replica(rid)
        if h is not None and h.state == "ready":
            why = f"moved for {spec.name}: {plan.why}"
            sleep_or_drain(t, h, why, kind="replica.moved")
    for sub_plan in plan.moves:
        other = batch.replica(sub_plan.replica)
        if other is not None:
            _wake(t, other, sub_plan, free)
    _wake(t, sleeper, plan, free)
    mem.evicting.pop(spec.name, None)
    return Woke.WOKEN


def _wake(t: TickContext, sleeper: Replica, plan: WakePlan, free: FreeMap) -> None:
    """Swap out `plan`'s victims and wake `sleeper`, in this one tick."""
    batch = t.batch
    for rid in plan.evict:
        victim = batch.replica(rid)
        if victim is None or victim.state != "ready":
            continue
        why = f"swapped out for {sleeper.model}: {plan.why}"
        sleep_or_drain(t, victim, why, kind="replica.evicted")
        lower_desired(t, victim.model)
    # Woken in the same tick as its victims leave: its agent wakes it once no other
    # engine is awake on its cards (agent/sleeping.py), a round trip sooner than
    # waiting here for the victims to be reported asleep. Its cards are its own
    # from now on (waking holds them), so nothing else is placed there meanwhile.
    for s in sleeper.shards:
        here = free.free_gpus(s.node) if s.node in free else frozenset()
        gpus = tuple(g for g in s.gpus if g in here)
        if gpus:
            shard = ShardPlacement(node=s.node, rank=s.rank, gpus=gpus)
            free.take(Placement(model=sleeper.model, shards=(shard,), pool=sleeper.pool))
    batch.wake(sleeper, plan.why)


def lower_desired(t: TickContext, name: str) -> None:
    """An evicted replica was idle past its timeout: its model wants one fewer now.

    Otherwise the model would re-place it at once, into the very room the
    eviction made; it comes back on demand (routers report held requests).
    """
    batch = t.batch
    m = batch.model(name)
    if m is None or m.desired_replicas <= m.spec.min_replicas:
        return
    batch.put_model(dataclasses.replace(m, desired_replicas=m.desired_replicas - 1))
    msg = f"desired {m.desired_replicas} → {m.desired_replicas - 1} (an idle replica was evicted)"
    batch.event("model.scaled", "model", name, msg, model=name)
    t.memory.last_scaled_at[name] = batch.now
