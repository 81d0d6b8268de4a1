"""The fake beside the real store: same semantics, dicts instead of tables.

For unit tests and for `memory://` (a controller that forgets on exit). Every
value is round-tripped through the SQL store's codec on the way in, so what the
fake accepts and what `load()` returns are what the database would accept and
return; the CHECK constraints are mirrored by `codec.check_constraints`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import ClassVar

from llmgw.controller.fleet.records import Changes, Event, FleetState
from llmgw.controller.store import codec, usage
from llmgw.controller.store.base import StoreError
from llmgw.wire.usage import TokenUsage, UsageBy, UsageRow


class MemoryStore:
    """A `Store` held in this process. Thread-safe; `apply` is all or nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = FleetState()
        self._events: list[Event] = []
        self._next_event_id = 1
        self._pruned_through = 0
        self._usage: dict[usage.RowKey, usage.Figures] = {}
        self._leader_url: str | None = None
        self._closed = False
        # Test hook: the next apply raises this and applies nothing (a database
        # that refused the transaction), then the hook clears itself.
        self.fail_next_apply: StoreError | None = None

    def load(self) -> FleetState:
        with self._lock:
            self._check_open()
            return _copy(self._state)

    def apply(self, changes: Changes) -> list[Event]:
        # Encode everything before touching the state: a value that cannot be
        # stored fails here and nothing is half-applied, as with a rolled-back
        # transaction.
        codec.check_constraints(changes)
        nodes = [
            codec.node_from(codec.node_row(n)) for n in codec.last_by_key(changes.nodes, "name")
        ]
        models = [
            codec.model_from(codec.model_row(m)) for m in codec.last_by_key(changes.models, "name")
        ]
        adapters = [
            codec.adapter_from(codec.adapter_row(a))
            for a in codec.last_by_key(changes.adapters, "name")
        ]
        replicas = [
            codec.replica_from(codec.replica_row(p))
            for p in codec.last_by_key(changes.replicas, "id")
        ]
        retired = [
            codec.retired_from(codec.retired_row(m))
            for m in codec.last_by_key(changes.retired, "name")
        ]
        held = [
            codec.reservation_from(codec.reservation_row(h))
            for h in codec.last_by_key(changes.reservations, "model")
        ]
        keys = [codec.key_from(codec.key_row(k)) for k in codec.last_by_key(changes.keys, "name")]
        events = [codec.event_from({**codec.event_row(e), "id": 0}) for e in changes.events]
        with self._lock:
            self._check_open()
            if self.fail_next_apply is not None:
                exc, self.fail_next_apply = self.fail_next_apply, None
                raise exc
            new = _copy(self._state)
            new.nodes.update((n.name, n) for n in nodes)
            new.models.update((m.name, m) for m in models)
            new.adapters.update((a.name, a) for a in adapters)
            new.replicas.update((p.id, p) for p in replicas)
            new.retired.update((m.name, m) for m in retired)
            new.reservations.update((h.model, h) for h in held)
            new.keys.update((k.name, k) for k in keys)
            for name in changes.deleted_nodes:
                new.nodes.pop(name, None)
            for name in changes.deleted_models:
                new.models.pop(name, None)
            for name in changes.deleted_adapters:
                new.adapters.pop(name, None)
            for rid in changes.deleted_replicas:
                new.replicas.pop(rid, None)
            for name in changes.deleted_retired:
                new.retired.pop(name, None)
            for name in changes.deleted_reservations:
                new.reservations.pop(name, None)
            for name in changes.deleted_keys:
                new.keys.pop(name, None)
            _unique_hashes(new)
            written = [
                dataclasses.replace(e, id=self._next_event_id + i) for i, e in enumerate(events)
            ]
            self._next_event_id += len(written)
            self._events.extend(written)
            self._state = new
            return written

    def events(
        self,
        *,
        model: str | None = None,
        replica: str | None = None,
        node: str | None = None,
        limit: int = 200,
        event_id: int | None = None,
    ) -> list[Event]:
        with self._lock:
            self._check_open()
            if limit <= 0:
                return []
            out: list[Event] = []
            for e in reversed(self._events):
                if model is not None and e.model != model:
                    continue
                if replica is not None and (e.subject != "replica" or e.subject_id != replica):
                    continue
                if node is not None and (e.subject != "node" or e.subject_id != node):
                    continue
                if event_id is not None and e.id != event_id:
                    continue
                out.append(e)
                if len(out) == limit:
                    break
            out.reverse()
            return out

    def record_usage(self, router_id: str, rows: Sequence[TokenUsage]) -> None:
        with self._lock:
            self._check_open()
            usage.merge(self._usage, router_id, rows)

    def usage(self, *, since: int, by: UsageBy, limit: int | None = None) -> list[UsageRow]:
        with self._lock:
            self._check_open()
            return usage.newest(usage.totals(self._usage, since=since, by=by), limit)

    def spent(self, *, keys: Sequence[str], since: int, until: int) -> dict[str, int]:
        with self._lock:
            self._check_open()
            return usage.spent(self._usage, keys=keys, since=since, until=until)

    def prune_usage(self, *, before: int, limit: int) -> int:
        with self._lock:
            self._check_open()
            old = sorted(k for k in self._usage if k[0] < before)[:limit]
            for k in old:
                del self._usage[k]
            return len(old)

    def prune_events(self, *, before: float | None, keep: int | None, limit: int) -> int:
        with self._lock:
            self._check_open()
            if not self._events or limit <= 0 or (before is None and keep is None):
                return 0
            # As the SQL store: of the oldest `limit` events, those either rule dooms.
            cap = self._events[-1].id - keep if keep is not None else None
            batch = self._events[:limit]
            doomed = {
                e.id
                for e in batch
                if (cap is not None and e.id <= cap) or (before is not None and e.at < before)
            }
            if doomed:
                self._events = [e for e in self._events if e.id not in doomed]
                self._pruned_through = max(self._pruned_through, *doomed)
            return len(doomed)

    def events_pruned_through(self) -> int:
        with self._lock:
            self._check_open()
            return self._pruned_through

    def set_leader_url(self, url: str | None) -> None:
        with self._lock:
            self._check_open()
            self._leader_url = url

    def leader_url(self) -> str | None:
        with self._lock:
            self._check_open()
            return self._leader_url

    def schema_version(self) -> int:
        return codec.SCHEMA_VERSION

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("store is closed")


def _copy(s: FleetState) -> FleetState:
    return FleetState(
        nodes=dict(s.nodes),
        models=dict(s.models),
        replicas=dict(s.replicas),
        retired=dict(s.retired),
        reservations=dict(s.reservations),
        adapters=dict(s.adapters),
        keys=dict(s.keys),
    )


def _unique_hashes(s: FleetState) -> None:
    """The SQL table's UNIQUE constraint on a key's hash."""
    seen: set[str] = set()
    for k in s.keys.values():
        digest = k.key.sha256.lower()
        if digest in seen:
            raise StoreError(f"key {k.name}: another key has the same sha256")
        seen.add(digest)


class MemoryLeadership:
    """A `Leadership` among objects of this process that share a `name`.

    `memory://` means one controller, so a lone instance always acquires; two
    instances with one name exclude each other like two controllers on one
    database, which lets app tests exercise standby and takeover without one.
    """

    _holders: ClassVar[dict[str, MemoryLeadership]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str = "default") -> None:
        self.name = name

    def try_acquire(self) -> bool:
        with self._registry_lock:
            holder = self._holders.setdefault(self.name, self)
            return holder is self

    def still_leader(self) -> bool:
        with self._registry_lock:
            return self._holders.get(self.name) is self

    def release(self) -> None:
        with self._registry_lock:
            if self._holders.get(self.name) is self:
                del self._holders[self.name]

    def holder(self) -> str | None:
        with self._registry_lock:
            h = self._holders.get(self.name)
        return None if h is None else f"in-process leader {self.name!r} (object {id(h):#x})"

    def lose(self) -> None:
        """Test hook: the lock is gone as if the database connection died."""
        self.release()
