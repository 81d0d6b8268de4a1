"""The agent protocol (docs/architecture.md): `POST /v1/agents/{node}/heartbeat`.

The agent reports what is (inventory, shard status); the answer says what should
be (the shards this node runs). Desired state, not commands, so a repeated or
late heartbeat can never double-start anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

import msgspec

from llmgw.wire.logs import LogAnswer, LogAsk
from llmgw.wire.policy import SpecPolicy

# Constraints the published schema carries (the controller's /openapi.json); the
# controller's edge checks (api/validate.py) add what spans fields.
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
# Memory in MiB, up to an exbibyte: larger is a typo, and the store keeps it in a
# 64-bit column.
MiB = Annotated[int, msgspec.Meta(ge=0, le=2**40)]

# sleeping: the engine runs and sleeps (it was told to, ShardSpec.sleep_level).
ShardState = Literal["starting", "ready", "failed", "stopped", "sleeping"]
EngineKind = Literal["vllm", "sglang", "llamacpp", "sim"]


# The most GPUs a fake inventory (agent --gpus, up's fleet file) may give one node: far
# above any real node. `99999999999999999999xH100-80G` was built one GPU at a time,
# the agent growing without end before it ever said a word.
MAX_FAKE_GPUS = 1024


class GPU(msgspec.Struct, frozen=True, kw_only=True):
    index: NonNegInt
    uuid: str
    # Marketing name as NVML reports it, e.g. "NVIDIA H100 80GB HBM3".
    name: str
    # Placement class, e.g. "H100-80G" (agent.gpus derives it from name and memory).
    gpu_class: str
    memory_mib: MiB
    healthy: bool = True
    # Why not healthy (critical XID, uncorrectable ECC, injected fault); None when healthy.
    reason: str | None = None


class ShardStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What the agent knows of one shard it runs (or ran)."""

    replica_id: str
    rank: NonNegInt
    state: ShardState
    port: Port | None = None
    pid: int | None = None
    # Set when state is "failed" or "stopped" after the process exited.
    exit_code: int | None = None
    # Last lines of the engine's log, for "why did it fail".
    log_tail: tuple[str, ...] = ()
    # Unix seconds the process started; None before it did.
    started_at: float | None = None
    # The key the engine was started with (the router needs it; rank 0's is the
    # replica's). "": an engine without one. Secret: repr() masks it.
    api_key: str = ""
    # The engine's KV-event publisher (a shard started with `kv_events`): the PUB and
    # replay ports on the node's address, and the topic; None / "" otherwise.
    kv_events_port: Port | None = None
    kv_events_replay_port: Port | None = None
    kv_events_topic: str = ""
    # LoRA adapters the engine serves now (rank 0), by name: loaded at start or at run
    # time. Empty: none, or an agent that does not report them.
    adapters: tuple[str, ...] = ()
    # The engine was started ordering its queue by each request's `priority` field
    # (vLLM's --scheduling-policy priority). False: FCFS, or an agent that does not say.
    priority_scheduling: bool = False
    # What the agent has to say about the engine's last sleep or wake, in words: a
    # warm-up that failed (the engine serves without it), a sleep postponed for the
    # requests still there. "": nothing, or an agent that does not say.
    note: str = ""

    def __repr__(self) -> str:
        key = "'***'" if self.api_key else "''"
        return (
            f"ShardStatus(replica_id={self.replica_id!r}, rank={self.rank!r}, "
            f"state={self.state!r}, port={self.port!r}, pid={self.pid!r}, "
            f"exit_code={self.exit_code!r}, log_tail={self.log_tail!r}, "
            f"started_at={self.started_at!r}, api_key={key}, "
            f"kv_events_port={self.kv_events_port!r}, "
            f"kv_events_replay_port={self.kv_events_replay_port!r}, "
            f"kv_events_topic={self.kv_events_topic!r}, adapters={self.adapters!r}, "
            f"priority_scheduling={self.priority_scheduling!r}, note={self.note!r})"
        )


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    # Host name or IP that routers and peer shards reach this node's engines on.
    address: Annotated[str, msgspec.Meta(pattern=r"\S")]
    gpus: tuple[GPU, ...]
    fabrics: tuple[str, ...] = ()
    labels: dict[str, str] = {}
    shards: tuple[ShardStatus, ...] = ()
    # Unix seconds the agent process started; a change means the agent restarted.
    agent_started_at: float = 0.0
    # Strictly increasing per agent process, from 1; with agent_started_at it
    # orders heartbeats, so the controller can ignore one delivered after a newer
    # one. 0: an agent that does not number them (always applied).
    seq: NonNegInt = 0
    # Inclusive port range the agent allocates engine ports from.
    port_range: tuple[Port, Port] = (21000, 21999)
    # What specs may set on this node (the controller refuses, at apply time, a spec
    # no node would run); None: an agent that does not say.
    policy: SpecPolicy | None = None
    # The node's host memory in MiB (/proc/meminfo MemTotal, or the agent's
    # --host-memory-mib on a fake node): what level-1 sleeps may fill with weights.
    # None: an agent that does not say (no level-1 sleep is planned there).
    host_memory_mib: MiB | None = None
    # Answers to the log asks of the controller's last reply (wire/logs.py).
    log_answers: tuple[LogAnswer, ...] = ()


# An environment variable's name, as a shell and execve take it.
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
EnvName = Annotated[str, msgspec.Meta(pattern=ENV_NAME_PATTERN)]


class SecretRef(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Where the agent reads one secret on its own node: exactly one of `env`, `file`.

    A reference, never a value: the controller stores and shows the reference, the agent
    resolves it just before it starts the engine (docs/security.md, "Secrets in specs").
    Unknown fields are refused even on the agent's side: an agent that does not know a
    kind of reference must not start the engine without its secret. It fails that shard
    (agent/replyread.py; the rest of the answer is acted on), so a new kind of reference
    needs agents upgraded before specs use it.
    """

    # A variable of the agent's own environment.
    env: EnvName | None = None
    # An absolute path on the node; its content, less one trailing newline.
    file: Annotated[str, msgspec.Meta(pattern=r"^/")] | None = None

    def __post_init__(self) -> None:
        if (self.env is None) == (self.file is None):
            raise ValueError("a secret reference names exactly one of env or file")


def env_sources(refs: Mapping[str, SecretRef]) -> dict[str, str]:
    """The agent's variable each `{env: VAR}` reference reads, by the spec's name: what
    the agent's secret_env must list (SpecPolicy.refusal)."""
    return {name: ref.env for name, ref in refs.items() if ref.env is not None}


class ShardSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One shard this node should run. Identity is (replica_id, rank)."""

    replica_id: str
    rank: NonNegInt
    # Shards in the replica (nodes per replica); 1 for single-node replicas.
    world_size: int = 1
    model: str
    # Served name first, then aliases (vLLM --served-model-name takes them all).
    served_names: tuple[str, ...]
    engine: EngineKind
    gpu_indices: tuple[int, ...]
    # Extra engine arguments and environment from the model spec.
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    # Secret variables the agent resolves on the node (the model spec's `env_from`).
    env_from: dict[str, SecretRef] = {}
    # Multi-node rendezvous: rank 0's node address and a port chosen by the
    # controller; None for single-node replicas.
    master_addr: str | None = None
    master_port: int | None = None
    # Start the engine with its KV-event publisher (the model spec's
    # `routing.kv_events`; rank 0 only, where the scheduler runs). An agent that does
    # not know the field ignores it: the engine runs, routers guess.
    kv_events: bool = False
    # The model may sleep (spec sleep_mode): the engine is started able to
    # (vLLM: --enable-sleep-mode and its dev-mode routes behind the engine key).
    sleep_mode: bool = False
    # Sleep at this level (1 or 2) now; None: be awake (wake and warm up first).
    sleep_level: int | None = None
    # The base's LoRA adapters, name → source path (docs/sleep-and-adapters.md). Not
    # part of the shard's identity: a change never restarts the engine; the agent
    # loads and unloads them at run time where the engine allows it, else the list
    # as it was at start stays. An agent that does not know the field serves none.
    adapters: dict[str, str] = {}


class HeartbeatReply(msgspec.Struct, frozen=True, kw_only=True):
    """The controller's answer to a heartbeat. The agent reads it shard by shard
    (agent/replyread.py): a shard it cannot read (an engine kind added since) fails
    alone."""

    # The complete desired set for this node: start what is missing, stop what is
    # not listed.
    shards: tuple[ShardSpec, ...]
    # Seconds until the controller expects the next heartbeat.
    interval_s: float = 2.0
    # Engine logs an operator asked for (wire/logs.py): answered by the next heartbeat,
    # sent at once. Repeated in every reply until answered or given up.
    log_asks: tuple[LogAsk, ...] = ()
