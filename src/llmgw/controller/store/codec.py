"""Domain values ↔ flat rows, and the constraints every store enforces. Pure, no I/O.

One codec for every backend: the SQL store writes these rows, and the memory
store round-trips through them too, so a value the database could not hold
(labels that are not strings, a shard that does not encode) fails in unit tests
with the fake exactly as it would in production.

Nested values (GPUs, fabrics, labels, shards, the model spec) are msgspec JSON
text columns: they are always read and written whole with their owner, and a
JSON column decodes 10,000 replicas' shards far faster than joining a table.

LoRA adapters share the models table (one namespace of names, and no schema
change): a row whose spec has `adapter_of` is an adapter, with no replicas
(desired 0); `is_adapter_row` tells them apart when the table is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, get_args, get_type_hints

import msgspec

from llmgw.controller.fleet.records import (
    Adapter,
    Changes,
    Event,
    Model,
    Node,
    OperatorState,
    Replica,
    Reservation,
    Shard,
    TenantKey,
)
from llmgw.controller.store.base import StoreError
from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.admin import ReplicaState
from llmgw.wire.agent import GPU
from llmgw.wire.keys import ClientKey
from llmgw.wire.models import ModelSpec

# The schema version whose row shape this codec reads and writes (tables.py
# holds the migrations that reach it).
SCHEMA_VERSION = 10

# The value sets the database's CHECK constraints name; the memory store checks
# the same ones so the fake refuses what the real store would.
OPERATOR_STATES: tuple[str, ...] = get_args(OperatorState)
REPLICA_STATES: tuple[str, ...] = get_args(ReplicaState)
EVENT_SUBJECTS: tuple[str, ...] = get_args(get_type_hints(Event)["subject"])

_encoder = msgspec.json.Encoder()
_gpus = msgspec.json.Decoder(tuple[GPU, ...])
_strs = msgspec.json.Decoder(tuple[str, ...])
_labels = msgspec.json.Decoder(dict[str, str])
_spec = msgspec.json.Decoder(ModelSpec)
_adapter = msgspec.json.Decoder(AdapterSpec)
_client_key = msgspec.json.Decoder(ClientKey)


class _Kind(msgspec.Struct):
    """Just enough of a models row's spec to tell an adapter from a model."""

    adapter_of: str | None = None


_kind = msgspec.json.Decoder(_Kind)
_shards = msgspec.json.Decoder(tuple[Shard, ...])
_held = msgspec.json.Decoder(tuple[tuple[str, tuple[int, ...]], ...])

# A database row by column name (SQLAlchemy's RowMapping is keyed by Any).
Row = Mapping[Any, Any]
T = TypeVar("T")


def _json(value: object) -> str:
    return _encoder.encode(value).decode()


def node_row(n: Node) -> dict[str, Any]:
    return {
        "name": n.name,
        "address": n.address,
        "fabrics": _json(n.fabrics),
        "labels": _json(dict(n.labels)),
        "gpus": _json(n.gpus),
        "operator_state": n.operator_state,
        "last_heartbeat_at": n.last_heartbeat_at,
        "agent_started_at": n.agent_started_at,
        "port_lo": n.port_range[0],
        "port_hi": n.port_range[1],
        "drain_grace_s": n.drain_grace_s,
        "drain_force": n.drain_force,
        "drain_evict_idle": n.drain_evict_idle,
        "host_memory_mib": n.host_memory_mib,
    }


def node_from(r: Row) -> Node:
    return Node(
        name=r["name"],
        address=r["address"],
        fabrics=_strs.decode(r["fabrics"]),
        labels=_labels.decode(r["labels"]),
        gpus=_gpus.decode(r["gpus"]),
        operator_state=r["operator_state"],
        last_heartbeat_at=r["last_heartbeat_at"],
        agent_started_at=r["agent_started_at"],
        port_range=(r["port_lo"], r["port_hi"]),
        drain_grace_s=r["drain_grace_s"],
        drain_force=bool(r["drain_force"]),
        drain_evict_idle=bool(r["drain_evict_idle"]),
        host_memory_mib=r["host_memory_mib"],
    )


def model_row(m: Model) -> dict[str, Any]:
    return {
        "name": m.name,
        "spec": _json(m.spec),
        "created_at": m.created_at,
        "updated_at": m.updated_at,
        "desired_replicas": m.desired_replicas,
    }


def model_from(r: Row) -> Model:
    return Model(
        spec=_spec.decode(r["spec"]),
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        desired_replicas=r["desired_replicas"],
    )


def replica_row(p: Replica) -> dict[str, Any]:
    return {
        "id": p.id,
        "model": p.model,
        "state": p.state,
        "shards": _json(p.shards),
        "created_at": p.created_at,
        "state_since": p.state_since,
        "updated_at": p.updated_at,
        "reason": p.reason,
        "endpoint_url": p.endpoint_url,
        "restarts": p.restarts,
        "pool": p.pool,
        "weight": p.weight,
        "replaces": p.replaces,
        "retry_at": p.retry_at,
        "drain_deadline": p.drain_deadline,
        "master_port": p.master_port,
        "capacity_tok_s": p.capacity_tok_s,
        "sleep_level": p.sleep_level,
    }


def replica_from(r: Row) -> Replica:
    return Replica(
        id=r["id"],
        model=r["model"],
        state=r["state"],
        shards=_shards.decode(r["shards"]),
        created_at=r["created_at"],
        state_since=r["state_since"],
        updated_at=r["updated_at"],
        reason=r["reason"],
        endpoint_url=r["endpoint_url"],
        restarts=r["restarts"],
        pool=r["pool"],
        weight=r["weight"],
        replaces=r["replaces"],
        retry_at=r["retry_at"],
        drain_deadline=r["drain_deadline"],
        master_port=r["master_port"],
        capacity_tok_s=r["capacity_tok_s"],
        sleep_level=r["sleep_level"],
    )


def is_adapter_row(r: Row) -> bool:
    return _kind.decode(r["spec"]).adapter_of is not None


def adapter_row(a: Adapter) -> dict[str, Any]:
    return {
        "name": a.name,
        "spec": _json(a.spec),
        "created_at": a.updated_at,
        "updated_at": a.updated_at,
        "desired_replicas": 0,
    }


def adapter_from(r: Row) -> Adapter:
    return Adapter(spec=_adapter.decode(r["spec"]), updated_at=r["updated_at"])


def retired_row(spec: ModelSpec) -> dict[str, Any]:
    return {"name": spec.name, "spec": _json(spec)}


def retired_from(r: Row) -> ModelSpec:
    return _spec.decode(r["spec"])


def reservation_row(res: Reservation) -> dict[str, Any]:
    return {
        "model": res.model,
        "victims": _json(sorted(res.victims)),
        "gpus": _json(res.gpus),
    }


def reservation_from(r: Row) -> Reservation:
    return Reservation(
        model=r["model"],
        victims=frozenset(_strs.decode(r["victims"])),
        gpus=_held.decode(r["gpus"]),
    )


def key_row(k: TenantKey) -> dict[str, Any]:
    # name, team and sha256 as columns too: unique, and readable without decoding.
    return {
        "name": k.key.name,
        "team": k.key.team,
        "sha256": k.key.sha256.lower(),
        "spec": _json(k.key),
        "created_at": k.created_at,
        "expires_at": k.key.expires_at,
        "revoked_at": k.revoked_at,
    }


def key_from(r: Row) -> TenantKey:
    return TenantKey(
        key=_client_key.decode(r["spec"]), created_at=r["created_at"], revoked_at=r["revoked_at"]
    )


def event_row(e: Event) -> dict[str, Any]:
    # No id: the database assigns it.
    return {
        "at": e.at,
        "kind": e.kind,
        "subject": e.subject,
        "subject_id": e.subject_id,
        "model": e.model,
        "message": e.message,
    }


def event_from(r: Row) -> Event:
    return Event(
        id=r["id"],
        at=r["at"],
        kind=r["kind"],
        subject=r["subject"],
        subject_id=r["subject_id"],
        model=r["model"],
        message=r["message"],
    )


def last_by_key(values: list[T], key: str) -> list[T]:
    """Deduplicate upserts, the last value for a key winning, in first-seen order.

    PostgreSQL refuses an INSERT … ON CONFLICT that touches one row twice, and
    "last write wins" is what a caller appending changes through a tick means.
    """
    out: dict[str, T] = {}
    for v in values:
        out[getattr(v, key)] = v
    return list(out.values())


def check_constraints(changes: Changes) -> None:
    """Refuse what the database's CHECK constraints refuse (used by the memory store)."""
    for n in changes.nodes:
        if n.operator_state not in OPERATOR_STATES:
            raise StoreError(f"node {n.name}: operator_state {n.operator_state!r} is not allowed")
    for m in changes.models:
        if m.desired_replicas < 0:
            raise StoreError(f"model {m.name}: desired_replicas must be >= 0")
    for p in changes.replicas:
        if p.state not in REPLICA_STATES:
            raise StoreError(f"replica {p.id}: state {p.state!r} is not allowed")
        if p.restarts < 0:
            raise StoreError(f"replica {p.id}: restarts must be >= 0")
    for e in changes.events:
        if e.subject not in EVENT_SUBJECTS:
            raise StoreError(f"event {e.kind}: subject {e.subject!r} is not allowed")
