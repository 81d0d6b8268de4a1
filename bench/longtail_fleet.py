"""The simulated fleet of bench/longtail.py: the real controller, simulated agents and a router.

The controller is the real one minus I/O: `plan_tick` (placement, eviction, swaps,
autoscaling), `absorb_heartbeat` and `desired_shards` (the agent protocol), the
`IdleTracker` fed with usage reports and `outlook` (what routers are told), on a
manual clock, with the tick's changes adopted as the leader adopts them once stored.
Agents and engines are simulated by time alone: a started engine is ready after its
cold start, one told to sleep is asleep after its sleep time, one told to wake is
ready after its wake time plus a one-token warm-up, one told to stop is gone after a
stop grace. Heartbeats, usage reports and ticks run at their configured intervals,
so the control loop's own delays are part of every figure.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from llmgw.controller.config import ControllerConfig
from llmgw.controller.fleet.agents import (
    Backoff,
    absorb_heartbeat,
    desired_shards,
    heartbeat_interval_s,
)
from llmgw.controller.fleet.endpoints import outlook
from llmgw.controller.fleet.index import FleetIndex
from llmgw.controller.fleet.records import Changes, FleetState, Model, Node
from llmgw.controller.idle import IdleTracker
from llmgw.controller.tick.carryover import TickMemory
from llmgw.controller.tick.plan import plan_tick
from llmgw.runtime.clock import ManualClock
from llmgw.wire.agent import GPU, Heartbeat, ShardSpec, ShardStatus
from llmgw.wire.endpoints import ModelOutlook
from llmgw.wire.models import ModelSpec
from llmgw.wire.usage import ModelLoad, UsageReport

WARM_UP_S = 0.2  # the agent's one-token request after a wake
STOP_S = 2.0  # an engine told to stop is gone after this long


@dataclass(frozen=True)
class Timing:
    """One model's engine timings (seconds)."""

    cold_s: float
    sleep_s: float
    wake_s: float


@dataclass
class Engine:
    """One simulated shard on a node."""

    spec: ShardSpec
    state: str  # starting, ready, sleeping, stopped
    # When the current transition ends (start, sleep, wake, stop); None: none under way.
    until: float | None
    doing: str = ""  # "start", "sleep", "wake", "stop"


@dataclass
class Controller:
    """The real controller's pure parts on a manual clock."""

    config: ControllerConfig
    clock: ManualClock = field(default_factory=ManualClock)
    state: FleetState = field(default_factory=FleetState)
    index: FleetIndex = field(default_factory=FleetIndex)
    usage: IdleTracker = field(init=False)
    memory: TickMemory = field(init=False)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    events: list[tuple[float, str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.usage = IdleTracker(clock=self.clock, fresh_s=10.0)
        self.memory = TickMemory(leader_since=self.clock.wall() - 10_000)

    @property
    def now(self) -> float:
        return self.clock.wall()

    def apply(self, changes: Changes) -> None:
        s = self.state
        for n in changes.nodes:
            s.nodes[n.name] = n
        for m in changes.models:
            s.models[m.name] = m
        for r in changes.replicas:
            self.index.put(s.replicas.get(r.id), r)
            s.replicas[r.id] = r
        for rid in changes.deleted_replicas:
            self.index.put(s.replicas.pop(rid, None), None)
            self.usage.forget(rid)
        s.reservations.update((h.model, h) for h in changes.reservations)
        for name in changes.deleted_reservations:
            s.reservations.pop(name, None)
        self.events.extend((self.now, e.kind, e.subject_id, e.message) for e in changes.events)

    def tick(self) -> None:
        plan = plan_tick(
            self.state,
            self.index,
            self.usage,
            self.memory,
            now=self.now,
            config=self.config,
            new_id=lambda: f"r{next(self.ids):05d}",
        )
        self.apply(plan.changes)
        self.memory = plan.memory

    def heartbeat(self, hb: Heartbeat) -> tuple[tuple[ShardSpec, ...], float]:
        """The desired shards, and how soon the next heartbeat is wanted."""
        backoff = Backoff(base_s=self.config.restart_backoff_s, cap_s=60.0)
        absorbed = absorb_heartbeat(self.state, self.index, hb, now=self.now, backoff=backoff)
        self.apply(absorbed.batch.changes)
        self.state.nodes[hb.node] = absorbed.node
        shards = desired_shards(self.state, self.index, hb.node, retired={})
        base = self.config.heartbeat_interval_s
        return shards, heartbeat_interval_s(self.state, self.index, hb.node, base_s=base)

    def outlook(self) -> dict[str, ModelOutlook]:
        looks = outlook(
            self.state,
            self.index,
            unplaceable={k: u.reason for k, u in self.memory.unplaceable.items()},
            evicting=self.memory.evicting,
            now=self.now,
            idle_enough_at=self.memory.idle_enough_at,
        )
        return {name: o for o in looks for name in o.models}


@dataclass
class Agent:
    """One node's simulated agent: engines by (replica, rank), driven by the desired list."""

    node: str
    gpus: tuple[GPU, ...]
    host_memory_mib: int
    timing: dict[str, Timing]
    engines: dict[tuple[str, int], Engine] = field(default_factory=dict)
    next_heartbeat: float = 0.0

    def advance(self, now: float) -> None:
        """Finish the transitions whose time has come."""
        for key, e in list(self.engines.items()):
            if e.until is None or now < e.until:
                continue
            if e.doing == "start" or e.doing == "wake":
                e.state = "ready"
            elif e.doing == "sleep":
                e.state = "sleeping"
            elif e.doing == "stop":
                del self.engines[key]
                continue
            e.until, e.doing = None, ""
        self._wakes(now)

    def heartbeat(self, now: float) -> Heartbeat:
        return Heartbeat(
            node=self.node,
            address=f"{self.node}.lan",
            gpus=self.gpus,
            shards=tuple(
                ShardStatus(replica_id=rid, rank=rank, state=e.state, port=20000 + i)  # type: ignore[arg-type]
                for i, ((rid, rank), e) in enumerate(sorted(self.engines.items()))
            ),
            host_memory_mib=self.host_memory_mib,
        )

    def apply(self, desired: Iterable[ShardSpec], now: float) -> None:
        want = {(s.replica_id, s.rank): s for s in desired}
        for key, gone in self.engines.items():
            if key not in want and gone.doing != "stop":
                gone.doing, gone.until = "stop", now + STOP_S
        for key, spec in want.items():
            t = self.timing[spec.served_names[0]]
            e = self.engines.get(key)
            if e is None:
                self.engines[key] = Engine(spec, "starting", now + t.cold_s, "start")
                continue
            e.spec = spec
            if e.doing:
                continue  # one thing at a time, as the agent's tick does
            if e.state == "ready" and spec.sleep_level is not None:
                e.doing, e.until = "sleep", now + t.sleep_s
        self._wakes(now)

    def _wakes(self, now: float) -> None:
        """Wake what is listed awake once no other engine is awake on its cards."""
        for e in self.engines.values():
            if e.doing or e.state != "sleeping" or e.spec.sleep_level is not None:
                continue
            mine = set(e.spec.gpu_indices)
            if any(
                o is not e
                and (o.state in ("starting", "ready") or o.doing in ("start", "wake"))
                and mine & set(o.spec.gpu_indices)
                for o in self.engines.values()
            ):
                continue
            t = self.timing[e.spec.served_names[0]]
            e.doing, e.until = "wake", now + t.wake_s + WARM_UP_S

    def awake_cards(self) -> int:
        """Cards an engine holds awake (starting, serving, or on its way to or from sleep)."""
        return sum(
            len(e.spec.gpu_indices)
            for e in self.engines.values()
            if e.state in ("starting", "ready") or e.doing in ("wake", "start")
        )


def h100s(count: int) -> tuple[GPU, ...]:
    return tuple(
        GPU(index=i, uuid=f"GPU-{i}", name="H100", gpu_class="H100-80G", memory_mib=81_559)
        for i in range(count)
    )


def add_models(c: Controller, specs: Iterable[ModelSpec]) -> None:
    for s in specs:
        c.state.models[s.name] = Model(spec=s, created_at=0.0, updated_at=0.0, desired_replicas=0)


def add_node(c: Controller, name: str, gpus: tuple[GPU, ...], host_mib: int) -> None:
    c.state.nodes[name] = Node(
        name=name,
        address=f"{name}.lan",
        gpus=gpus,
        last_heartbeat_at=c.now,
        host_memory_mib=host_mib,
    )


@dataclass
class Router:
    """What the routers report: last dispatch per replica, in flight, held, started."""

    last_used: dict[str, float] = field(default_factory=dict)
    inflight: dict[str, int] = field(default_factory=dict)
    started: dict[str, int] = field(default_factory=dict)

    def report(self, c: Controller, held: dict[str, int], interval_s: float) -> None:
        by_model: dict[str, tuple[int, int]] = {}
        for rid, n in self.inflight.items():
            r = c.state.replicas.get(rid)
            if r is not None:
                a, b = by_model.get(r.model, (0, 0))
                by_model[r.model] = (a + n, b)
        for m, n in held.items():
            a, b = by_model.get(m, (0, 0))
            by_model[m] = (a, b + n)
        load = {
            m: ModelLoad(inflight=a, held=b, requests=self.started.get(m, 0), interval_s=interval_s)
            for m, (a, b) in by_model.items()
        }
        for m, n in self.started.items():
            if m not in load:
                load[m] = ModelLoad(requests=n, interval_s=interval_s)
        c.usage.ingest(
            UsageReport(
                router_id="router-1",
                sent_at=c.now,
                last_used=dict(self.last_used),
                inflight=dict(self.inflight),
                demand={m: n for m, n in held.items() if n},
                load=load,
            )
        )
        self.started.clear()


def with_sleep(specs: Iterable[ModelSpec], on: bool) -> list[ModelSpec]:
    return [msgspec.structs.replace(s, sleep_mode=on) for s in specs]


__all__ = [
    "Agent",
    "Controller",
    "Router",
    "Timing",
    "add_models",
    "add_node",
    "h100s",
    "with_sleep",
]
