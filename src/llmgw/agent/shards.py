"""What the supervisor keeps about each engine process it runs (supervisor.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmgw.agent.adapters import AdapterState
from llmgw.agent.engineprocs import ProcessHandle
from llmgw.agent.templates import KVEventPorts
from llmgw.wire.agent import ShardSpec, ShardState


@dataclass(slots=True)
class Shard:
    """One engine process of this node (a replica's rank), as the supervisor keeps it."""

    spec: ShardSpec
    port: int | None
    log_path: Path
    health_path: str | None
    state: ShardState
    # The engine's key (fresh per shard); the router sends it, nobody else sees it.
    api_key: str = ""
    # The KV-event publisher's ports (a shard whose spec has kv_events); held with the
    # engine port, and free again once the shard is dropped.
    kv_ports: KVEventPorts | None = None
    # The spec's env_from values as resolved at start: memory only, to mask log tails.
    secret_values: tuple[str, ...] = ()
    proc: ProcessHandle | None = None
    started_at: float | None = None
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()
    # Monotonic time SIGTERM went out; None while nobody asked it to stop.
    stop_sent_at: float | None = None
    kill_sent: bool = False
    # LoRA adapters the engine was started with (its flags), name → path, and once it
    # is ready what it serves (adapters.py); None before.
    started_adapters: dict[str, str] = field(default_factory=dict)
    adapters: AdapterState | None = None
    # Started with --scheduling-policy priority (templates.LaunchPlan).
    priority_scheduling: bool = False
    # The agent's word on its last sleep or wake (ShardStatus.note); "": none.
    note: str = ""
    # Why the agent itself ended this engine as it started (the last line of its log
    # tail once it has exited, which then fails rather than stops); "": it did not.
    failure: str = ""

    @property
    def key(self) -> tuple[str, int]:
        return (self.spec.replica_id, self.spec.rank)
