"""The reconcile tick, decided purely: (state, usage, memory, now) → Plan.

No I/O here. The loop (tick/loop.py) writes `plan.changes` through the store in
one transaction and only then adopts them and `plan.memory`; a plan whose write
fails is dropped whole and the next tick decides again from the same facts.

One tick, in order:
1. nodes: unreachable after the heartbeat timeout; their replicas failed (and so
   re-placed) only after the grace on top, so a blip reshuffles nothing;
2. timers: per-phase deadlines (pending/starting too long → failed), draining
   replicas stopped once their in-flight requests finish or their grace ends,
   stopped replicas forgotten after the retention;
3. models (tick/per_model.py): desired count, surplus drained, make-before-break moves,
   failed replicas restarted after backoff, what is missing placed (placement/requests.py),
   evicting known-idle replicas when a model cannot be placed, then idle replicas
   put to sleep ahead of the sleepers under them (placement/clearing.py);
4. bookkeeping a restart needs: retired specs whose replicas have all stopped
   are dropped, and the room held for evicting models is written as it changed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from llmgw.controller.config import ControllerConfig
from llmgw.controller.fleet.batch import RUNS, Batch, backoff_s, new_replica_id
from llmgw.controller.fleet.index import FleetIndex
from llmgw.controller.fleet.records import SHARD_RUNNING, Changes, FleetState
from llmgw.controller.idle import IdleTracker
from llmgw.controller.placement.tickview import TickView
from llmgw.controller.tick.carryover import TickMemory
from llmgw.controller.tick.context import TickContext
from llmgw.controller.tick.per_model import plan_models


@dataclass(slots=True)
class Plan:
    changes: Changes
    memory: TickMemory
    # Replicas deleted from the store: the idle tracker forgets them.
    forgotten: list[str] = field(default_factory=list)


def plan_tick(
    state: FleetState,
    index: FleetIndex,
    usage: IdleTracker,
    memory: TickMemory,
    *,
    now: float,
    config: ControllerConfig,
    new_id: Callable[[], str] = new_replica_id,
    dirty: Collection[str] | None = None,
) -> Plan:
    """One tick's decisions. `dirty`: models whose replicas or spec changed since the
    last tick (None: all of them); see per_model.plan_models."""
    mem = memory.copy()
    batch = Batch(state, now, new_id=new_id)
    view = TickView(batch, usage, heartbeat_timeout_s=config.heartbeat_timeout_s)
    t = TickContext(batch=batch, index=index, usage=usage, memory=mem, config=config, view=view)
    plan = Plan(changes=batch.changes, memory=mem)
    _nodes(t)
    _timers(t, plan.forgotten)
    plan_models(t, dirty=dirty)
    _drop_retired(t)
    _store_reservations(t)
    return plan


def silent_for(last_heartbeat_at: float | None, *, now: float, leader_since: float) -> float:
    """Seconds without a heartbeat, counted from this controller's start at the earliest."""
    seen = leader_since if last_heartbeat_at is None else max(last_heartbeat_at, leader_since)
    return now - seen


def _nodes(t: TickContext) -> None:
    batch, index, mem, cfg = t.batch, t.index, t.memory, t.config
    now = batch.now
    for name, node in batch.base.nodes.items():
        silent = silent_for(node.last_heartbeat_at, now=now, leader_since=mem.leader_since)
        if silent > cfg.heartbeat_timeout_s:
            if name not in mem.unreachable:
                mem.unreachable.add(name)
                msg = f"no heartbeat for {silent:.0f}s (timeout {cfg.heartbeat_timeout_s:g}s)"
                batch.event("node.unreachable", "node", name, msg, model=None)
            if silent > cfg.heartbeat_timeout_s + cfg.unreachable_grace_s:
                _lose_replicas_on(batch, index, name, silent)
        elif name in mem.unreachable:
            mem.unreachable.discard(name)
            batch.event("node.reachable", "node", name, "heartbeating again", model=None)
        if node.operator_state == "draining":
            if name not in mem.drained and not any(
                (r := batch.replica(rid)) is not None and r.holds_gpus
                for rid in index.on_node(name)
            ):
                mem.drained.add(name)
                batch.event("node.drained", "node", name, "no replicas left", model=None)
        else:
            mem.drained.discard(name)


def _lose_replicas_on(batch: Batch, index: FleetIndex, node: str, silent: float) -> None:
    """After the grace: the node's replicas are gone as far as anyone can tell.

    Failed with an immediate retry, so they are re-placed on reachable nodes this
    very tick; if the node returns, its agent is told to run none of them.
    """
    reason = f"node {node} unreachable for {silent:.0f}s"
    for rid in sorted(index.on_node(node)):
        r = batch.replica(rid)
        if r is None or r.state not in RUNS:
            continue
        if r.state in ("draining", "sleeping"):
            batch.stop(r, reason)
        else:
            batch.fail(r, reason, retry_in_s=0.0)


def _timers(t: TickContext, forgotten: list[str]) -> None:
    """Deadlines and graces; `forgotten` gets the stopped replicas deleted from the store."""
    batch, index, usage, cfg = t.batch, t.index, t.usage, t.config
    now = batch.now
    phases = index.in_state("pending") | index.in_state("starting") | index.in_state("waking")
    for rid in sorted(phases):
        r = batch.replica(rid)
        if r is None or batch.touched(rid) or r.state not in ("pending", "starting", "waking"):
            continue
        # From this controller's start at the earliest: while no controller ran,
        # no agent could report progress (as with silence, silent_for below).
        if now - max(r.state_since, t.memory.leader_since) > cfg.starting_deadline_s:
            retry = backoff_s(
                r.restarts, base_s=cfg.restart_backoff_s, cap_s=cfg.restart_backoff_max_s
            )
            reason = f"still {r.state} after {cfg.starting_deadline_s:g}s (deadline)"
            batch.fail(r, reason, retry_in_s=retry)
    # Told to sleep, its engine still awake: its requests in flight get the drain
    # grace (mode=wait), the sleep itself the start deadline. An engine that never
    # answers its sleep (wedged, or refusing it) would otherwise hold its cards
    # forever as "falling asleep", and its model wait on it forever.
    asleep_by_s = cfg.drain_grace_s + cfg.starting_deadline_s
    for rid in sorted(index.in_state("sleeping")):
        r = batch.replica(rid)
        if r is None or batch.touched(rid) or r.state != "sleeping":
            continue
        if not any(s.state in SHARD_RUNNING for s in r.shards):
            continue
        if now - max(r.state_since, t.memory.leader_since) > asleep_by_s:
            batch.stop(r, f"still falling asleep after {asleep_by_s:g}s (deadline)")
    # A report of zero in flight could predate the drain (routers report once a
    # tick): wait two ticks before trusting it, unless the grace is shorter.
    settle_s = min(cfg.drain_grace_s, 2 * cfg.tick_s)
    for rid in sorted(index.in_state("draining")):
        r = batch.replica(rid)
        if r is None or batch.touched(rid) or r.state != "draining":
            continue
        inflight = usage.inflight(rid)
        if r.drain_deadline is not None and now >= r.drain_deadline:
            left = "unknown" if inflight is None else str(inflight)
            batch.stop(r, f"drain grace ended ({left} requests in flight)")
        elif inflight == 0 and now - r.state_since >= settle_s:
            batch.stop(r, "drained: no requests in flight")
    for rid in sorted(index.in_state("stopped")):
        r = batch.replica(rid)
        if r is not None and now - r.state_since > cfg.stopped_retention_s:
            batch.changes.deleted_replicas.append(rid)
            forgotten.append(rid)


def _drop_retired(t: TickContext) -> None:
    """A deleted model's spec is kept while any of its replicas still runs, no longer."""
    batch, index = t.batch, t.index
    for name in sorted(batch.base.retired):
        if not any(
            (r := batch.replica(rid)) is not None and r.state in RUNS
            for rid in index.of_model(name)
        ):
            batch.changes.deleted_retired.append(name)


def _store_reservations(t: TickContext) -> None:
    """Write what this tick changed in the room held for evicting models.

    `mem.evicting` is the working copy; the store's (`base.reservations`) is
    what a restarted controller resumes from, so the two are compared rather
    than trusting that every change was seen.
    """
    batch, mem = t.batch, t.memory
    stored = batch.base.reservations
    for name in sorted(mem.evicting):
        res = mem.evicting[name]
        if stored.get(name) != res:
            batch.changes.reservations.append(res)
    batch.changes.deleted_reservations.extend(sorted(stored.keys() - mem.evicting.keys()))
