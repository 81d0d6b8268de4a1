"""Controller at fleet scale: 2,000 nodes × 8 GPUs on 8 fabrics, 5,000 models, agents in-process.

No HTTP: heartbeats go straight to `Fleet.heartbeat`, ticks to `ControlLoop.reconcile`
(plan + one store transaction), the summary to `summarize`, exactly the code the
HTTP handlers call. A manual clock moves one tick per tick; half the nodes
heartbeat between two ticks (a 2 s heartbeat interval at a 1 s tick) and one
router reports usage for every ready replica, so the steady state carries the
real per-tick load: heartbeat timestamps to flush, usage to merge.

Measured, per backend (SQLite file, PostgreSQL schema):
- place 1,000: with 4,000 models' replicas placed and ready, 1,000 more models
  are applied and the one tick that places their replicas is timed;
- tick p50/p99: 100 steady-state ticks;
- summary p50/p99: `summarize` of the whole fleet;
- heartbeat: mean cost of one agent heartbeat (no change).

    .venv/bin/python bench/controller_scale.py [--ticks 100] [--backends sqlite,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from llmgw.controller.api.services import Services
from llmgw.controller.api.summary import summarize
from llmgw.controller.config import ControllerConfig
from llmgw.controller.fleet.live import Fleet
from llmgw.controller.idle import IdleTracker
from llmgw.controller.store import MemoryLeadership, Store, open_store
from llmgw.controller.tick import loop as tick_loop
from llmgw.controller.tick.loop import ControlLoop
from llmgw.runtime.clock import ManualClock
from llmgw.wire.agent import GPU, Heartbeat, ShardStatus
from llmgw.wire.models import ModelSpec
from llmgw.wire.usage import UsageReport

NODES, GPUS, FABRICS, MODELS, LATE = 2_000, 8, 8, 5_000, 1_000
PG_URL = "postgresql://root@127.0.0.1:5432/test"
CONFIG = ControllerConfig(tick_s=1.0, heartbeat_timeout_s=10.0, heartbeat_interval_s=2.0)


def gpus() -> tuple[GPU, ...]:
    return tuple(
        GPU(index=i, uuid=f"GPU-{i}", name="H100", gpu_class="H100-80G", memory_mib=81_559)
        for i in range(GPUS)
    )


def specs() -> list[ModelSpec]:
    """Mixed widths: 50% TP1, 25% TP2, 15% TP4, 8% TP8, 2% two whole nodes (12,800 GPUs)."""
    out: list[ModelSpec] = []
    for i in range(MODELS):
        k = i % 100
        tp, nodes = (
            (1, 1)
            if k < 50
            else (2, 1)
            if k < 75
            else (4, 1)
            if k < 90
            else (8, 1)
            if k < 98
            else (8, 2)
        )
        out.append(
            ModelSpec(
                name=f"model-{i:05d}",
                engine="sim",
                gpu_classes=("H100-80G",),
                gpus_per_node=tp,
                nodes=nodes,
                min_replicas=1,
                max_replicas=2,
                priority=i % 3,
            )
        )
    return out


class Agents:
    """Every node's agent: reports each desired shard ready on a stable port."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.gpus = gpus()
        self.shards: dict[str, tuple[ShardStatus, ...]] = {}

    def hb(self, i: int) -> Heartbeat:
        name = f"node-{i:04d}"
        return Heartbeat(
            node=name,
            address=f"10.{i // 250}.{i % 250}.1",
            gpus=self.gpus,
            fabrics=(f"ib{i % FABRICS}",),
            shards=self.shards.get(name, ()),
            agent_started_at=1.0,
        )

    async def beat(self, i: int) -> None:
        hb = self.hb(i)
        reply = await self.fleet.heartbeat(hb)
        want = tuple(
            ShardStatus(replica_id=s.replica_id, rank=s.rank, state="ready", port=21000 + n)
            for n, s in enumerate(reply.shards)
        )
        if want != hb.shards:
            self.shards[hb.node] = want
            await self.fleet.heartbeat(self.hb(i))  # report them ready at once


PLAN_S: list[float] = []
_plan_tick = tick_loop.plan_tick


def _timed_plan_tick(*args: Any, **kw: Any) -> Any:
    """The pure planning part of a tick, timed apart from the store write."""
    t0 = time.perf_counter()
    try:
        return _plan_tick(*args, **kw)
    finally:
        PLAN_S.append(time.perf_counter() - t0)


tick_loop.plan_tick = _timed_plan_tick  # type: ignore[assignment]


def ms(values: list[float], q: float) -> float:
    s = sorted(values)
    return 1000 * s[min(len(s) - 1, int(q * len(s)))]


@contextmanager
def backend(name: str) -> Iterator[Store]:
    if name == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            store = open_store(f"sqlite:///{Path(d) / 'controller.db'}")
            try:
                yield store
            finally:
                store.close()
        return
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        store = open_store(PG_URL, schema=schema)
        try:
            yield store
        finally:
            store.close()
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def run(name: str, ticks: int) -> dict[str, float]:
    clock = ManualClock(start_wall=time.time())
    with backend(name) as store:
        fleet = Fleet(store, clock=clock, config=CONFIG)
        usage = IdleTracker(clock=clock)
        loop = ControlLoop(
            fleet, MemoryLeadership(f"bench-{name}"), usage, clock=clock, config=CONFIG
        )
        services = Services(fleet, usage, config=CONFIG, clock=clock)
        fleet.begin_term()
        fleet.memory.leader_since -= 3600  # leading for a while: no start-up grace
        agents = Agents(fleet)
        for i in range(NODES):
            await agents.beat(i)
        all_specs = specs()
        early, late = all_specs[:-LATE], all_specs[-LATE:]
        await services.apply_models(early)
        t0 = time.perf_counter()
        await loop.reconcile()
        first_fill = time.perf_counter() - t0
        for i in range(NODES):
            await agents.beat(i)
        await services.apply_models(late)
        t0 = time.perf_counter()
        await loop.reconcile()
        place_1000 = time.perf_counter() - t0
        pending = len(fleet.index.in_state("pending"))
        for i in range(NODES):
            await agents.beat(i)
        ready = len(fleet.index.in_state("ready"))
        # As after a controller restart: the new leader loads the fleet from the store.
        t0 = time.perf_counter()
        await fleet.load()
        load_s = time.perf_counter() - t0
        fleet.begin_term()
        fleet.memory.leader_since -= 3600
        # Settle: the tick after everything turned ready decides every model once.
        for _ in range(3):
            clock.advance(1.0)
            await loop.reconcile()

        tick_s: list[float] = []
        # CPU this process spent on the tick (every thread): unlike wall time, not
        # inflated by other programs on a shared machine; excludes database time.
        cpu_s: list[float] = []
        hb_s: list[float] = []
        PLAN_S.clear()
        for t in range(ticks):
            clock.advance(1.0)
            half = range(t % 2, NODES, 2)
            t0 = time.perf_counter()
            for i in half:
                await agents.beat(i)
            hb_s.append((time.perf_counter() - t0) / len(half))
            now = clock.wall()
            usage.ingest(
                UsageReport(
                    router_id="r1",
                    sent_at=now,
                    last_used=dict.fromkeys(fleet.index.in_state("ready"), now - 5),
                    inflight=dict.fromkeys(fleet.index.in_state("ready"), 0),
                )
            )
            t0, c0 = time.perf_counter(), time.process_time()
            await loop.reconcile()
            tick_s.append(time.perf_counter() - t0)
            cpu_s.append(time.process_time() - c0)
        print(
            f"{name} slowest ticks ms: {[round(1000 * x, 1) for x in sorted(tick_s)[-5:]]}",
            file=sys.stderr,
        )

        summary_s: list[float] = []
        for _ in range(20):
            now = clock.wall()
            t0 = time.perf_counter()
            summarize(
                fleet.state,
                now=now,
                heartbeat_timeout_s=CONFIG.heartbeat_timeout_s,
                idle_for=lambda rid, now=now: usage.idle_for(rid, now=now),
                unplaceable={m: u.reason for m, u in fleet.memory.unplaceable.items()},
            )
            summary_s.append(time.perf_counter() - t0)
        return {
            "fill_4000_s": first_fill,
            "load_s": load_s,
            "place_1000_ms": 1000 * place_1000,
            "placed": float(pending),
            "ready": float(ready),
            "tick_p50": ms(tick_s, 0.5),
            "tick_p99": ms(tick_s, 0.99),
            "cpu_p50": ms(cpu_s, 0.5),
            "cpu_p99": ms(cpu_s, 0.99),
            "plan_p50": ms(PLAN_S, 0.5),
            "plan_p99": ms(PLAN_S, 0.99),
            "summary_p50": ms(summary_s, 0.5),
            "summary_p99": ms(summary_s, 0.99),
            "heartbeat_us": 1e6 * statistics.mean(hb_s),
            "unplaceable": float(len(fleet.memory.unplaceable)),
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ticks", type=int, default=100)
    p.add_argument("--backends", default="sqlite,postgres")
    a = p.parse_args()
    rows = []
    for name in a.backends.split(","):
        print(f"running {name} …", file=sys.stderr, flush=True)
        rows.append((name, asyncio.run(run(name, a.ticks))))
    print(
        "| backend | ready replicas | place 1,000 ms | reload s | tick p50 ms | tick p99 ms "
        "| tick CPU p50/p99 ms | plan p50/p99 ms | summary p50/p99 ms | heartbeat µs |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        print(
            f"| {name} | {r['ready']:.0f} | {r['place_1000_ms']:.0f} | {r['load_s']:.2f} "
            f"| {r['tick_p50']:.1f} | {r['tick_p99']:.1f} "
            f"| {r['cpu_p50']:.1f} / {r['cpu_p99']:.1f} "
            f"| {r['plan_p50']:.1f} / {r['plan_p99']:.1f} "
            f"| {r['summary_p50']:.1f} / {r['summary_p99']:.1f} | {r['heartbeat_us']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
