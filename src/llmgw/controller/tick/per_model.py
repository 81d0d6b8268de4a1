"""Per-model reconcile decisions: how many, which to drain, what to place.

Counting rules, because they decide everything else:
- a model's replicas are its live ones: pending, starting, ready, and failed
  ones waiting out their backoff (a restart refills the same slot, so a failed
  replica is not "missing" — placing another would defeat the backoff);
- a make-before-break pair (a replacement and the ready replica it replaces)
  counts once: the old one serves until the new one is ready, then drains.

A replica moves (make-before-break) for the reasons tick/moves.py gives: its
node draining or a card unhealthy (all such at once), or its spec changed
since it was placed (rolling, one at a time per model). Surplus is drained
cheapest first: failed, pending, starting, then ready ones by how long they
have been idle — known idle first, longest first; unknown idleness last, since
"no router has said" is not "idle".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

from llmgw.controller.fleet.batch import LIVE, Batch, node_drain_grace
from llmgw.controller.fleet.records import FleetState, Model, Replica
from llmgw.controller.idle import IdleTracker, ModelLoadSum
from llmgw.controller.placement.clearing import clear_ahead
from llmgw.controller.placement.requests import Request, place_requests
from llmgw.controller.placement.swaps import sleep_or_drain
from llmgw.controller.tick.context import TickContext
from llmgw.controller.tick.moves import Move, move_reason

# Cheapest to drop first (ready replicas then sort by idleness).
_DROP_ORDER = {"failed": 0, "pending": 1, "starting": 2, "ready": 3}


def desired_count(
    *,
    min_replicas: int,
    max_replicas: int,
    current: int,
    demand: int,
    busy: int | None,
    target_per_replica: float,
    cooling: bool,
    serving: bool = False,
) -> int:
    """Replicas a model should have now.

    `busy` is in-flight plus held requests the routers report; None when no
    router has reported this model — unknown load never scales anything down.
    Held requests mean at least one replica (scale from zero: routers hold a
    request for a model with no replica until one is ready). Scaling up is
    immediate; scaling down waits out the cool-down (`cooling`). `serving`:
    routers started requests for it in their last interval; in-flight counts
    taken at one instant are often 0 under sparse traffic, and dropping the last
    replica then would only bring it back cold on the next request (flapping).
    """
    want = min_replicas
    if demand > 0 or serving:
        want = max(want, 1)
    # Unknown load keeps what there is; a known one sizes the model.
    by_load = current if busy is None else math.ceil(busy / target_per_replica)
    want = max(want, by_load)
    if want < current and cooling:
        want = current
    return min(max(want, min_replicas), max_replicas)


def plan_models(t: TickContext, *, dirty: Collection[str] | None = None) -> None:
    """Decide every model that may need it; `dirty`: models changed since the last tick
    (None: decide them all, as after a takeover).

    A model nothing happened to was left stable by the last tick, so deciding it
    again would cost O(fleet) per tick for nothing. Besides the dirty ones, the
    tick looks at models that time or capacity can change without a write:
    unplaceable or evicting ones (capacity frees), failed replicas' (backoff
    ends), those on draining nodes (moves), and those routers report load or
    demand for (autoscaling; for these the desired count is computed, and the
    rest only if it changed).
    """
    batch, index, mem = t.batch, t.index, t.memory
    state = batch.base
    for name in sorted(set(index.by_model) - set(state.models)):
        # The delete command drained these; this catches a restart in between.
        for rid in sorted(index.of_model(name)):
            r = batch.replica(rid)
            if r is not None and (r.state in LIVE or r.state == "sleeping"):
                batch.drain(r, f"model {name} deleted", grace_s=t.config.drain_grace_s)
        mem.evicting.pop(name, None)
    demand, load = _by_model_name(state, t.usage.demand(), t.usage.load())
    requests: list[Request] = []
    watch = None if dirty is None else _watched(t, dirty)
    names = state.models.keys() if watch is None else (watch | demand.keys() | load.keys())
    for name in sorted(names):
        m = state.models.get(name)
        if m is None:
            continue
        stable = watch is not None and name not in watch
        _model(t, m, demand.get(name, 0), load.get(name), requests, stable=stable)
    place_requests(t, requests)
    # After placement, so what this tick woke or placed is left alone; it looks at
    # every sleeper, dirty or not: idleness grows without a write.
    clear_ahead(t)


def _by_model_name(
    state: FleetState,
    demand: dict[str, int],
    load: dict[str, ModelLoadSum],
) -> tuple[dict[str, int], dict[str, ModelLoadSum]]:
    """Demand and load keyed by model name.

    Routers key them by the name clients put in the request, which may be one
    of a model's aliases or one of its LoRA adapters: without folding those in, a
    model asked for only by an alias or an adapter would never scale from zero.
    Names no model serves are kept (they match nothing). The alias map is built
    only when a report needs it.
    """
    models = state.models
    if all(k in models for k in demand) and all(k in models for k in load):
        return demand, load
    owner = {alias: m.name for m in models.values() for alias in m.spec.aliases}
    owner.update((a.name, a.base) for a in state.adapters.values())
    folded_demand: dict[str, int] = {}
    for name, held in demand.items():
        key = owner.get(name, name)
        folded_demand[key] = folded_demand.get(key, 0) + held
    folded_load: dict[str, ModelLoadSum] = {}
    for name, ml in load.items():
        key = owner.get(name, name)
        was = folded_load.get(key)
        if was is not None:
            rate = ml.requests_per_s
            if was.requests_per_s is not None:
                rate = was.requests_per_s + (rate or 0.0)
            ml = ModelLoadSum(
                inflight=was.inflight + ml.inflight,
                held=was.held + ml.held,
                requests_per_s=rate,
                routers=max(was.routers, ml.routers),
            )
        folded_load[key] = ml
    return folded_demand, folded_load


def _watched(t: TickContext, dirty: Collection[str]) -> set[str]:
    batch, index, mem = t.batch, t.index, t.memory
    out = set(dirty) | mem.unplaceable.keys() | mem.evicting.keys()
    # Replicas this very tick changed (failed past a deadline or an unreachable
    # node's grace): their models are decided now, not a tick later.
    out.update(r.model for r in batch.changes.replicas)
    replicas = batch.base.replicas
    out.update(replicas[rid].model for rid in index.in_state("failed"))
    for name, node in batch.base.nodes.items():
        # Replicas there must move (a GPU's health changes without dirtying a model).
        if node.operator_state == "draining" or not all(g.healthy for g in node.gpus):
            out.update(replicas[rid].model for rid in index.on_node(name))
    return out


def _model(
    t: TickContext,
    m: Model,
    held: int,
    load: ModelLoadSum | None,
    requests: list[Request],
    *,
    stable: bool = False,
) -> None:
    batch = t.batch
    now, name = batch.now, m.name
    desired = _scale(t, m, held, load)
    if stable and desired == m.desired_replicas:
        return
    _stop_misplaced_sleepers(t, m)
    live = _live(t, name)
    if not live and desired == 0:
        return
    _settle_pairs(t, live)
    live = _live(t, name)
    # Old replicas still serving while their replacement starts.
    replaced = _replaced(live)
    movers = _movers(batch, m, live, replaced)
    # Not serving yet: nothing to protect, so no make-before-break; stop and refill.
    for r, move in movers:
        if r.state != "ready":
            batch.stop(r, move.reason)
    stopped = {r.id for r, _ in movers if r.state != "ready"}
    if stopped:
        live = [r for r in live if r.id not in stopped]
        # A stopped replacement no longer covers the replica it was replacing:
        # that one must move again (replaced anew), not be counted as covered
        # while a plain replica is placed and then dropped as surplus.
        replaced = _replaced(live)
        movers = _movers(batch, m, live, replaced)
    count = len(live) - len(replaced)
    if count > desired:
        single = [r for r in live if r.id not in replaced and r.replaces not in replaced]
        moving = {r.id for r, _ in movers}
        for r in _surplus(single, count - desired, t.usage, now, moving):
            sleep_or_drain(t, r, f"surplus: {count} replicas, {desired} desired")
        return
    requests.extend(Request(model=m) for _ in range(desired - count))
    for r in live:
        if r.state == "failed" and (r.retry_at is None or r.retry_at <= now):
            requests.append(Request(model=m, restart=r))
    ready_movers = [(r, move) for r, move in movers if r.state == "ready"]
    # A node drain (or a card gone bad) moves everything at once; spec changes
    # roll one replica at a time.
    moving_now = [(r, move) for r, move in ready_movers if move.at_once]
    outdated = [(r, move) for r, move in ready_movers if not move.at_once]
    if outdated and not replaced:
        moving_now.append(min(outdated, key=lambda rm: (rm[0].created_at, rm[0].id)))
    requests.extend(Request(model=m, replaces=r, why=move.reason) for r, move in moving_now)


def _stop_misplaced_sleepers(t: TickContext, m: Model) -> None:
    """A sleeper that would have to move (node draining, card unhealthy, spec changed)
    stops: waking it there would serve from the wrong place or the old spec."""
    batch = t.batch
    for rid in sorted(t.index.of_model(m.name)):
        r = batch.replica(rid)
        if r is None or r.state != "sleeping":
            continue
        move = move_reason(batch, m, r)
        if move is not None:
            batch.stop(r, f"stopped asleep: {move.reason}")


def _replaced(live: list[Replica]) -> set[str]:
    """Ids of live replicas whose live replacement is on its way (a make-before-break pair)."""
    live_ids = {r.id for r in live}
    return {r.replaces for r in live if r.replaces is not None and r.replaces in live_ids}


def _movers(
    batch: Batch, m: Model, live: list[Replica], replaced: set[str]
) -> list[tuple[Replica, Move]]:
    """Live replicas that must move (tick/moves.py), except those already being replaced."""
    out: list[tuple[Replica, Move]] = []
    for r in live:
        if r.id in replaced:
            continue
        move = move_reason(batch, m, r)
        if move is not None:
            out.append((r, move))
    return out


def _live(t: TickContext, model: str) -> list[Replica]:
    batch = t.batch
    out = []
    for rid in t.index.of_model(model):
        r = batch.replica(rid)
        if r is not None and r.state in LIVE:
            out.append(r)
    out.sort(key=lambda r: r.id)
    return out


def _scale(t: TickContext, m: Model, held: int, load: ModelLoadSum | None) -> int:
    batch, mem, cfg = t.batch, t.memory, t.config
    spec = m.spec
    busy = None if load is None else load.inflight + load.held
    last = mem.last_scaled_at.get(m.name, mem.leader_since)
    desired = desired_count(
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        current=m.desired_replicas,
        demand=held,
        busy=busy,
        target_per_replica=cfg.target_inflight_per_replica,
        cooling=batch.now - last < cfg.scale_down_cooldown_s,
        serving=load is not None and (load.requests_per_s or 0.0) > 0,
    )
    if desired != m.desired_replicas:
        seen = "-" if busy is None else str(busy)
        why = (
            f"desired {m.desired_replicas} → {desired} (min {spec.min_replicas}, "
            f"max {spec.max_replicas}, held {held}, in flight {seen})"
        )
        batch.put_model(dataclasses.replace(m, desired_replicas=desired))
        batch.event("model.scaled", "model", m.name, why, model=m.name)
        mem.last_scaled_at[m.name] = batch.now
    return desired


def _settle_pairs(t: TickContext, live: list[Replica]) -> None:
    """Resolve make-before-break pairs whose replacement is ready (or whose old one died)."""
    batch = t.batch
    by_id = {r.id: r for r in live}
    for new in live:
        old = by_id.get(new.replaces) if new.replaces is not None else None
        if old is None:
            continue
        if new.state == "ready":
            grace = node_drain_grace(batch, old, default_s=t.config.drain_grace_s)
            batch.drain(old, f"replaced by {new.id}, which is ready", grace_s=grace)
        elif old.state != "ready":
            # The old one stopped serving on its own: the replacement is simply a replica now.
            batch.stop(old, f"no longer serving; replacement {new.id} is on its way")


def _surplus(
    candidates: list[Replica], n: int, usage: IdleTracker, now: float, moving: set[str]
) -> list[Replica]:
    def key(r: Replica) -> tuple[int, int, float, str]:
        if r.state != "ready":
            return (_DROP_ORDER.get(r.state, 0), 0, 0.0, r.id)
        if r.id in moving:
            return (3, 0, 0.0, r.id)
        idle = usage.idle_for(r.id, now=now)
        # Known idle first, longest first; unknown after every known one.
        return (4, 0, -idle, r.id) if idle is not None else (4, 1, 0.0, r.id)

    return sorted(candidates, key=key)[:n]
