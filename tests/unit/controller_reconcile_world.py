"""A small fleet for reconcile unit tests: plain state, a manual clock, ticks applied in memory.

`World.tick()` runs the pure planner and adopts its changes exactly as the
leader would after the store committed them (upserts, then deletes, index in
step), so tests read the state a real controller would hold.
"""

from __future__ import annotations

import dataclasses
import itertools

from llmgw.controller.config import ControllerConfig
from llmgw.controller.fleet.agents import Backoff, HeartbeatOrder, absorb_heartbeat, desired_shards
from llmgw.controller.fleet.index import FleetIndex
from llmgw.controller.fleet.records import Changes, FleetState, Model, Node, OperatorState, Replica
from llmgw.controller.idle import IdleTracker
from llmgw.controller.tick.carryover import TickMemory
from llmgw.controller.tick.plan import Plan, plan_tick
from llmgw.runtime.clock import ManualClock
from llmgw.wire.admin import ReplicaState
from llmgw.wire.agent import Heartbeat, ShardSpec, ShardState, ShardStatus
from llmgw.wire.models import ModelSpec
from llmgw.wire.usage import ModelLoad, UsageReport

# One set of state builders for every controller unit test; re-exported here
# because the reconcile tests build their worlds and specs from one import.
from tests.unit.controller_fleet import gpus, spec

__all__ = ["CONFIG", "World", "gpus", "spec"]

CONFIG = ControllerConfig(
    tick_s=1.0,
    heartbeat_timeout_s=10.0,
    unreachable_grace_s=30.0,
    starting_deadline_s=60.0,
    drain_grace_s=30.0,
    restart_backoff_s=5.0,
    restart_backoff_max_s=40.0,
    target_inflight_per_replica=10.0,
    scale_down_cooldown_s=100.0,
    stopped_retention_s=600.0,
)


class World:
    def __init__(self, config: ControllerConfig = CONFIG) -> None:
        self.clock = ManualClock()
        self.config = config
        self.state = FleetState()
        self.index = FleetIndex()
        self.usage = IdleTracker(clock=self.clock, fresh_s=1e9)
        # Leading for a long while already: no start-up grace unless a test wants one.
        self.memory = TickMemory(leader_since=self.clock.wall() - 10_000)
        self._ids = itertools.count(1)
        self.events: list[str] = []
        self.backoff = Backoff(base_s=config.restart_backoff_s, cap_s=config.restart_backoff_max_s)
        self.order = HeartbeatOrder()

    @property
    def now(self) -> float:
        return self.clock.wall()

    def new_id(self) -> str:
        return f"r-{next(self._ids):03d}"

    # -- building -------------------------------------------------------------

    def node(
        self,
        name: str,
        count: int = 8,
        *,
        fabrics: tuple[str, ...] = ("ib0",),
        op: OperatorState = "active",
        silent_s: float = 0.0,
    ) -> Node:
        n = Node(
            name=name,
            address=f"{name}.lan",
            fabrics=fabrics,
            gpus=gpus(count),
            operator_state=op,
            last_heartbeat_at=self.now - silent_s,
        )
        self.state.nodes[name] = n
        return n

    def model(self, s: ModelSpec, *, desired: int | None = None) -> Model:
        m = Model(
            spec=s,
            created_at=self.now,
            updated_at=self.now,
            desired_replicas=s.min_replicas if desired is None else desired,
        )
        self.state.models[s.name] = m
        return m

    def set_node(self, name: str, **fields: object) -> None:
        self.state.nodes[name] = dataclasses.replace(self.state.nodes[name], **fields)  # type: ignore[arg-type]

    def touch(self, *names: str) -> None:
        """Heartbeat timestamps only (what the fleet does in memory)."""
        for name in names:
            self.set_node(name, last_heartbeat_at=self.now)

    # -- acting ---------------------------------------------------------------

    def apply(self, changes: Changes) -> None:
        s = self.state
        for n in changes.nodes:
            s.nodes[n.name] = n
        for m in changes.models:
            s.models[m.name] = m
        for r in changes.replicas:
            self.index.put(s.replicas.get(r.id), r)
            s.replicas[r.id] = r
        for name in changes.deleted_models:
            s.models.pop(name, None)
        s.adapters.update((a.name, a) for a in changes.adapters)
        for name in changes.deleted_adapters:
            s.adapters.pop(name, None)
        for rid in changes.deleted_replicas:
            self.index.put(s.replicas.pop(rid, None), None)
        s.retired.update((m.name, m) for m in changes.retired)
        s.reservations.update((h.model, h) for h in changes.reservations)
        for name in changes.deleted_retired:
            s.retired.pop(name, None)
        for name in changes.deleted_reservations:
            s.reservations.pop(name, None)
        self.events.extend(f"{e.kind} {e.subject_id}: {e.message}" for e in changes.events)

    def tick(self) -> Plan:
        plan = plan_tick(
            self.state,
            self.index,
            self.usage,
            self.memory,
            now=self.now,
            config=self.config,
            new_id=self.new_id,
        )
        self.apply(plan.changes)
        self.memory = plan.memory
        return plan

    def heartbeat(
        self,
        node: str,
        shards: dict[str, ShardState] | None = None,
        *,
        port: int = 9000,
        seq: int = 0,
        started_at: float = 0.0,
        kv_ports: dict[str, tuple[int, int]] | None = None,
        priority: frozenset[str] = frozenset(),
        notes: dict[str, str] | None = None,
    ) -> tuple[ShardSpec, ...]:
        """Post a heartbeat for `node` reporting each (replica id → state) of its shards.

        `kv_ports`: replica id → (publish, replay) ports of its KV-event publisher;
        `priority`: the replicas whose engine was started with priority scheduling;
        `notes`: replica id → the agent's note on its shard.
        A stale one (HeartbeatOrder) is answered without being applied, as the fleet does.
        """
        n = self.state.nodes[node]
        statuses = []
        for i, (rid, st) in enumerate(sorted((shards or {}).items())):
            rank = next(s.rank for s in self.state.replicas[rid].shards if s.node == node)
            statuses.append(
                ShardStatus(
                    replica_id=rid,
                    rank=rank,
                    state=st,
                    port=port + i,
                    exit_code=1 if st == "failed" else None,
                    log_tail=("CUDA out of memory",) if st == "failed" else (),
                    kv_events_port=(kv_ports or {}).get(rid, (None, None))[0],
                    kv_events_replay_port=(kv_ports or {}).get(rid, (None, None))[1],
                    kv_events_topic=rid if rid in (kv_ports or {}) else "",
                    priority_scheduling=rid in priority,
                    note=(notes or {}).get(rid, ""),
                )
            )
        hb = Heartbeat(
            node=node,
            address=n.address,
            gpus=n.gpus,
            fabrics=n.fabrics,
            shards=tuple(statuses),
            agent_started_at=started_at,
            seq=seq,
            host_memory_mib=n.host_memory_mib,
        )
        if self.order.is_stale(hb):
            return desired_shards(self.state, self.index, node, retired={})
        absorbed = absorb_heartbeat(self.state, self.index, hb, now=self.now, backoff=self.backoff)
        self.apply(absorbed.batch.changes)
        self.state.nodes[node] = absorbed.node
        self.order.applied(hb)
        return desired_shards(self.state, self.index, node, retired={})

    def report(
        self,
        *,
        last_used: dict[str, float] | None = None,
        inflight: dict[str, int] | None = None,
        demand: dict[str, int] | None = None,
        load: dict[str, ModelLoad] | None = None,
        router: str = "router-1",
    ) -> None:
        self.usage.ingest(
            UsageReport(
                router_id=router,
                sent_at=self.now,
                last_used=last_used or {},
                inflight=inflight or {},
                demand=demand or {},
                load=load or {},
            )
        )

    # -- reading --------------------------------------------------------------

    def replicas(
        self, model: str | None = None, state: ReplicaState | None = None
    ) -> list[Replica]:
        return sorted(
            (
                r
                for r in self.state.replicas.values()
                if (model is None or r.model == model) and (state is None or r.state == state)
            ),
            key=lambda r: r.id,
        )

    def only(self, model: str | None = None, state: ReplicaState | None = None) -> Replica:
        found = self.replicas(model, state)
        assert len(found) == 1, found
        return found[0]

    def ready_all(self, model: str | None = None) -> None:
        """Every pending/starting replica's agents report all shards ready."""
        by_node: dict[str, dict[str, ShardState]] = {}
        for r in self.replicas(model):
            if r.state in ("pending", "starting"):
                for s in r.shards:
                    by_node.setdefault(s.node, {})[r.id] = "ready"
        for node, shards in by_node.items():
            running = {
                rid: "ready"
                for rid in self.index.on_node(node)
                if self.state.replicas[rid].state in ("ready", "draining")
            }
            self.heartbeat(node, {**running, **shards})  # type: ignore[dict-item]
