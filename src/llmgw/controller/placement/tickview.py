"""What a tick's placement reads again for every model it cannot place, kept once.

For each model that fails placement the tick tries a wake (who holds each card,
wakes.py), an eviction (which replicas are idle enough, how many each model may
lose, eviction.py) and, every ETA_REFRESH_S, the moment waiting would make room
(eviction.idle_enough_in). Each of those walked every replica, so a fleet short
of cards for hundreds of models spent seconds a tick there, all of it on the
controller's event loop, where heartbeats and long-polls then wait.

What they read depends on the requesting model only through a filter (its name,
its priority), so it is worked out once per tick and filtered per request. The
parts a tick's own changes move (what holds each card, which replicas are
leaving, how many each model may still lose) follow those changes: every
replica change goes through Batch.put_replica, which appends to
`changes.replicas`, so the view applies what was appended since it last looked.

Nothing is decided here: the rules stay in eviction.py and wakes.py, which read
this view where the tick has one and the state where it has not. A view made
with `cached=False` hands out no pool and recomputes the rest each time, as the
code did before it (test_controller_tick_view.py checks both decide alike).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmgw.controller.fleet.batch import Batch
from llmgw.controller.fleet.records import Replica
from llmgw.controller.idle import IdleTracker
from llmgw.controller.placement.eviction import Candidate, node_ready
from llmgw.controller.placement.wakes import card_holders
from llmgw.wire.admin import ReplicaState
from llmgw.wire.models import ModelSpec

# Batch.leaving: states a replica leaves service in.
_LEAVING: frozenset[ReplicaState] = frozenset({"draining", "stopped", "failed", "sleeping"})

Card = tuple[str, int]


@dataclass(frozen=True, slots=True)
class _Entry:
    """A ready replica of the tick's starting state whose idleness is known."""

    replica: Replica
    priority: int
    idle_s: float
    evictable_after_s: float
    # Sleep mode: seconds since it became ready (idleness counts from there at
    # most, eviction.idle_candidates); None: not a sleep-mode model.
    awake_s: float | None
    # Requests in flight there (routers reported more than 0).
    busy: bool
    # On a ready node: its cards are capacity once freed.
    placeable: bool
    # evictable_after_s - idle_s: how long until it may be evicted (<= 0: now).
    wait_s: float

    def idle_after(self, wait_s: float) -> float:
        s = self.idle_s + wait_s
        return s if self.awake_s is None else min(s, self.awake_s)


class TickView:
    """One tick's replicas as placement reads them (module docstring).

    Implements eviction.CandidatePool. `cached=False`: no pool, and every read
    recomputed from the batch (the code before this view; for comparison).
    """

    def __init__(
        self,
        batch: Batch,
        usage: IdleTracker,
        *,
        heartbeat_timeout_s: float,
        cached: bool = True,
    ) -> None:
        self._batch = batch
        self._usage = usage
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._cached = cached
        # How many of `changes.replicas` have been applied.
        self._seen = 0
        self._leaving: set[str] = set()
        # Built on first use, then kept current.
        self._current: dict[str, Replica] | None = None
        self._order: dict[str, int] = {}
        self._holders: dict[Card, list[Replica]] | None = None
        self._spare: Counter[str] | None = None
        # Built on first use; they read only the tick's starting state.
        self._now_list: list[tuple[Candidate, _Entry]] | None = None
        self._by_wait: list[_Entry] = []
        self._waits: list[float] = []
        self._max_after_s = 0.0
        self._sleeping: dict[str, list[Replica]] | None = None

    # -- what the tick's changes move ----------------------------------------

    def leaving(self) -> frozenset[str] | set[str]:
        """Replicas this tick took out of service (Batch.leaving); do not keep it."""
        if not self._cached:
            return self._batch.leaving()
        self._sync()
        return self._leaving

    def current(self) -> Mapping[str, Replica]:
        """The replicas with this tick's changes (swaps.current_replicas); do not keep it."""
        if not self._cached:
            out = dict(self._batch.base.replicas)
            out.update((r.id, r) for r in self._batch.changes.replicas)
            return out
        self._sync()
        if self._current is None:
            self._current = dict(self._batch.base.replicas)
            self._current.update((r.id, r) for r in self._batch.changes.replicas)
            self._order = {rid: i for i, rid in enumerate(self._current)}
        return self._current

    def holders(self) -> Mapping[Card, Sequence[Replica]]:
        """(node, GPU) → the replicas holding it now (wakes.card_holders of `current`)."""
        if not self._cached:
            return card_holders(self.current().values())
        current = self.current()
        if self._holders is None:
            self._holders = card_holders(current.values())
        return self._holders

    @property
    def spare(self) -> Mapping[str, int]:
        """Model → ready replicas above its min_replicas, those leaving not counted
        (eviction._spare_per_model)."""
        self._sync()
        if self._spare is None:
            base = self._batch.base
            ready = Counter(
                r.model
                for r in base.replicas.values()
                if r.state == "ready" and r.id not in self._leaving
            )
            self._spare = Counter(
                {name: ready[name] - m.spec.min_replicas for name, m in base.models.items()}
            )
        return self._spare

    def _sync(self) -> None:
        changes = self._batch.changes.replicas
        if self._seen == len(changes):
            return
        fresh, self._seen = changes[self._seen :], len(changes)
        base = self._batch.base.replicas
        for r in fresh:
            leaves = r.state in _LEAVING
            if leaves != (r.id in self._leaving):
                if leaves:
                    self._leaving.add(r.id)
                else:
                    self._leaving.discard(r.id)
                b = base.get(r.id)
                spare = self._spare
                if b is not None and b.state == "ready" and spare is not None and b.model in spare:
                    spare[b.model] += -1 if leaves else 1
            if self._current is not None:
                old = self._current.get(r.id)
                self._current[r.id] = r
                self._order.setdefault(r.id, len(self._order))
                if self._holders is not None:
                    self._move_holder(old, r)

    def _move_holder(self, old: Replica | None, new: Replica) -> None:
        """Keep `_holders` as card_holders of `_current` would build it, in its order."""
        holders = self._holders
        assert holders is not None
        if old is not None and old.holds_gpus:
            for card in _cards(old):
                held = holders[card]
                held[:] = [h for h in held if h.id != old.id]
                if not held:
                    del holders[card]
        if new.holds_gpus:
            order = self._order
            for card in _cards(new):
                held = holders.setdefault(card, [])
                keys = [order[h.id] for h in held]
                held.insert(bisect.bisect(keys, order[new.id]), new)

    # -- eviction.CandidatePool ----------------------------------------------

    def pool(self) -> TickView | None:
        """This view as an eviction.CandidatePool, brought up to date; None when not cached."""
        if not self._cached:
            return None
        self._sync()
        if self._now_list is None:
            self._build()
        return self

    def sleeping(self, model: str) -> Sequence[Replica]:
        """The model's sleeping replicas in the tick's starting state, in its order."""
        if self._sleeping is None:
            self._sleeping = {}
            for r in self._batch.base.replicas.values():
                if r.state == "sleeping":
                    self._sleeping.setdefault(r.model, []).append(r)
        return self._sleeping.get(model, ())

    def candidates(
        self, spec: ModelSpec, *, wait_s: float = 0.0, busy_ok: bool = False
    ) -> list[Candidate]:
        """eviction.idle_candidates for `spec` with every idle time `wait_s` longer,
        less those whose model may lose none (`spare`): no rule could take them."""
        spare = self.spare
        if wait_s == 0.0:
            assert self._now_list is not None
            out: list[Candidate] = []
            for c, e in self._now_list:
                if e.priority > spec.priority:
                    break  # sorted by priority first
                if self._takeable(e, spec, spare, busy_ok=busy_ok):
                    out.append(c)
            return out
        found: list[tuple[tuple[int, float, str], Candidate]] = []
        # Every entry whose wait is within the float slack of `wait_s`; exact test below.
        upto = wait_s + 1e-6 * (1.0 + wait_s + self._max_after_s)
        for e in self._by_wait:
            if e.wait_s > upto:
                break
            if not e.placeable or e.priority > spec.priority:
                continue
            idle_s = e.idle_after(wait_s)
            if idle_s < e.evictable_after_s or not self._takeable(e, spec, spare, busy_ok=busy_ok):
                continue
            r = e.replica
            found.append(
                ((e.priority, -idle_s, r.id), Candidate(r, priority=e.priority, idle_s=idle_s))
            )
        found.sort(key=lambda kc: kc[0])
        return [c for _, c in found]

    def waits(self, spec: ModelSpec, n: int) -> list[float]:
        """The `n` shortest waits (seconds) after which one more replica of another
        model, not above `spec`'s priority, is idle past its timeout (idle_enough_in)."""
        assert self._now_list is not None
        out: list[float] = []
        start = bisect.bisect_right(self._by_wait, 0.0, key=lambda e: e.wait_s)
        # Ascending, so the distinct ones come in order and the first n are the shortest.
        for e in self._by_wait[start:]:
            if out and e.wait_s == out[-1]:
                continue
            if len(out) == n:
                break
            if e.priority > spec.priority or e.replica.model == spec.name:
                continue
            if e.replica.id not in self._leaving:
                out.append(e.wait_s)
        return out

    def _takeable(
        self, e: _Entry, spec: ModelSpec, spare: Mapping[str, int], *, busy_ok: bool
    ) -> bool:
        model = e.replica.model
        return (
            model != spec.name
            and (busy_ok or not e.busy)
            and spare.get(model, 0) > 0
            and e.replica.id not in self._leaving
        )

    def _build(self) -> None:
        batch, usage = self._batch, self._usage
        base, now = batch.base, batch.now
        ready_nodes = {
            name for name in base.nodes if node_ready(base, name, now, self._heartbeat_timeout_s)
        }
        entries: list[_Entry] = []
        for r in base.replicas.values():
            if r.state != "ready":
                continue
            model = base.models.get(r.model)
            idle_s = usage.idle_for(r.id, now=now)
            if model is None or idle_s is None:
                continue
            inflight = usage.inflight(r.id)
            after = model.spec.evictable_after_s
            entries.append(
                _Entry(
                    replica=r,
                    priority=model.spec.priority,
                    idle_s=idle_s,
                    evictable_after_s=after,
                    awake_s=max(0.0, now - r.state_since) if model.spec.sleep_mode else None,
                    busy=inflight is not None and inflight > 0,
                    placeable=any(s.node in ready_nodes for s in r.shards),
                    wait_s=after - idle_s,
                )
            )
            self._max_after_s = max(self._max_after_s, abs(after))
        now_list = []
        for e in entries:
            idle_now = e.idle_after(0.0)
            if e.placeable and idle_now >= e.evictable_after_s:
                c = Candidate(replica=e.replica, priority=e.priority, idle_s=idle_now)
                now_list.append((c, e))
        now_list.sort(key=lambda ce: (ce[0].priority, -ce[0].idle_s, ce[0].replica.id))
        self._now_list = now_list
        self._by_wait = sorted(entries, key=lambda e: e.wait_s)


def _cards(r: Replica) -> Iterable[Card]:
    for s in r.shards:
        for g in s.gpus:
            yield (s.node, g)
