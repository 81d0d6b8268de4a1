"""The controller's domain model: plain frozen values, no I/O.

The controller keeps the whole fleet in memory (`FleetState`) and writes every
change through the store in one transaction per command or tick (`Changes`).
Pure modules (placement, summary, idle, reconcile decisions) read these values
and never see a database row or an HTTP request.

Times: `*_at` fields are unix seconds (they survive a restart and are shown to
people). Unknown is `None`, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.admin import NodeState, ReplicaState
from llmgw.wire.agent import GPU
from llmgw.wire.keys import ClientKey
from llmgw.wire.models import ModelSpec

OperatorState = Literal["active", "cordoned", "draining"]
ShardRunState = Literal["pending", "starting", "ready", "failed", "stopped", "sleeping"]

# Replica states that hold GPUs: a shard's cards stay given until its replica is
# stopped or failed, so nothing else is placed on them while an engine may still
# be running there.
# A sleeping replica holds its cards only while its engine has not fallen asleep
# yet (a shard still reported ready, SHARD_RUNNING); asleep, it leaves them to
# one awake replica and keeps only a little of their memory (placement/wakes.py).
HOLDS_GPUS: frozenset[ReplicaState] = frozenset(
    {"pending", "starting", "ready", "draining", "waking"}
)
# Shard states whose engine may be running. A stopped or failed replica whose
# agent last reported one of its shards so still holds that shard's cards: the
# engine is exiting (SIGTERM, then SIGKILL after a grace) and a new one started
# on the same cards meanwhile would run out of memory.
SHARD_RUNNING: frozenset[ShardRunState] = frozenset({"starting", "ready"})


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    # Where routers and peer shards reach this node's engines.
    address: str
    fabrics: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[GPU, ...] = ()
    # What the operator asked for; "unreachable" is derived, never stored.
    operator_state: OperatorState = "active"
    # Unix seconds of the last heartbeat; None if it never heartbeated.
    last_heartbeat_at: float | None = None
    # Unix seconds the node's agent process started (a change = agent restart).
    agent_started_at: float | None = None
    port_range: tuple[int, int] = (21000, 21999)
    # What the operator asked for with a drain (wire.admin.DrainRequest), kept
    # with the node so a restarted controller drains the way it was told.
    # Seconds each replica moved off this node may finish in-flight requests;
    # None: the controller's default grace.
    drain_grace_s: float | None = None
    # Replicas for which no replacement can be placed drain anyway (capacity
    # drops). False: they keep serving until a replacement fits.
    drain_force: bool = False
    # Known-idle replicas of other models may be evicted to make room for the
    # replacements that do not fit (DrainRequest.evict_idle).
    drain_evict_idle: bool = False
    # The host's memory in MiB as its agent reports it; None: not reported.
    host_memory_mib: int | None = None

    def shown_state(self, *, now: float, heartbeat_timeout_s: float) -> NodeState:
        """ready / cordoned / draining / unreachable.

        Unreachable wins over the operator's state: a cordoned node that stopped
        heartbeating is first of all a node nobody can reach.
        """
        if self.last_heartbeat_at is None or now - self.last_heartbeat_at > heartbeat_timeout_s:
            return "unreachable"
        if self.operator_state == "cordoned":
            return "cordoned"
        if self.operator_state == "draining":
            return "draining"
        return "ready"

    @property
    def gpu_class(self) -> str | None:
        """The node's GPU class; None when it has no GPUs. Mixed nodes take the first."""
        return self.gpus[0].gpu_class if self.gpus else None


@dataclass(frozen=True, slots=True)
class Model:
    spec: ModelSpec
    created_at: float
    updated_at: float
    # Current target replica count, between min and max (autoscaling, demand).
    desired_replicas: int

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True, slots=True)
class Adapter:
    """A LoRA adapter served as a model by its base's replicas (it has none of its own)."""

    spec: AdapterSpec
    # Unix seconds of the last apply that changed it.
    updated_at: float

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def base(self) -> str:
        return self.spec.adapter_of


@dataclass(frozen=True, slots=True)
class Shard:
    node: str
    rank: int
    gpus: tuple[int, ...]
    # Engine port the agent allocated; None until the agent reports it.
    port: int | None = None
    state: ShardRunState = "pending"
    pid: int | None = None
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()
    # The engine's key as its agent reported it (rank 0's goes to routers with
    # the endpoint list). Secret: no view, event or log shows it.
    api_key: str = field(default="", repr=False)
    # The engine's KV-event publisher as its agent reported it (a model with
    # routing.kv_events, rank 0): ports on the node's address and the topic.
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None
    kv_events_topic: str = ""
    # LoRA adapters its engine serves now, as its agent reported them (rank 0).
    adapters: tuple[str, ...] = ()
    # Its engine orders its queue by each request's `priority` (as its agent reported).
    priority_scheduling: bool = False
    # Its agent's word on the engine's last sleep or wake (ShardStatus.note); "": none.
    note: str = ""


@dataclass(frozen=True, slots=True)
class Replica:
    id: str
    model: str
    state: ReplicaState
    shards: tuple[Shard, ...]
    created_at: float
    # Unix seconds of the last state change (per-phase deadlines count from here).
    state_since: float
    updated_at: float
    reason: str | None = None
    # http://address:port of rank 0 once known.
    endpoint_url: str | None = None
    restarts: int = 0
    # "<fabric>/<gpu class>": routers weigh replicas within a pool.
    pool: str = ""
    # Capacity weight from `ctl bench` (its measured tokens/s, relative); 1.0 when never measured.
    weight: float = 1.0
    # The measurement behind the weight: peak generated tokens/s `ctl bench` saw.
    # None when never benched (or the weight was set by hand).
    capacity_tok_s: float | None = None
    # Make-before-break: the replica this one replaces; that one leaves the
    # endpoint list only once this one is ready.
    replaces: str | None = None
    # Failed replicas: when the next restart may happen (backoff).
    retry_at: float | None = None
    # Draining replicas: stopped by this time even if requests are in flight.
    drain_deadline: float | None = None
    # Multi-node rendezvous port (rank 0), chosen at placement.
    master_port: int | None = None
    # Sleeping replicas: the level they sleep at (1 or 2); None otherwise.
    sleep_level: int | None = None

    @property
    def gpu_count(self) -> int:
        return sum(len(s.gpus) for s in self.shards)

    @property
    def holds_gpus(self) -> bool:
        return self.state in HOLDS_GPUS or any(s.state in SHARD_RUNNING for s in self.shards)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Room being made for a model by eviction: its victims drain, their cards
    are held for it. Stored, so a restarted controller neither gives that room to
    another model nor evicts a second set for the same one."""

    model: str
    # Replicas drained for it; while any still holds cards, it evicts no more.
    victims: frozenset[str]
    # (node, GPU indices) where it will land (the eviction plan's placement):
    # other models may not take these cards as they free up.
    gpus: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class TenantKey:
    """A client key the controller manages (docs/tenants.md): its hash and limits, never
    the key itself, which was shown once when it was created."""

    key: ClientKey
    created_at: float
    # When it was revoked; None: in force. A revoked key's row stays (a tombstone):
    # while the controller holds any key row, routers require a key, so revoking
    # the last key does not open the routers to everyone.
    revoked_at: float | None = None

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def live(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class Event:
    """One transition with its reason: the answer to "why is my model not running"."""

    # Assigned by the store; 0 for an event not yet written.
    id: int
    at: float
    # e.g. "replica.placed", "replica.failed", "node.unreachable", "model.applied",
    # "replica.evicted", "model.unplaceable".
    kind: str
    subject: Literal["replica", "node", "model", "controller", "key"]
    subject_id: str
    model: str | None
    message: str


@dataclass(slots=True)
class FleetState:
    """Everything the controller knows, keyed by name/id. Mutated only by the leader."""

    nodes: dict[str, Node] = field(default_factory=dict)
    models: dict[str, Model] = field(default_factory=dict)
    replicas: dict[str, Replica] = field(default_factory=dict)
    # Specs of deleted models whose replicas still run (they drain): the heartbeat
    # answer needs a spec to describe those shards, and without it a restarted
    # controller would have the agents stop them abruptly.
    retired: dict[str, ModelSpec] = field(default_factory=dict)
    # Model → the room being made for it by eviction (Reservation).
    reservations: dict[str, Reservation] = field(default_factory=dict)
    # LoRA adapters by name; each one's base is in `models`.
    adapters: dict[str, Adapter] = field(default_factory=dict)
    # Client keys by name (what routers follow with the endpoint list).
    keys: dict[str, TenantKey] = field(default_factory=dict)

    def adapters_of(self, base: str) -> list[Adapter]:
        """`base`'s adapters, sorted by name."""
        return sorted((a for a in self.adapters.values() if a.base == base), key=lambda a: a.name)


@dataclass(slots=True)
class Changes:
    """One atomic write: the store applies all of it in one transaction or none of it."""

    nodes: list[Node] = field(default_factory=list)
    models: list[Model] = field(default_factory=list)
    replicas: list[Replica] = field(default_factory=list)
    deleted_nodes: list[str] = field(default_factory=list)
    deleted_models: list[str] = field(default_factory=list)
    deleted_replicas: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    # Upserted by spec name / model; deleted by name.
    retired: list[ModelSpec] = field(default_factory=list)
    deleted_retired: list[str] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    deleted_reservations: list[str] = field(default_factory=list)
    # Upserted / deleted by adapter name.
    adapters: list[Adapter] = field(default_factory=list)
    deleted_adapters: list[str] = field(default_factory=list)
    # Upserted / deleted (revoked) by key name.
    keys: list[TenantKey] = field(default_factory=list)
    deleted_keys: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return any(
            (
                self.nodes,
                self.models,
                self.replicas,
                self.deleted_nodes,
                self.deleted_models,
                self.deleted_replicas,
                self.events,
                self.retired,
                self.deleted_retired,
                self.reservations,
                self.deleted_reservations,
                self.adapters,
                self.deleted_adapters,
                self.keys,
                self.deleted_keys,
            )
        )
