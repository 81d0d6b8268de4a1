"""Placement, summary and eviction-planning cost on a large simulated fleet (pure functions).

Fleet: 2,000 nodes × 8 GPUs (1,500 H100-80G, 500 H200-141G) on 8 fabrics,
5,000 models (TP 1/2/4/8 and 2×8 multi-node), placed one replica each until the
fleet is about 80 % full. Measured:

- free_map(): building the FreeMap from the fleet state;
- place_many() of 1,000 pending replicas, on an empty fleet and on the loaded one;
- place() of one replica (p50 / p99);
- summarize() of the loaded fleet (target ≤ 50 ms, issue 4);
- plan_eviction() for a whole-node model on the fleet packed full, a third of it idle;
- plan_compaction() on that packed fleet with one card freed on every node (2,000
  free cards, none two together): an 8-card model and a 2×8 model, every ready
  replica movable.

Usage: .venv/bin/python bench/controller_placement.py [--no-write]
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from llmgw.controller.api.summary import summarize
from llmgw.controller.fleet.records import FleetState, Model, Node, Replica, Shard
from llmgw.controller.placement.compaction import plan_compaction
from llmgw.controller.placement.eviction import plan_eviction
from llmgw.controller.placement.rules import Placement, free_map, place, place_many
from llmgw.controller.placement.wakes import card_holders
from llmgw.wire.agent import GPU
from llmgw.wire.models import ModelSpec

NOW = 1.8e9
HB = 10.0
SECTION = "## controller_placement.py"
COMMAND = ".venv/bin/python bench/controller_placement.py"


def make_nodes(n: int = 2_000, gpus_per_node: int = 8, fabrics: int = 8) -> dict[str, Node]:
    nodes = {}
    for i in range(n):
        cls = "H100-80G" if i < n * 3 // 4 else "H200-141G"
        gpus = tuple(
            GPU(index=g, uuid=f"GPU-{i}-{g}", name=cls, gpu_class=cls, memory_mib=81_559)
            for g in range(gpus_per_node)
        )
        name = f"node-{i:05d}"
        nodes[name] = Node(
            name=name,
            address=f"10.{i // 250}.{i % 250}.1",
            fabrics=(f"ib{i % fabrics}",),
            gpus=gpus,
            last_heartbeat_at=NOW - 1,
        )
    return nodes


def make_specs(n: int, rng: random.Random) -> list[ModelSpec]:
    shapes = [(1, 1)] * 50 + [(2, 1)] * 25 + [(4, 1)] * 15 + [(8, 1)] * 8 + [(8, 2)] * 2
    specs = []
    for i in range(n):
        tp, width = rng.choice(shapes)
        classes = rng.choice([("H100-80G",), ("H200-141G",), ("H100-80G", "H200-141G")])
        specs.append(
            ModelSpec(
                name=f"model-{i:05d}",
                engine="sim",
                gpu_classes=classes,
                gpus_per_node=tp,
                nodes=width,
                min_replicas=1,
                max_replicas=2,
                priority=rng.randint(0, 3),
            )
        )
    return specs


def loaded_fleet(rng: random.Random) -> tuple[FleetState, list[ModelSpec]]:
    nodes = make_nodes()
    specs = make_specs(5_000, rng)
    state = FleetState(nodes=nodes)
    for s in specs:
        state.models[s.name] = Model(spec=s, created_at=NOW, updated_at=NOW, desired_replicas=1)
    free = free_map(state, now=NOW, heartbeat_timeout_s=HB)
    for i, result in enumerate(place_many(specs, nodes, free)):
        if isinstance(result, Placement):
            rid = f"r-{i:05d}"
            state.replicas[rid] = Replica(
                id=rid,
                model=result.model,
                state="ready",
                shards=tuple(Shard(node=s.node, rank=s.rank, gpus=s.gpus) for s in result.shards),
                created_at=NOW,
                state_since=NOW,
                updated_at=NOW,
                pool=result.pool,
            )
    return state, specs


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str]) -> int:
    rng = random.Random(7)
    empty = FleetState(nodes=make_nodes())
    state, specs = loaded_fleet(rng)
    held = sum(r.gpu_count for r in state.replicas.values())
    pending = make_specs(1_000, random.Random(11))
    idle = {rid: 1_000.0 + i for i, rid in enumerate(sorted(state.replicas)) if i % 3 == 0}
    rows: list[tuple[str, str, str]] = []

    fm = timed(lambda: free_map(state, now=NOW, heartbeat_timeout_s=HB), 15)
    rows.append(("free_map() loaded fleet", f"{statistics.median(fm):.1f}", f"{p(fm, 0.99):.1f}"))

    free_empty = free_map(empty, now=NOW, heartbeat_timeout_s=HB)
    pm = timed(lambda: place_many(pending, empty.nodes, free_empty), 7)
    n_ok = sum(isinstance(r, Placement) for r in place_many(pending, empty.nodes, free_empty))
    rows.append(
        (
            f"place_many 1,000 (empty fleet, {n_ok} placed)",
            f"{statistics.median(pm):.1f}",
            f"{p(pm, 0.99):.1f}",
        )
    )

    free_loaded = free_map(state, now=NOW, heartbeat_timeout_s=HB)
    pl = timed(lambda: place_many(pending, state.nodes, free_loaded), 7)
    n_ok = sum(isinstance(r, Placement) for r in place_many(pending, state.nodes, free_loaded))
    rows.append(
        (
            f"place_many 1,000 (loaded, {n_ok} placed)",
            f"{statistics.median(pl):.1f}",
            f"{p(pl, 0.99):.1f}",
        )
    )

    one = [timed(lambda s=s: place(s, state.nodes, free_loaded), 1)[0] for s in pending]
    rows.append(
        ("place() one replica, loaded", f"{statistics.median(one):.3f}", f"{p(one, 0.99):.3f}")
    )

    sm = timed(lambda: summarize(state, now=NOW, heartbeat_timeout_s=HB, idle_for=idle.get), 15)
    rows.append(
        (
            "summarize() 2,000 nodes / 5,000 models",
            f"{statistics.median(sm):.1f}",
            f"{p(sm, 0.99):.1f}",
        )
    )

    # Pack every remaining card with one-GPU replicas so the big model needs room made.
    packed = FleetState(nodes=state.nodes, models=dict(state.models), replicas=dict(state.replicas))
    filler = [
        ModelSpec(
            name=f"fill-{i:05d}",
            engine="sim",
            gpu_classes=("H100-80G", "H200-141G"),
            min_replicas=0,
        )
        for i in range(16_000 - held)
    ]
    for s in filler:
        packed.models[s.name] = Model(spec=s, created_at=NOW, updated_at=NOW, desired_replicas=1)
    free_p = free_map(packed, now=NOW, heartbeat_timeout_s=HB)
    for i, result in enumerate(place_many(filler, packed.nodes, free_p)):
        if isinstance(result, Placement):
            sh = result.shards[0]
            packed.replicas[f"f-{i:05d}"] = Replica(
                id=f"f-{i:05d}",
                model=result.model,
                state="ready",
                shards=(Shard(node=sh.node, rank=0, gpus=sh.gpus),),
                created_at=NOW,
                state_since=NOW,
                updated_at=NOW,
            )
    # Every filler known idle (their models may go to zero); a third of the rest too.
    idle_p = {
        rid: 1_000.0 + (i * 7_919) % 5_000
        for i, rid in enumerate(sorted(packed.replicas))
        if rid.startswith("f-") or i % 3 == 0
    }
    free_p = free_map(packed, now=NOW, heartbeat_timeout_s=HB)
    whole = ModelSpec(
        name="big", engine="sim", gpu_classes=("H100-80G",), gpus_per_node=8, nodes=2, priority=5
    )
    ev = timed(
        lambda: plan_eviction(whole, packed, idle_p.get, free_p, now=NOW, heartbeat_timeout_s=HB),
        5,
    )
    got = plan_eviction(whole, packed, idle_p.get, free_p, now=NOW, heartbeat_timeout_s=HB)
    evicted = len(got.evict) if got is not None else "none"
    rows.append(
        (
            f"plan_eviction() 2×8 model, packed fleet (evicts {evicted})",
            f"{statistics.median(ev):.1f}",
            f"{p(ev, 0.99):.1f}",
        )
    )

    rows += compaction_rows(packed)

    header = (
        f"Fleet: 2,000 nodes × 8 GPUs on 8 fabrics, {len(state.replicas):,} ready replicas of "
        f"{len(specs):,} models holding {held:,} of 16,000 GPUs; 1,000 pending mixed replicas "
        f"(TP 1/2/4/8, 2×8 multi-node). Eviction: the same fleet packed full with 1-GPU "
        "replicas, every filler and every third other replica known idle. Compaction: "
        "that packed fleet with one 1-GPU replica gone from every node. "
        f"Python {sys.version.split()[0]}, shared 2-core dev machine.\n"
    )
    table = ["| operation | p50 ms | p99 ms |", "|---|---:|---:|"]
    table += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    verdict = (
        f"Targets (issue 4): 1,000 placements ≤ 1 s — {max(pm + pl) / 1e3:.3f} s at worst; "
        f"summary ≤ 50 ms — p50 {statistics.median(sm):.1f} ms."
    )
    text = "\n".join([header, f"Command: `{COMMAND}`", "", *table, "", verdict, ""])
    print(text)
    if "--no-write" not in argv:
        write_section(Path(__file__).with_name("RESULTS.md"), text)
    return 0


def compaction_rows(packed: FleetState) -> list[tuple[str, str, str]]:
    """plan_compaction() where every node has one free card and nothing fits whole."""
    frag = FleetState(nodes=packed.nodes, models=packed.models, replicas=dict(packed.replicas))
    freed: set[str] = set()
    for rid in sorted(frag.replicas):
        r = frag.replicas[rid]
        node = r.shards[0].node
        if rid.startswith("f-") and node not in freed:
            freed.add(node)
            del frag.replicas[rid]
    free = free_map(frag, now=NOW, heartbeat_timeout_s=HB)
    holders = card_holders(frag.replicas.values())
    specs = {name: m.spec for name, m in frag.models.items()}
    rows = []
    for label, gpus, nodes in (("8-card model", 8, 1), ("2×8 model", 8, 2)):
        spec = ModelSpec(
            name="big", engine="sim", gpu_classes=("H100-80G",), gpus_per_node=gpus, nodes=nodes
        )

        def plan(spec: ModelSpec = spec) -> object:
            return plan_compaction(
                spec, frag.nodes, free, holders=holders, movable=lambda r: True, specs=specs
            )

        got = plan()
        moves = len(got.moves) if got is not None else "none"
        t = timed(plan, 5)
        rows.append(
            (
                f"plan_compaction() {label}, one free card a node (moves {moves})",
                f"{statistics.median(t):.1f}",
                f"{p(t, 0.99):.1f}",
            )
        )
    return rows


def write_section(path: Path, body: str) -> None:
    """Replace (or append) this benchmark's own section of RESULTS.md, leaving the others."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = old.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.strip() == SECTION), None)
    section = f"{SECTION}\n\n{body}\n"
    if start is None:
        new = old.rstrip("\n") + "\n\n" + section
    else:
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        new = (
            "".join(lines[:start])
            + section
            + ("\n" + "".join(lines[end:]) if end < len(lines) else "")
        )
    path.write_text(new)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
