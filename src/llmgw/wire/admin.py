"""The controller's admin API shapes (docs/controller.md), read by `llmgw ctl`.

JSON field names are part of the contract: `ctl --json` prints these. Unknown
idle time is a negative number in JSON (`-1`), written only by
`idle_seconds_json`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.agent import GPU, SecretRef
from llmgw.wire.models import ModelSpec, RoutingSpec
from llmgw.wire.usage import FlowQueued

NodeState = Literal["ready", "cordoned", "draining", "unreachable"]
# sleeping: the engine runs but sleeps (its cards are free for another replica);
# waking: told to wake, not serving yet (docs/sleep-and-adapters.md).
ReplicaState = Literal[
    "pending", "starting", "ready", "draining", "stopped", "failed", "sleeping", "waking"
]

# `GET /admin/keys` and `GET /admin/models` answer in pages, by name (docs/controller.md,
# "Pages"): `limit` rows when not given, at most MAX_PAGE_LIMIT when given. A page that
# is not the last says so in a `Link: <…?after=NAME&limit=N>; rel="next"` header; the
# body stays a plain list, so a client from before pages still reads it.
DEFAULT_PAGE_LIMIT = 1_000
MAX_PAGE_LIMIT = 10_000


def idle_seconds_json(idle_s: float | None) -> int:
    """The one place unknown idleness becomes the JSON sentinel -1."""
    return -1 if idle_s is None else int(idle_s)


class DrainWait(msgspec.Struct, frozen=True, kw_only=True):
    """A replica a node's drain still waits for, and why (NodeView.drain_waiting)."""

    replica: str
    model: str
    # What it waits for, in words: its replacement starting, its in-flight
    # requests, or why no replacement can be placed.
    reason: str
    # True when nothing changes without capacity or the operator: no replacement
    # fits and the drain is not forced, so the replica keeps serving (DrainRequest.force).
    blocked: bool = False


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    address: str
    # A NodeState; a str, not the Literal, in views: ctl reads them from a controller
    # that may be newer, and one new state refused the whole list (ReplicaView.state).
    state: str
    fabrics: tuple[str, ...]
    labels: dict[str, str]
    gpus: tuple[GPU, ...]
    # Indices of GPUs given to shards of live replicas.
    gpus_used: tuple[int, ...]
    # Unix seconds; None if the node never heartbeated.
    last_heartbeat: float | None
    # GPU classes of the node's cards (one in practice).
    classes: tuple[str, ...]
    gpu_total: int
    gpu_free: int
    unhealthy: tuple[int, ...]
    # A draining node's drain request: grace per replica (None: the controller's
    # default) and whether it is forced. None / False when not draining.
    drain_grace_s: float | None = None
    drain_force: bool = False
    # A draining node's drain may evict known-idle replicas of other models
    # (DrainRequest.evict_idle). False when not draining.
    drain_evict_idle: bool = False
    # A draining node: every replica still holding its cards, by id, with why.
    drain_waiting: tuple[DrainWait, ...] = ()


class ShardView(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    rank: int
    gpus: tuple[int, ...]
    port: int | None
    state: str
    pid: int | None = None
    exit_code: int | None = None
    # The engine's KV-event publisher and replay ports (a model with
    # routing.kv_events, rank 0); None otherwise.
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None
    # The agent's word on the engine's last sleep or wake (a warm-up that failed, a
    # sleep postponed for requests still there); "": none.
    note: str = ""


class ReplicaView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    model: str
    # A ReplicaState; a str, not the Literal: ctl reads views from a controller that
    # may be newer (controllers are upgraded first), and one replica in a state added
    # since (as sleeping was) failed `ctl replicas` whole. ctl shows it as it is.
    state: str
    reason: str | None
    shards: tuple[ShardView, ...]
    # Rank 0's address once it is known.
    endpoint_url: str | None
    created_at: float
    updated_at: float
    restarts: int
    # Seconds since a router last dispatched here; -1 when no router has reported it.
    idle_seconds: int
    pool: str
    weight: float
    # Peak generated tokens/s `ctl bench` measured (docs/ctl.md); None when never benched.
    # Kept beside the weight because weights are relative: the next replica benched
    # is normalized against the raw capacities of those benched before it.
    capacity_tok_s: float | None = None
    # The level a sleeping replica sleeps at (1: weights in host memory, 2: dropped);
    # None while awake.
    sleep_level: int | None = None


class ModelView(msgspec.Struct, frozen=True, kw_only=True):
    spec: ModelSpec
    name: str
    ready: int
    # Replicas not stopped: pending, starting, ready, draining, failed-awaiting-restart.
    total: int
    min: int
    max: int
    # Current desired replica count (min, demand, autoscaling).
    desired: int
    # Why it cannot be placed, when it cannot; None otherwise.
    unplaceable_reason: str | None = None
    # LoRA adapters served by this model's replicas, sorted by name.
    adapters: tuple[AdapterSpec, ...] = ()


class _RoutingRead(RoutingSpec, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """A spec's routing as ModelViewRead reads it."""


class _SecretRefRead(SecretRef, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """A secret reference as ModelViewRead reads it: one of a kind added since has
    neither `env` nor `file`."""

    def __post_init__(self) -> None:
        pass


class _SpecRead(ModelSpec, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """A spec as ModelViewRead reads it: shown, never acted on.

    Its engine, sleep level and secret references are read as they come, not as this
    version's Literals, and this version's rules across fields are not applied: each
    value or rule a newer controller added (an engine kind) failed `ctl models` whole.
    The Literals are the operator's, checked where a spec comes in.
    """

    # The ignores widen ModelSpec's Literals for this view only (see the docstring).
    engine: str  # type: ignore[assignment]
    sleep_level: int | None = None  # type: ignore[assignment]
    env_from: dict[str, _SecretRefRead] = msgspec.field(default_factory=dict)  # type: ignore[assignment]
    routing: _RoutingRead = _RoutingRead()

    def __post_init__(self) -> None:
        pass


class _AdapterRead(AdapterSpec, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """An adapter as ModelViewRead reads it."""


class ModelViewRead(ModelView, frozen=True, kw_only=True):
    """A ModelView as ctl decodes it: what its spec holds that this version does not
    know is left out.

    A spec an operator sends refuses unknown fields (a typo is an error); the same
    spec in a view comes from a controller that may be newer (controllers are upgraded
    first), which encodes every spec field: each field a version added failed `ctl
    models`, and `ctl apply` after the specs were applied.
    """

    spec: _SpecRead
    adapters: tuple[_AdapterRead, ...] = ()


class EventView(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    at: float
    kind: str
    # What the event is about: "replica", "node", "model", "controller".
    subject: str
    subject_id: str
    model: str | None
    message: str


class NodeTotals(msgspec.Struct, kw_only=True):
    total: int = 0
    ready: int = 0
    cordoned: int = 0
    draining: int = 0
    unreachable: int = 0


class ClassUse(msgspec.Struct, kw_only=True):
    # Field names are part of the JSON contract (`ctl status --json`).
    gpu_class: str = msgspec.field(name="class")
    total: int = 0
    used: int = 0
    # Neither used nor free: counting them free is how a cluster looks like it has
    # room it does not.
    unhealthy: int = 0

    @property
    def free(self) -> int:
        return self.total - self.used - self.unhealthy


class FabricUse(msgspec.Struct, kw_only=True):
    fabric: str
    nodes: int = 0
    # Nodes on this fabric that are ready and entirely free: what decides whether a
    # multi-node replica can land.
    largest_free_block: int = 0


class ReplicaTotal(msgspec.Struct, kw_only=True):
    ready: int = 0
    starting: int = 0
    draining: int = 0
    failed: int = 0
    # Engines asleep (their cards free for others), and those waking.
    sleeping: int = 0
    waking: int = 0


class ModelTotals(msgspec.Struct, kw_only=True):
    total: int = 0
    satisfied: int = 0
    short: int = 0


class IdleReplica(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    model: str
    idle_seconds: int
    gpus: int


class UnplaceableModel(msgspec.Struct, frozen=True, kw_only=True):
    """Beside `Summary.unplaceable` (names): the reason, for ctl."""

    model: str
    reason: str


class WaitingModel(msgspec.Struct, frozen=True, kw_only=True):
    """A model that routers have requests for but that cannot be placed (nothing to
    evict either): those requests are refused at once with `reason`."""

    model: str
    # Requests the routers held or refused for it in their last reports.
    requests: int
    reason: str


class Summary(msgspec.Struct, kw_only=True):
    """The whole fleet in one answer (docs/controller.md)."""

    nodes: NodeTotals = msgspec.field(default_factory=NodeTotals)
    gpus: list[ClassUse] = msgspec.field(default_factory=list)
    fabrics: list[FabricUse] = msgspec.field(default_factory=list)
    replicas: ReplicaTotal = msgspec.field(default_factory=ReplicaTotal)
    models: ModelTotals = msgspec.field(default_factory=ModelTotals)
    unplaceable: list[str] = msgspec.field(default_factory=list)
    idle_replicas: list[IdleReplica] = msgspec.field(default_factory=list)
    # The reasons behind `unplaceable`, same order.
    unplaceable_reasons: list[UnplaceableModel] = msgspec.field(default_factory=list)
    # Models asked for that cannot be placed (any min_replicas, unlike `unplaceable`,
    # whose rule counts only models short of min_replicas), by name.
    waiting_unplaceable: list[WaitingModel] = msgspec.field(default_factory=list)
    # Requests waiting in the routers' flow control (every replica of their model at
    # capacity), by band and team, summed over the routers reporting; only those with any.
    flow_queued: list[FlowQueued] = msgspec.field(default_factory=list)


class DrainRequest(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """`POST /admin/nodes/{name}/drain`. Defaults are not sent, so a ctl that does not
    ask for a newer option still talks to a controller that predates it."""

    # Seconds a draining replica may keep in-flight requests before it is stopped.
    # UNSET (not sent): the controller's configured --drain-grace-s.
    grace_s: Annotated[float, msgspec.Meta(ge=0)] | msgspec.UnsetType = msgspec.UNSET
    # False: a replica whose replacement cannot be placed keeps serving, and the
    # drain waits (NodeView.drain_waiting says why). True: such replicas drain
    # anyway, and the fleet serves with less capacity.
    force: bool = False
    # True: a replica whose replacement cannot be placed may have known-idle
    # replicas of other models evicted to make room for it (the same rules as
    # eviction for a model that cannot be placed: never below a model's
    # min_replicas, never a replica whose idleness is unknown, never a higher
    # priority). With `force` too, eviction is tried first.
    evict_idle: bool = False


class WeightRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /admin/replicas/{id}/weight`: the capacity weight `ctl bench` measured."""

    weight: float
    # The raw measurement behind the weight (peak generated tokens/s); stored and
    # echoed in ReplicaView.capacity_tok_s. None: a weight set by hand.
    capacity_tok_s: float | None = None


class EngineKey(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /admin/replicas/{id}/engine-key` (admin token only): the key the replica's
    engine requires, so `ctl bench` can load it directly. Secret: repr() masks it, and
    nothing that holds one prints it."""

    replica: str
    api_key: str

    def __repr__(self) -> str:
        return f"EngineKey(replica={self.replica!r}, api_key='***')"
