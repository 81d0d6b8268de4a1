"""Replica transitions and the event that explains each one. Pure.

Every state change goes through `Batch.move`, which stamps `state_since`
and writes the event with its reason in the same `Changes`, so the log can
never miss a transition the store recorded, nor record one it did not.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from llmgw.controller.fleet.records import Changes, Event, FleetState, Model, Node, Replica
from llmgw.wire.admin import ReplicaState

Subject = Literal["replica", "node", "model", "controller", "key"]

# Replica states an agent is asked to run (the heartbeat answer's desired set).
RUNS: frozenset[ReplicaState] = frozenset(
    {"pending", "starting", "ready", "draining", "sleeping", "waking"}
)
# States that count towards a model's replicas: serving, on its way, or failed
# and waiting out its backoff (restarting it is the same replica slot).
LIVE: frozenset[ReplicaState] = frozenset({"pending", "starting", "ready", "failed", "waking"})


def new_replica_id() -> str:
    """A fresh replica id; never reused, so an agent's (replica_id, rank) stays unique."""
    return "r-" + secrets.token_hex(5)


def backoff_s(restarts: int, *, base_s: float, cap_s: float) -> float:
    """Seconds before restart number `restarts + 1`: base × 2^restarts, capped."""
    return min(cap_s, base_s * float(2 ** min(restarts, 30)))


def log_tail_text(lines: tuple[str, ...], *, keep: int = 5, max_chars: int = 600) -> str:
    """The last few log lines, one string, short enough for an event message."""
    text = " | ".join(line.strip() for line in lines[-keep:] if line.strip())
    return text if len(text) <= max_chars else "…" + text[-max_chars:]


@dataclass(slots=True)
class Batch:
    """Changes being built over a base state: reads see earlier writes of the batch.

    Pure: the base is never mutated; `changes` is what the store will apply and
    what memory will reflect once it has.
    """

    base: FleetState
    now: float
    changes: Changes = field(default_factory=Changes)
    new_id: Callable[[], str] = new_replica_id
    _replicas: dict[str, Replica] = field(default_factory=dict)
    _nodes: dict[str, Node] = field(default_factory=dict)
    _models: dict[str, Model] = field(default_factory=dict)

    def replica(self, rid: str) -> Replica | None:
        return self._replicas.get(rid) or self.base.replicas.get(rid)

    def node(self, name: str) -> Node | None:
        return self._nodes.get(name) or self.base.nodes.get(name)

    def model(self, name: str) -> Model | None:
        return self._models.get(name) or self.base.models.get(name)

    def touched(self, rid: str) -> bool:
        return rid in self._replicas

    def leaving(self) -> frozenset[str]:
        """Replicas this batch took out of service (draining, stopped or failed)."""
        return frozenset(
            rid
            for rid, r in self._replicas.items()
            if r.state in ("draining", "stopped", "failed", "sleeping")
        )

    def put_replica(self, r: Replica) -> Replica:
        self._replicas[r.id] = r
        self.changes.replicas.append(r)
        return r

    def put_node(self, n: Node) -> Node:
        self._nodes[n.name] = n
        self.changes.nodes.append(n)
        return n

    def put_model(self, m: Model) -> Model:
        self._models[m.name] = m
        self.changes.models.append(m)
        return m

    def event(
        self, kind: str, subject: Subject, subject_id: str, message: str, *, model: str | None
    ) -> None:
        self.changes.events.append(
            Event(
                id=0,
                at=self.now,
                kind=kind,
                subject=subject,
                subject_id=subject_id,
                model=model,
                message=message,
            )
        )

    def move(
        self,
        r: Replica,
        state: ReplicaState,
        reason: str,
        *,
        kind: str | None = None,
        **fields: Any,
    ) -> Replica:
        """`r` → `state`, with the reason on the replica and in the event log."""
        new = dataclasses.replace(
            r, state=state, reason=reason, state_since=self.now, updated_at=self.now, **fields
        )
        self.put_replica(new)
        self.event(kind or f"replica.{state}", "replica", r.id, reason, model=r.model)
        return new

    def update(self, r: Replica, **fields: Any) -> Replica:
        """Change fields other than the state (shard status, weight): no event."""
        return self.put_replica(dataclasses.replace(r, updated_at=self.now, **fields))

    def fail(self, r: Replica, reason: str, *, retry_in_s: float) -> Replica:
        return self.move(r, "failed", reason, retry_at=self.now + retry_in_s)

    def stop(self, r: Replica, reason: str) -> Replica:
        return self.move(r, "stopped", reason, retry_at=None, drain_deadline=None)

    def drain(self, r: Replica, reason: str, *, grace_s: float, kind: str | None = None) -> Replica:
        """Serving replicas drain (leave the endpoint list at once, stop when idle);
        ones that never served have nothing to drain and stop now."""
        if r.state == "ready":
            return self.move(r, "draining", reason, kind=kind, drain_deadline=self.now + grace_s)
        if r.state in ("pending", "starting", "failed", "sleeping", "waking"):
            return self.stop(r, reason)
        return r

    def sleep(self, r: Replica, level: int, reason: str, *, kind: str | None = None) -> Replica:
        """A ready replica sleeps instead of stopping: out of the endpoint list at once,
        its cards given up once its agent reports the engine asleep."""
        return self.move(r, "sleeping", reason, kind=kind, sleep_level=level, drain_deadline=None)

    def wake(self, r: Replica, reason: str) -> Replica:
        """A sleeping replica is woken: it serves again once its agent reports it ready."""
        return self.move(r, "waking", reason, sleep_level=None, endpoint_url=None)


def draining_nodes(batch: Batch, r: Replica) -> list[Node]:
    """The nodes r has shards on that the operator is draining, in shard order."""
    out: list[Node] = []
    for s in r.shards:
        node = batch.node(s.node)
        if node is not None and node.operator_state == "draining" and node not in out:
            out.append(node)
    return out


def node_drain_grace(batch: Batch, r: Replica, *, default_s: float) -> float:
    """The grace the operator gave the drain of a node r is on, else `default_s`."""
    for node in draining_nodes(batch, r):
        if node.drain_grace_s is not None:
            return node.drain_grace_s
    return default_s
