"""Controller store: load and per-tick apply at fleet scale, on each backend.

A fleet of 2,000 nodes × 8 GPUs on 8 fabrics, 5,000 models and 10,000 replicas
(one to four shards each) plus 20,000 events is written once; then per backend:
`load()` of everything, `apply()` of a tick of 100 and of 1,000 replica upserts
(each with an event), and `events(model=…)` / `events()` at the default limit.
Targets: load well under a few seconds; a 1,000-replica tick well under 1 s.

    .venv/bin/python bench/controller_store.py [--backends memory,sqlite,postgres]
        [--pg postgresql://root@127.0.0.1:5432/test] [--reps 15] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from llmgw.controller.fleet.records import Changes, Event, Model, Node, Replica, Shard
from llmgw.controller.store import Store, open_store
from llmgw.wire.agent import GPU
from llmgw.wire.models import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## controller_store.py"

N_NODES, N_MODELS, N_REPLICAS, N_EVENTS = 2_000, 5_000, 10_000, 20_000


def fleet() -> Changes:
    nodes = [
        Node(
            name=f"node-{i:04d}",
            address=f"10.{i // 250}.{i % 250}.1",
            fabrics=(f"ib{i % 8}",),
            labels={"rack": f"r{i // 40}", "zone": "eu-1"},
            gpus=tuple(
                GPU(
                    index=g,
                    uuid=f"GPU-{i:04d}-{g}",
                    name="NVIDIA H100 80GB HBM3",
                    gpu_class="H100-80G",
                    memory_mib=81_559,
                )
                for g in range(8)
            ),
            last_heartbeat_at=1.7e9,
            agent_started_at=1.7e9 - 100,
        )
        for i in range(N_NODES)
    ]
    tps = (1, 2, 4, 8)
    models = [
        Model(
            spec=ModelSpec(
                name=f"model-{i:04d}",
                engine="vllm",
                gpu_classes=("H100-80G",),
                gpus_per_node=tps[i % 4],
                nodes=2 if i % 50 == 0 else 1,
                min_replicas=1,
                max_replicas=4,
                args=("--max-model-len", "8192"),
            ),
            created_at=1.7e9,
            updated_at=1.7e9,
            desired_replicas=2,
        )
        for i in range(N_MODELS)
    ]
    replicas = [replica(i, state="ready") for i in range(N_REPLICAS)]
    events = [event(i) for i in range(N_EVENTS)]
    return Changes(nodes=nodes, models=models, replicas=replicas, events=events)


def replica(i: int, *, state: str, at: float = 1.7e9) -> Replica:
    width = 1 + i % 4
    return Replica(
        id=f"rep-{i:05d}",
        model=f"model-{i % N_MODELS:04d}",
        state=state,  # type: ignore[arg-type]
        shards=tuple(
            Shard(
                node=f"node-{(i + k) % N_NODES:04d}",
                rank=k,
                gpus=(0, 1),
                port=21000 + k,
                state="ready",
                pid=1000 + i,
            )
            for k in range(width if i % 50 == 0 else 1)
        ),
        created_at=at,
        state_since=at,
        updated_at=at,
        endpoint_url=f"http://10.0.0.1:{21000 + i % 1000}",
        pool=f"ib{i % 8}/H100-80G",
    )


def event(i: int) -> Event:
    return Event(
        id=0, at=1.7e9 + i, kind="replica.ready", subject="replica",
        subject_id=f"rep-{i % N_REPLICAS:05d}", model=f"model-{i % N_MODELS:04d}",
        message="all shards ready",
    )  # fmt: skip


def tick(size: int, n: int) -> Changes:
    """A tick touching `size` replicas (a state change each) with one event per replica."""
    start = (n * size) % N_REPLICAS
    rs = [
        dataclasses.replace(replica((start + k) % N_REPLICAS, state="ready"), updated_at=2e9 + n)
        for k in range(size)
    ]
    return Changes(replicas=rs, events=[event(start + k) for k in range(size)])


def ms(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    return statistics.median(s) * 1e3, s[min(len(s) - 1, round(0.99 * (len(s) - 1)))] * 1e3


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


@contextmanager
def backend(name: str, pg: str) -> Iterator[Store]:
    if name == "memory":
        yield open_store("memory://")
    elif name == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            s = open_store(f"sqlite:///{d}/controller.db")
            try:
                yield s
            finally:
                s.close()
    else:
        schema = f"bench_{uuid.uuid4().hex[:10]}"
        s = open_store(pg, schema=schema)
        try:
            yield s
        finally:
            s.close()
            with psycopg.connect(pg, autocommit=True) as c:
                c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def measure(name: str, pg: str, reps: int) -> dict[str, str]:
    data = fleet()
    with backend(name, pg) as s:
        t0 = time.perf_counter()
        s.apply(data)
        populate = time.perf_counter() - t0
        state = s.load()
        assert (len(state.nodes), len(state.models), len(state.replicas)) == (
            N_NODES,
            N_MODELS,
            N_REPLICAS,
        )
        load = ms(timed(s.load, max(3, reps // 3)))
        n = iter(range(10**6))
        small = ms(timed(lambda: s.apply(tick(100, next(n))), reps))
        big = ms(timed(lambda: s.apply(tick(1000, next(n))), reps))
        by_model = ms(timed(lambda: s.events(model="model-0042"), reps))
        latest = ms(timed(lambda: s.events(), reps))
    return {
        "backend": name,
        "populate s": f"{populate:.2f}",
        "load p50/p99 ms": f"{load[0]:,.0f} / {load[1]:,.0f}",
        "tick 100 p50/p99 ms": f"{small[0]:.1f} / {small[1]:.1f}",
        "tick 1,000 p50/p99 ms": f"{big[0]:.0f} / {big[1]:.0f}",
        "events(model) p50 ms": f"{by_model[0]:.2f}",
        "events() p50 ms": f"{latest[0]:.2f}",
    }


def table(rows: list[dict[str, str]]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|---" + "|---:" * (len(cols) - 1) + "|"]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def write_section(body: str) -> None:
    """Replace this benchmark's section of RESULTS.md, or append it; others are untouched."""
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    section = f"{SECTION}\n\n{body.strip()}\n\n"
    new = (
        pattern.sub(lambda _m: section, old)
        if pattern.search(old)
        else old.rstrip() + "\n\n" + section
    )
    RESULTS.write_text(new)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="memory,sqlite,postgres")
    ap.add_argument("--pg", default="postgresql://root@127.0.0.1:5432/test")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md")
    args = ap.parse_args()
    rows = [measure(b, args.pg, args.reps) for b in args.backends.split(",")]
    out = table(rows)
    print(out)
    if not args.no_write:
        write_section(
            f"{N_NODES:,} nodes × 8 GPUs, {N_MODELS:,} models, {N_REPLICAS:,} replicas and "
            f"{N_EVENTS:,} events written in one apply (populate), then: `load()` of "
            "everything; `apply()` of a tick of 100 / 1,000 replica upserts each with an "
            f"event ({args.reps} reps); `events(model=…)` and `events()` at limit 200. "
            f"SQLite in WAL with synchronous=FULL on local disk; PostgreSQL 15 on "
            f"127.0.0.1 (psycopg 3). Python {platform.python_version()}, the shared 2-core "
            "dev machine (other work running, so treat figures as upper bounds).\n\n"
            "Command: `.venv/bin/python bench/controller_store.py`\n\n"
            f"{out}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
