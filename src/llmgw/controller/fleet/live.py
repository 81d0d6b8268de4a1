"""The leader's authoritative fleet: in memory, written through the store first.

All I/O for the fleet state goes through here. Invariants:
- a change reaches memory only after the store has committed it, so a failed
  write leaves memory and database as they were (the caller gets a 503);
- every read-decide-write runs under `lock`, so a command, a heartbeat and a
  tick never decide from the same state and then overwrite each other;
- only a leader writes; a standby keeps a copy it reloads from the store;
- a write that failed may still have committed (the connection dropped after
  the COMMIT went out): memory is then read again from the store before the
  next decision (`resync`), never decided from as if the write had not happened.

Heartbeat timestamps are the exception to write-through: a heartbeat that
changes nothing else updates memory only, and the tick flushes each node's
timestamp at most every `config.flush_s`. Storing every heartbeat would cost
one transaction per node per interval (1,000/s on 2,000 nodes) to record the
one fact that matters only after a restart, and after a restart every node
gets a grace counted from the new leader's start anyway (tick.plan.silent_for).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import math
import time
from collections.abc import Iterable

from llmgw.controller.config import ControllerConfig
from llmgw.controller.errors import Conflict, NotLeading, StoreUnavailable
from llmgw.controller.fleet.agents import (
    Backoff,
    HeartbeatOrder,
    absorb_heartbeat,
    desired_shards,
    heartbeat_interval_s,
    name_claimed,
)
from llmgw.controller.fleet.batch import Batch
from llmgw.controller.fleet.decisions import Decisions
from llmgw.controller.fleet.endpoints import EndpointSink, endpoint_info, endpoint_list, outlook
from llmgw.controller.fleet.index import FleetIndex
from llmgw.controller.fleet.records import Changes, Event, FleetState, Node, Replica
from llmgw.controller.fleet.spans import ActionSpans
from llmgw.controller.fleet.starts import StartHistory
from llmgw.controller.store import NotLeader, Store, StoreError, UnreadableRow
from llmgw.controller.tick.carryover import TickMemory
from llmgw.runtime.clock import Clock
from llmgw.runtime.logs import kv
from llmgw.runtime.repeats import FailureLog
from llmgw.wire.agent import Heartbeat, HeartbeatReply
from llmgw.wire.endpoints import EndpointInfo, EndpointList, ModelOutlook
from llmgw.wire.policy import SpecPolicy

log = logging.getLogger(__name__)


class Fleet:
    def __init__(self, store: Store, *, clock: Clock, config: ControllerConfig) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.state = FleetState()
        self.index = FleetIndex()
        self.lock = asyncio.Lock()
        self.leading = False
        # What the reconcile loop remembers; a fresh one each leadership term.
        self.memory = TickMemory(leader_since=clock.wall())
        # The outlook in the endpoint list, as of the last tick (outlook_changed).
        self._outlook: tuple[ModelOutlook, ...] = ()
        self.sink = EndpointSink(
            start_version=int(clock.wall() * 1000), max_waiters=config.max_long_polls
        )
        # Node → last_heartbeat_at the store holds (flush bookkeeping).
        self._stored_heartbeat: dict[str, float | None] = {}
        self._unflushed: set[str] = set()
        # Which heartbeats are late and must not be applied (agents.HeartbeatOrder).
        self.order = HeartbeatOrder()
        # Models whose replicas or spec changed since the last tick (None: every
        # model, e.g. after a (re)load); the tick decides these (tick.per_model.plan_models).
        self._dirty: set[str] | None = None
        self.backoff = Backoff(base_s=config.restart_backoff_s, cap_s=config.restart_backoff_max_s)
        # Each committed event logged once and counted; store write latency (/metrics).
        self.decisions = Decisions()
        # Writes in flight (commit): a cancelled caller leaves its write running.
        self._writes: set[asyncio.Task[list[Event]]] = set()
        # A span per committed action (spans.py); None: tracing is off, set by the app.
        self.spans: ActionSpans | None = None
        # Recent start durations: the estimate a "starting" outlook carries.
        self.starts = StartHistory()
        # Node → the spec policy its agent last reported (apply-time checks). Memory
        # only: every heartbeat carries it again, so a restart forgets it for one interval.
        self.policies: dict[str, SpecPolicy] = {}
        # (node, address) → when a refused claim of that name was last recorded as an
        # event: one event per claimant per heartbeat timeout, not one per heartbeat.
        self._claims_noted: dict[tuple[str, str], float] = {}
        # A write failed since the last load: it may be in the store all the same
        # (its COMMIT's answer lost), so memory may lack it. resync() reads again.
        self._unsure = False
        # resync's failed reads: at every tick and heartbeat while the store is down.
        self._reloads = FailureLog(
            "store reload failed", cleared=None, count_as="reloads_failed", logger=log
        )
        # The stored row the last load stopped at (store/readrows.py); None: it read
        # them all. Shown on /metrics: a standby that cannot read the store serves what
        # it read before, and a leader cannot take over.
        self.unreadable: UnreadableRow | None = None

    # -- leadership ----------------------------------------------------------

    def require_leader(self) -> None:
        if not self.leading:
            raise NotLeading("this controller is a standby; retry against the leader")

    async def load(self) -> None:
        """Replace memory with what the store holds (takeover, or a standby's refresh)."""
        try:
            state = await asyncio.to_thread(self.store.load)
        except UnreadableRow as exc:
            self.unreadable = exc
            raise StoreUnavailable(f"cannot read the store: {exc}") from exc
        except StoreError as exc:
            raise StoreUnavailable(f"cannot read the store: {exc}") from exc
        if self.unreadable is not None:
            log.info(
                kv(
                    "store rows readable again",
                    table=self.unreadable.table,
                    row=self.unreadable.row,
                )
            )
            self.unreadable = None
        before = self.endpoints()
        self.state = state
        self._unsure = False
        self.index = FleetIndex.build(state)
        self.starts.seed(state)
        # The loaded fleet is long-lived and acyclic (frozen values in dicts):
        # keep the cyclic collector from walking it again and again. Without
        # this a full collection pauses the loop ~40 ms at 5,000 models, which
        # is the tick's p99. Objects dropped later are still freed (refcounts).
        gc.collect()
        gc.freeze()
        self._stored_heartbeat = {n.name: n.last_heartbeat_at for n in state.nodes.values()}
        self._unflushed.clear()
        self._dirty = None
        # The whole list, keys included: a standby reloads to serve routers that
        # follow it, and comparing only endpoints and models kept a key revoked on
        # the leader in the standby's cached list until some replica changed.
        after = endpoint_list(state, self.index, version=self.sink.version, looks=self._outlook)
        if after != before:
            self.sink.bump()

    async def resync(self) -> None:
        """Memory from the store again when a write's outcome is unknown (the caller
        holds `lock` and decides next). StoreUnavailable: still unknown; no decision.

        Without it a write whose answer was lost is in the database and not in memory:
        the leader lists a key it would let be created again, or places a second
        replica on the card its lost placement holds, which the next leader loads both
        of. Heartbeat times held only in memory are kept: a node that heartbeated
        through the outage must not look silent since its last flush.
        """
        if not self._unsure:
            return
        nodes = self.state.nodes
        beats = {
            name: at
            for name in self._unflushed
            if name in nodes and (at := nodes[name].last_heartbeat_at) is not None
        }
        try:
            await self.load()
        except StoreUnavailable as exc:
            self._reloads.failed(exc.message, now=self.clock.monotonic())
            raise StoreUnavailable(
                "nothing was applied: the store must be read again first (a write before "
                f"this one was not confirmed) and cannot be: {exc.message}"
            ) from exc
        failed = self._reloads.worked()
        log.warning(kv("store reloaded after a write it did not confirm", reloads_failed=failed))
        for name, at in beats.items():
            node = self.state.nodes.get(name)
            if node is not None and (node.last_heartbeat_at or 0.0) < at:
                self.state.nodes[name] = dataclasses.replace(node, last_heartbeat_at=at)
                self._unflushed.add(name)

    def begin_term(self) -> None:
        self.leading = True
        now = self.clock.wall()
        # Memory only: the first heartbeat of a term is applied (HeartbeatOrder says why).
        self.order.clear()
        # The room held for evicting models is stored: carry on holding it.
        self.memory = TickMemory(leader_since=now, evicting=dict(self.state.reservations))
        # Above any version the previous leader handed out (its start time in ms
        # plus its changes), so routers that followed it take our list at once.
        self.sink.bump(at_least=int(now * 1000))

    def end_term(self) -> None:
        self.leading = False

    # -- writes --------------------------------------------------------------

    async def commit(self, changes: Changes) -> list[Event]:
        """Store `changes` in one transaction, then mirror them in memory.

        The caller holds `lock` and decided `changes` from the current memory.
        The write runs in its own task: should the caller be cancelled while the
        database works, the transaction may still commit, and memory must then
        follow it rather than silently diverge from the store.
        """
        self.require_leader()
        if not changes:
            return []
        task = asyncio.create_task(self._write(changes))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return await asyncio.shield(task)

    async def writes_settled(self) -> None:
        """Wait for writes whose callers were cancelled (a stop cancels the tick
        mid-write) to end, committed or failed; their failures were logged by
        `_write`. On stop, before the store is closed and the lock released: a write
        still running then could land after a successor took the lead."""
        while self._writes:
            await asyncio.wait(set(self._writes))

    async def _write(self, changes: Changes) -> list[Event]:
        started = time.perf_counter()
        try:
            events = await asyncio.to_thread(self.store.apply, changes)
        except NotLeader as exc:
            self.decisions.store_write.observe(time.perf_counter() - started)
            # The lock is gone (a successor may lead already): stop acting now,
            # not at the next tick's check, so no heartbeat is answered from here.
            self.end_term()
            log.warning(kv("leadership lost on write; standing by", error=exc))
            raise NotLeading(f"this controller no longer leads: {exc}") from exc
        except StoreError as exc:
            self.decisions.store_write.observe(time.perf_counter() - started)
            self._unsure = True
            log.warning(kv("store write failed", error=exc))
            raise StoreUnavailable(
                f"the store refused the change, or did not confirm it (the connection "
                f"dropped; it may be kept): the controller reads the store again before "
                f"deciding anything else: {exc}"
            ) from exc
        self.decisions.store_write.observe(time.perf_counter() - started)
        self._mirror(changes)
        self.decisions.committed(events)
        if self.spans is not None:
            try:
                self.spans.committed(events, self.state, now=self.clock.wall())
            except Exception as exc:  # noqa: BLE001 - the change is committed already:
                # a fault in making its spans must not be answered as a failed write.
                log.warning(kv("spans of committed actions failed", error=repr(exc)))
        return events

    def take_dirty(self) -> set[str] | None:
        """The models to decide this tick; the next tick starts a new set."""
        dirty, self._dirty = self._dirty, set()
        return dirty

    def restore_dirty(self, dirty: set[str] | None) -> None:
        """A tick that failed to commit: decide those again next time."""
        if dirty is None or self._dirty is None:
            self._dirty = None
        else:
            self._dirty |= dirty

    def _mirror(self, changes: Changes) -> None:
        s = self.state
        # An adapter changes what its base's replicas list (their names) and the
        # list's known names.
        bump = bool(
            changes.models or changes.deleted_models or changes.adapters or changes.deleted_adapters
        )
        dirty = self._dirty
        if dirty is not None:
            dirty.update(m.name for m in changes.models)
            dirty.update(a.base for a in changes.adapters)
            dirty.update(r.model for r in changes.replicas)
            dirty.update(changes.deleted_models)
        for n in changes.nodes:
            s.nodes[n.name] = n
            self._stored_heartbeat[n.name] = n.last_heartbeat_at
        for m in changes.models:
            s.models[m.name] = m
        for a in changes.adapters:
            s.adapters[a.name] = a
        for name in changes.deleted_adapters:
            s.adapters.pop(name, None)
        for r in changes.replicas:
            old = s.replicas.get(r.id)
            s.replicas[r.id] = r
            self.starts.changed(s, old, r)
            self.index.put(old, r)
            if not bump and _listed(old, s) != _listed(r, s):
                bump = True
        for name in changes.deleted_nodes:
            s.nodes.pop(name, None)
            self._stored_heartbeat.pop(name, None)
            self.order.forget(name)
            self.policies.pop(name, None)
        for name in changes.deleted_models:
            s.models.pop(name, None)
            self.starts.forget_model(name)
        for rid in changes.deleted_replicas:
            old = s.replicas.pop(rid, None)
            self.index.put(old, None)
            if old is not None and dirty is not None:
                dirty.add(old.model)
            bump = bump or (old is not None and old.state == "ready")
        s.retired.update((spec.name, spec) for spec in changes.retired)
        s.reservations.update((res.model, res) for res in changes.reservations)
        for name in changes.deleted_retired:
            s.retired.pop(name, None)
        for name in changes.deleted_reservations:
            s.reservations.pop(name, None)
        for k in changes.keys:
            s.keys[k.name] = k
        for name in changes.deleted_keys:
            s.keys.pop(name, None)
        # Routers follow the keys with the endpoint list: a revoked key is refused
        # as soon as the long-polls wake.
        bump = bump or bool(changes.keys or changes.deleted_keys)
        if bump:
            self.sink.bump()

    # -- agents --------------------------------------------------------------

    async def heartbeat(self, hb: Heartbeat) -> HeartbeatReply:
        self.require_leader()
        async with self.lock:
            if self.order.is_stale(hb):
                # Sent before one already applied: its states are older than
                # ours. Answered all the same (the answer is idempotent).
                log.debug(kv("stale heartbeat ignored", node=hb.node, seq=hb.seq))
                shards = desired_shards(self.state, self.index, hb.node)
                return HeartbeatReply(shards=shards, interval_s=self._interval_s(hb.node))
            now = self.clock.wall()
            try:
                await self.resync()
                await self._refuse_claim(hb, now)
                absorbed = absorb_heartbeat(
                    self.state, self.index, hb, now=now, backoff=self.backoff
                )
                await self.commit(absorbed.batch.changes)
            except StoreUnavailable:
                # Nothing of the report was applied, but the node is alive: its
                # timestamp (memory-only anyway) moves on, or a database outage
                # longer than the timeout plus grace would fail its replicas on
                # the first tick that can write again.
                old = self.state.nodes.get(hb.node)
                if old is not None:
                    self.state.nodes[hb.node] = dataclasses.replace(old, last_heartbeat_at=now)
                    self._unflushed.add(hb.node)
                raise
            self.order.applied(hb)
            if hb.policy is not None:
                self.policies[hb.node] = hb.policy
            else:
                self.policies.pop(hb.node, None)
            if not absorbed.node_changed:
                # Memory only; the tick flushes it (see the module docstring).
                self.state.nodes[hb.node] = absorbed.node
                self._unflushed.add(hb.node)
            shards = desired_shards(self.state, self.index, hb.node)
            interval_s = self._interval_s(hb.node)
        return HeartbeatReply(shards=shards, interval_s=interval_s)

    def _interval_s(self, node: str) -> float:
        return heartbeat_interval_s(
            self.state, self.index, node, base_s=self.config.heartbeat_interval_s
        )

    async def _refuse_claim(self, hb: Heartbeat, now: float) -> None:
        """Conflict when `hb` claims a live node's name from another address.

        Nothing of the heartbeat is applied: the node keeps its record, and its own agent
        its shards. The refusal is an event (once per claimant per heartbeat timeout),
        so an operator sees two agents fighting over a name.
        """
        timeout = self.config.heartbeat_timeout_s
        why = name_claimed(self.state.nodes.get(hb.node), hb, now=now, timeout_s=timeout)
        if why is None:
            return
        key = (hb.node, hb.address)
        noted = self._claims_noted.get(key)
        if noted is None or now - noted >= timeout:
            batch = Batch(self.state, now)
            batch.event("node.name_conflict", "node", hb.node, why, model=None)
            try:
                await self.commit(batch.changes)
                if len(self._claims_noted) >= 256:
                    self._claims_noted = {
                        k: t for k, t in self._claims_noted.items() if now - t < timeout
                    }
                self._claims_noted[key] = now
            except StoreUnavailable:
                log.warning(kv("node name conflict not recorded", node=hb.node))
        raise Conflict(why, param="node")

    def heartbeats_to_flush(self, *, now: float, all_: bool = False) -> list[Node]:
        """Nodes whose stored heartbeat is older than the flush interval (or every one not
        stored yet with `all_`, on shutdown), for the tick's write."""
        due: list[tuple[float, str]] = []
        for name in self._unflushed:
            if name not in self.state.nodes:
                continue
            stored = self._stored_heartbeat.get(name)
            if all_ or stored is None or now - stored >= self.config.flush_s:
                due.append((-1.0 if stored is None else stored, name))
        due.sort()
        if not all_:
            # A quarter over the average rate at most, oldest first: nodes that
            # registered together (a restart, a rack powering on) would otherwise
            # come due together and make one tick write them all.
            cfg = self.config
            cap = max(64, math.ceil(1.25 * len(self.state.nodes) * cfg.tick_s / cfg.flush_s))
            del due[cap:]
        return [self.state.nodes[name] for _, name in due]

    def flushed(self, names: Iterable[str]) -> None:
        for name in names:
            self._unflushed.discard(name)

    # -- reads ---------------------------------------------------------------

    def outlook(self) -> tuple[ModelOutlook, ...]:
        """Models without a ready replica and what this controller does for them."""
        mem = self.memory
        return outlook(
            self.state,
            self.index,
            unplaceable={name: u.reason for name, u in mem.unplaceable.items()},
            evicting=mem.evicting,
            lasting={name for name, u in mem.unplaceable.items() if u.lasting},
            now=self.clock.wall(),
            idle_enough_at=mem.idle_enough_at,
            starts=self.starts,
        )

    @property
    def last_outlook(self) -> tuple[ModelOutlook, ...]:
        """The outlook as of the last tick: what the endpoint list tells routers."""
        return self._outlook

    def outlook_changed(self) -> None:
        """After a tick: a new outlook is news for routers (held requests look again)."""
        now = self.outlook()
        if now != self._outlook:
            self._outlook = now
            self.sink.bump()

    def endpoints(self) -> EndpointList:
        return self.sink.current(
            lambda version: endpoint_list(
                self.state, self.index, version=version, looks=self._outlook
            )
        )


def _listed(r: Replica | None, state: FleetState) -> EndpointInfo | None:
    """What a replica contributes to the endpoint list (None when it is not in it)."""
    if r is None:
        return None
    model = state.models.get(r.model)
    return endpoint_info(r, model, state.adapters) if model is not None else None
