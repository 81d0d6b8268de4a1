"""Turning the tick's placement requests into pending replicas, or reasons.

One free map per tick, built only when something needs placing (a steady
fleet never builds one), and every placement taken from it at once, so two
requests in one tick can never be given the same card. It is built from the
state the tick started with: GPUs released during this tick still count as
used until the next one, which can delay a placement by a tick but never
double-book a card.

When a model cannot be placed, known-idle replicas may be evicted for it
(eviction.py chooses; never unknown idleness, never below a model's min). The
evicted replicas drain; while they still hold their cards the model evicts
nothing more, and it is placed first on later ticks, so the room it made is
the room it gets.

A node drained with `evict_idle` does the same for a serving replica whose
replacement does not fit: known-idle replicas of other models are evicted,
by the same rules, and the room is held for the replacement (a reservation
under the replica's model). Eviction is tried before `force` drops capacity.

When eviction finds nothing and the model's shortfall is fragmentation, the
fewest ready replicas are moved instead (compaction.py chooses): each gets a
replacement now, off the model's room (`Request(replaces=...)`, the same move a
drain makes), and the room is held under the model as for an eviction, with the
moved replicas as its victims, until they have drained. Room whose replica serves
on with no replacement on its way (the replacement failed) is released
(`_end_stalled`), so no card is held for nobody.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from llmgw.controller.fleet.batch import LIVE, draining_nodes, node_drain_grace
from llmgw.controller.fleet.records import (
    HOLDS_GPUS,
    SHARD_RUNNING,
    Model,
    Node,
    Replica,
    Reservation,
    Shard,
)
from llmgw.controller.placement.compaction import fragmented, plan_compaction
from llmgw.controller.placement.compaction import why as compaction_why
from llmgw.controller.placement.eviction import idle_enough_in, plan_eviction
from llmgw.controller.placement.rendezvous import pick_master_port
from llmgw.controller.placement.rules import (
    FreeMap,
    Placement,
    ShardPlacement,
    Unplaceable,
    free_map,
    place,
)
from llmgw.controller.placement.swaps import Woke, lower_desired, sleep_or_drain, try_wake
from llmgw.controller.tick.carryover import TickMemory
from llmgw.controller.tick.context import TickContext
from llmgw.controller.tick.moves import making_room


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One replica to place: missing (neither set), a restart, or a make-before-break move."""

    model: Model
    restart: Replica | None = None
    replaces: Replica | None = None
    # Why `replaces` must move (tick/moves.py), for the placement event.
    why: str = ""

    @property
    def order(self) -> int:
        # Within a model: fill what is missing, then restart, then moves.
        return 0 if self.restart is None and self.replaces is None else (1 if self.restart else 2)


def place_requests(t: TickContext, requests: list[Request]) -> None:
    batch, mem, cfg = t.batch, t.memory, t.config
    failed: set[str] = set()
    waiting: set[str] = set()
    # A reservation lasts while its model still asks for a replica (not deleted,
    # not scaled down meanwhile); otherwise its cards would be held for nobody.
    wanted = {q.model.name for q in requests}
    for name in [n for n in mem.evicting if n not in wanted]:
        del mem.evicting[name]
    _end_stalled(t)
    # Replicas already moving this tick: compaction never moves them a second time.
    moving = {q.replaces.id for q in requests if q.replaces is not None}
    if requests:
        requests.sort(
            key=lambda q: (
                q.model.name not in mem.evicting,
                -q.model.spec.priority,
                q.model.name,
                q.order,
            )
        )
        free = free_map(batch.base, now=batch.now, heartbeat_timeout_s=cfg.heartbeat_timeout_s)
        held = _hold_reservations(free, mem)
        ports: dict[str, set[int]] = {}
        for q in requests:
            name = q.model.name
            if name in failed:
                # One reason per model per tick is enough; a move it blocks still counts.
                if q.replaces is not None:
                    _blocked_move(t, q, mem.unplaceable[name], waiting, free, held)
                continue
            mine = held.pop(name, [])
            for node, gpus in mine:
                free.release(node, gpus)  # its own room, held for it until now
            # A sleeper of the model wakes rather than a new replica starting.
            new = q.restart is None and q.replaces is None
            if new and try_wake(t, q.model.spec, free) is not Woke.NONE:
                mem.unplaceable.pop(name, None)
                continue
            result = place(q.model.spec, batch.base.nodes, free)
            if isinstance(result, Placement):
                free.take(result)
                _create(t, q, result, ports)
                mem.evicting.pop(name, None)
                continue
            for node, gpus in mine:
                # Not enough yet (victims still draining): keep holding what is free.
                _take(free, name, node, gpus)
                held.setdefault(name, []).append((node, gpus))
            failed.add(name)
            _unplaceable(t, result)
            if q.replaces is not None:
                _blocked_move(t, q, result, waiting, free, held)
            elif not result.lasting:
                # (A lasting failure: no eviction could make room, so none is planned:
                # each plan walks every replica, once per such model and tick.)
                res = _maybe_evict(t, q.model, free)
                if res is None and name not in mem.evicting:
                    res = _maybe_compact(t, q.model, result, free, ports, moving)
                if res is not None:
                    # The part of its room that is already free is held from now on.
                    _hold(free, name, res, held)
                elif name not in mem.evicting:
                    _idle_eta(t, q.model, free)
    for name in list(mem.unplaceable):
        if name not in failed:
            del mem.unplaceable[name]
    for name in list(mem.idle_eta_checked):
        if name not in failed or name in mem.evicting:
            del mem.idle_eta_checked[name]
            mem.idle_enough_at.pop(name, None)
    for name in list(mem.compaction_failed):
        if name not in failed:
            del mem.compaction_failed[name]
    for rid in list(mem.drain_waiting):
        if rid not in waiting:
            del mem.drain_waiting[rid]


Held = dict[str, list[tuple[str, tuple[int, ...]]]]


def _hold_reservations(free: FreeMap, mem: TickMemory) -> Held:
    """Take every reserved card that is free now out of `free`, per reserving model."""
    held: Held = {}
    for model, res in mem.evicting.items():
        _hold(free, model, res, held)
    return held


def _hold(free: FreeMap, model: str, res: Reservation, held: Held) -> None:
    for node, gpus in res.gpus:
        now_free = free.take_free(node, gpus)
        if now_free:
            held.setdefault(model, []).append((node, now_free))


def _take(free: FreeMap, model: str, node: str, gpus: tuple[int, ...]) -> None:
    shard = ShardPlacement(node=node, rank=0, gpus=gpus)
    free.take(Placement(model=model, shards=(shard,), pool=""))


def _create(t: TickContext, q: Request, p: Placement, ports: dict[str, set[int]]) -> None:
    batch = t.batch
    now = batch.now
    shards = tuple(Shard(node=s.node, rank=s.rank, gpus=s.gpus) for s in p.shards)
    master_port = (
        pick_master_port(batch, t.index, p.shards[0].node, ports) if len(shards) > 1 else None
    )
    where = "; ".join(f"{s.node} GPUs {','.join(map(str, s.gpus))}" for s in p.shards)
    prior = q.restart or q.replaces
    restarts = q.restart.restarts + 1 if q.restart is not None else 0
    if q.restart is not None:
        why = f"restart {restarts} of {q.restart.id} on {where}"
        replaces = q.restart.replaces
    elif q.replaces is not None:
        why = f"replacing {q.replaces.id} ({q.why}) on {where}"
        replaces = q.replaces.id
    else:
        why = f"placed on {where}"
        replaces = None
    new = Replica(
        id=batch.new_id(),
        model=q.model.name,
        state="pending",
        shards=shards,
        created_at=now,
        state_since=now,
        updated_at=now,
        reason=why,
        restarts=restarts,
        pool=p.pool,
        # A capacity measured on the same kind of hardware still holds.
        weight=prior.weight if prior is not None and prior.pool == p.pool else 1.0,
        replaces=replaces,
        master_port=master_port,
    )
    batch.put_replica(new)
    batch.event("replica.placed", "replica", new.id, why, model=new.model)
    if q.restart is not None:
        batch.stop(q.restart, f"restarted as {new.id}")


def _blocked_move(
    t: TickContext, q: Request, u: Unplaceable, waiting: set[str], free: FreeMap, held: Held
) -> None:
    """No replacement fits for a serving replica that must move (`q.replaces`).

    On a node drained with evict_idle, known-idle replicas of other models are
    evicted for the replacement when that makes it fit; the replica keeps
    serving meanwhile. Otherwise, on a node drained with force it drains anyway:
    the operator chose the node over the capacity. Otherwise it keeps serving
    (make-before-break never drops capacity silently) and the drain says, once
    per reason, what it waits for. A spec rollover that does not fit just
    waits; the model's own event says why.
    """
    batch = t.batch
    r = q.replaces
    assert r is not None
    nodes = draining_nodes(batch, r)
    if not nodes:
        return
    names = ", ".join(n.name for n in nodes)
    if any(n.drain_evict_idle for n in nodes):
        making = _evict_for_move(t, q, names, free, held)
        if making is not None:
            _announce_wait(t, r, nodes, making, waiting)
            return
    if any(n.drain_force for n in nodes):
        grace = node_drain_grace(batch, r, default_s=t.config.drain_grace_s)
        why = f"node {names} drain forced: no replacement fits ({u.reason}); capacity drops"
        batch.drain(r, why, grace_s=grace, kind="replica.drain_forced")
        for n in nodes:
            msg = f"{r.id} ({r.model}) drains without a replacement: {u.reason}"
            batch.event("node.drain_forced", "node", n.name, msg, model=r.model)
        return
    hint = (
        "nothing idle can be evicted for it"
        if any(n.drain_evict_idle for n in nodes)
        else "drain with force to move it anyway"
    )
    why = f"no replacement fits: {u.reason}; it keeps serving ({hint})"
    _announce_wait(t, r, nodes, why, waiting)


def _announce_wait(
    t: TickContext, r: Replica, nodes: list[Node], why: str, waiting: set[str]
) -> None:
    """The drain waits for `r`: said once per reason (a node event per draining node)."""
    batch, mem = t.batch, t.memory
    waiting.add(r.id)
    if mem.drain_waiting.get(r.id) == why:
        return
    mem.drain_waiting[r.id] = why
    for n in nodes:
        msg = f"waiting for {r.id} ({r.model}): {why}"
        batch.event("node.drain_waiting", "node", n.name, msg, model=r.model)


def making_room_text(victims: Collection[str]) -> str:
    """What a drain waits for while idle replicas are evicted for a replacement."""
    return (
        f"making room: evicting idle {', '.join(sorted(victims))} for its replacement; "
        "it keeps serving until the replacement is ready"
    )


def _evict_for_move(
    t: TickContext, q: Request, names: str, free: FreeMap, held: Held
) -> str | None:
    """Evict known-idle replicas of other models so `q`'s replacement fits.

    Returns what the drain now waits for, or None when nothing can be evicted
    (then force, or the plain wait, applies). Room already being made for the
    model (victims still draining) is waited for, not evicted again.
    """
    batch, mem = t.batch, t.memory
    r = q.replaces
    assert r is not None
    name = q.model.name
    earlier = mem.evicting.get(name)
    if earlier is not None and any(
        (v := batch.base.replicas.get(rid)) is not None and _freeing(t, v)
        for rid in earlier.victims
    ):
        return making_room_text(earlier.victims)
    purpose = f"the replacement of {r.id} (node {names} draining)"
    res = _maybe_evict(t, q.model, free, purpose=purpose)
    if res is None:
        return None
    _hold(free, name, res, held)
    for n in draining_nodes(batch, r):
        msg = (
            f"evicting idle {', '.join(sorted(res.victims))} to make room for {purpose}; "
            "see the model.evicting event of " + name
        )
        batch.event("node.drain_evicting", "node", n.name, msg, model=name)
    return making_room_text(res.victims)


def _unplaceable(t: TickContext, u: Unplaceable) -> None:
    batch, mem = t.batch, t.memory
    before = mem.unplaceable.get(u.model)
    mem.unplaceable[u.model] = u
    if before is None or before.reason != u.reason:
        batch.event("model.unplaceable", "model", u.model, u.reason, model=u.model)


def _maybe_evict(
    t: TickContext, model: Model, free: FreeMap, *, purpose: str | None = None
) -> Reservation | None:
    """Evict known-idle replicas so `model` fits; `purpose`: what the room is for when
    it is not a new replica of the model (a drained replica's replacement)."""
    batch, mem, cfg = t.batch, t.memory, t.config
    earlier = mem.evicting.get(model.name)
    if earlier is not None and any(
        (r := batch.base.replicas.get(rid)) is not None and _freeing(t, r)
        for rid in earlier.victims
    ):
        return None  # the room evicted earlier is still being freed
    plan = plan_eviction(
        model.spec,
        batch.base,
        t.usage,
        free,
        now=batch.now,
        heartbeat_timeout_s=cfg.heartbeat_timeout_s,
        # Already leaving this tick (surplus, other evictions): not room to count twice.
        exclude=t.view.leaving(),
        inflight=t.usage.inflight,
        pool=t.view.pool(),
        keep=_in_rooms(mem),
    )
    if plan is None or not plan.evict:
        return None
    for rid in plan.evict:
        r = batch.replica(rid)
        if r is None or r.state != "ready":
            continue
        sleep_or_drain(
            t,
            r,
            f"evicted for {model.name}: {plan.why}"
            + ("" if purpose is None else f" (for {purpose})"),
            kind="replica.evicted",
        )
        lower_desired(t, r.model)
    res = mem.evicting[model.name] = Reservation(
        model=model.name,
        victims=frozenset(plan.evict),
        gpus=tuple((s.node, s.gpus) for s in plan.placement.shards),
    )
    msg = f"evicting {', '.join(plan.evict)} to make room: {plan.why}"
    if purpose is not None:
        msg += f"; the room is for {purpose}"
    batch.event("model.evicting", "model", model.name, msg, model=model.name)
    return res


def _in_rooms(mem: TickMemory) -> set[str]:
    """Replicas whose cards are room held for some model (moving or evicted for it)."""
    out: set[str] = set()
    for res in mem.evicting.values():
        out |= res.victims
    return out


def _maybe_compact(
    t: TickContext,
    model: Model,
    u: Unplaceable,
    free: FreeMap,
    ports: dict[str, set[int]],
    moving: set[str],
) -> Reservation | None:
    """Move the fewest ready replicas so `model` fits (placement/compaction.py).

    Each moved replica's replacement is placed now, off the model's room; the old
    one serves until it is ready, then drains (per_model._settle_pairs), and the
    room is held for the model meanwhile as for an eviction.
    """
    batch, mem = t.batch, t.memory
    base = batch.base
    last = mem.compaction_failed.get(model.name)
    if last is not None and batch.now - last < COMPACT_RETRY_S:
        return None
    if not fragmented(model.spec, base.nodes, free):
        return None
    taken = moving | _in_rooms(mem)
    current = t.view.current()
    taken.update(r.replaces for r in current.values() if r.replaces and r.state in LIVE)
    leaving = t.view.leaving()

    def movable(r: Replica) -> bool:
        was = base.replicas.get(r.id)
        return (
            r.state == "ready"
            and was is not None
            and was.state == "ready"
            and r.model != model.name
            and r.model in base.models
            and r.id not in taken
            and r.id not in leaving
            and all(s.node in free for s in r.shards)
        )

    specs = {name: m.spec for name, m in base.models.items()}
    plan = plan_compaction(
        model.spec, base.nodes, free, holders=t.view.holders(), movable=movable, specs=specs
    )
    if plan is None:
        mem.compaction_failed[model.name] = batch.now
        return None
    mem.compaction_failed.pop(model.name, None)
    move = making_room(model.name, u.reason)
    for mv in plan.moves:
        owner = base.models[mv.replica.model]
        free.take(mv.placement)
        _create(t, Request(model=owner, replaces=mv.replica, why=move.reason), mv.placement, ports)
        moving.add(mv.replica.id)
    ids = [mv.replica.id for mv in plan.moves]
    res = mem.evicting[model.name] = Reservation(
        model=model.name, victims=frozenset(ids), gpus=plan.room
    )
    msg = f"moving {', '.join(ids)} to make room: {compaction_why(model.spec, plan)}"
    batch.event("model.compacting", "model", model.name, msg, model=model.name)
    return res


def _end_stalled(t: TickContext) -> None:
    """Stop holding room that is not coming: one of its replicas is serving where it
    is with no replacement on its way (a moved replica's replacement failed or was
    stopped; an evicted one woke again). Its cards would be held for nobody until the
    model was deleted; a later tick plans the model's room afresh."""
    batch, mem = t.batch, t.memory
    for name, res in sorted(mem.evicting.items()):
        for rid in sorted(res.victims):
            v = batch.replica(rid)
            if v is None or v.state != "ready":
                continue
            reps = [
                n
                for nid in sorted(t.index.of_model(v.model))
                if (n := batch.replica(nid)) is not None and n.replaces == rid
            ]
            if any(n.state in ("pending", "starting", "ready") for n in reps):
                continue
            del mem.evicting[name]
            why = f"; its replacement {reps[-1].id} is {reps[-1].state}" if reps else ""
            msg = f"stopped making room: {rid} ({v.model}) serves on where it is{why}"
            batch.event("model.room_released", "model", name, msg, model=name)
            break


# How often a model that no set of moves could make room for is planned again: a
# plan costs about an eviction plan, and moves found a few seconds late cost little
# next to the start of the replacements they wait for.
COMPACT_RETRY_S = 5.0

# How often the moment an eviction could make room is worked out again per
# model: it costs a few eviction plans, and a moment a few seconds stale only
# makes a refused client come back a little early.
ETA_REFRESH_S = 15.0


def _idle_eta(t: TickContext, model: Model, free: FreeMap) -> None:
    """Nothing can be evicted for `model` now: remember when that would change, if
    waiting helps (eviction.idle_enough_in), for the outlook routers read."""
    batch, mem = t.batch, t.memory
    checked = mem.idle_eta_checked.get(model.name)
    if checked is not None and batch.now - checked < ETA_REFRESH_S:
        return
    mem.idle_eta_checked[model.name] = batch.now
    wait = idle_enough_in(
        model.spec,
        batch.base,
        t.usage,
        free,
        now=batch.now,
        heartbeat_timeout_s=t.config.heartbeat_timeout_s,
        exclude=t.view.leaving(),
        inflight=t.usage.inflight,
        pool=t.view.pool(),
    )
    if wait is None:
        mem.idle_enough_at.pop(model.name, None)
    else:
        mem.idle_enough_at[model.name] = batch.now + wait


def _freeing(t: TickContext, r: Replica) -> bool:
    """Whether an evicted replica's cards are still on their way back.

    Draining, or stopped with an engine its agent last reported running on a
    node that still heartbeats. An engine on a node gone silent is not coming
    back soon: waiting for it would block the model for as long as the node is
    away, so the model may evict elsewhere.
    """
    if r.state in HOLDS_GPUS:
        return True
    batch, timeout_s = t.batch, t.config.heartbeat_timeout_s
    for s in r.shards:
        if s.state not in SHARD_RUNNING:
            continue
        node = batch.node(s.node)
        if (
            node is not None
            and node.shown_state(now=batch.now, heartbeat_timeout_s=timeout_s) != "unreachable"
        ):
            return True
    return False
