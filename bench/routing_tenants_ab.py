"""Flow control at overload, A/B: routing_tenants.py's `L on` run alone, for several
router source trees in turn, repeated, with figures pooled per tree.

One run of routing_tenants.py gives each tenant's p99 TTFT over 100-200 requests: its
second-slowest request, which moves by a third between runs of the same code. This
script runs only the loaded, flow-on run (same fleet, schedules and router file as
routing_tenants.py), alternates the trees run by run so a change of the shared machine
falls on all of them, and pools every request of a tree's runs before it takes
percentiles.

Trees
    `--tree DIR[@WORKERS]`, one per variant: a checkout whose `src/` the router and the
    sim-engines run from (the bench itself runs from this checkout), and optionally the
    router's `--workers` (default: the router's own, one per core). The same DIR with
    two worker counts is two variants.

Figures (per variant, pooled over `--repeat` runs)
    TTFT p50/p90/p99 per tenant; held p50/p90/p99: the wait in flow control's queue of
    the requests it held and granted (the router's llmgw_router_flow_wait_seconds,
    buckets summed over the runs, interpolated within them); the noisy tenant's goodput
    and the hit rate, averaged over the runs. With `--breakdown` (routing_tenants.py's),
    a second table: each tenant's TTFT split into router, engine queue and prefill
    (breakdown.py), every request of a variant's runs pooled; the trees' sim-engines
    need `--request-log` (a tree without it shows no requests there).

Usage: .venv/bin/python bench/routing_tenants_ab.py --tree A --tree B [--repeat 3]
       [routing_tenants.py's options, e.g. --capacity-rps 37.7 --slo-s 2 --loads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import breakdown
import routing
import routing_tenants as rt
from routing import Conversations, Timing, open_loop_schedule, pct


@dataclasses.dataclass
class Variant:
    tree: str
    workers: int | None
    ttfts: dict[str, list[float]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    waits: dict[str, dict[float, float]] = dataclasses.field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    split: dict[str, list[breakdown.Sample]] = dataclasses.field(
        default_factory=lambda: defaultdict(list)
    )
    hit: list[float] = dataclasses.field(default_factory=list)
    goodput: list[float] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.tree if self.workers is None else f"{self.tree}@{self.workers}"

    def add(self, run: rt.Run) -> None:
        for tenant, xs in run.ttfts.items():
            self.ttfts[tenant] += xs
        for tenant, ss in run.split.items():
            self.split[tenant] += ss
        for tenant, cum in run.waits.items():
            for bound, n in cum.items():
                self.waits[tenant][bound] += n
        self.hit.append(run.hit_rate)
        self.goodput.append(run.tenants["noisy"].goodput_rps)


def variant(text: str) -> Variant:
    tree, _, workers = text.partition("@")
    if not (Path(tree) / "src" / "llmgw").is_dir():
        raise argparse.ArgumentTypeError(f"{tree}: no src/llmgw there")
    return Variant(str(Path(tree).resolve()), int(workers) if workers else None)


def _three(xs: list[float]) -> str:
    return "/".join(rt._ms(pct(xs, q)) for q in (0.5, 0.9, 0.99))


def _held(cum: dict[float, float]) -> str:
    return "/".join(rt._ms(rt.bucket_quantile(cum, q)) for q in (0.5, 0.9, 0.99))


def table(variants: list[Variant]) -> list[str]:
    lines = [
        "| variant | tenant | served | TTFT p50/p90/p99 ms | held | held p50/p90/p99 ms |",
        "|---|---|---:|---|---:|---|",
    ]
    for v in variants:
        for tenant in rt.TENANTS:
            held = round(v.waits[tenant].get(float("inf"), 0.0))
            lines.append(
                f"| {v.name} | {tenant} | {len(v.ttfts[tenant])} | {_three(v.ttfts[tenant])} | "
                f"{held} | {_held(v.waits[tenant])} |"
            )
    lines += ["", "| variant | runs | hit rate | noisy goodput req/s |", "|---|---:|---:|---:|"]
    for v in variants:
        n = max(1, len(v.hit))
        lines.append(
            f"| {v.name} | {len(v.hit)} | {sum(v.hit) / n:.1%} | {sum(v.goodput) / n:.1f} |"
        )
    return lines


async def amain(opts: argparse.Namespace, variants: list[Variant], repeat: int) -> None:
    fleet = routing._fleet(opts)
    timing = Timing(opts.duration_s, opts.warmup_s, opts.drain_s)
    log_dir = Path(tempfile.mkdtemp(prefix="llmgw-bench-tenants-ab-"))
    if opts.capacity_rps is None:
        convs = Conversations(routing._workload(opts, "none", opts.seed))
        capacity, _ = await routing.calibrate(convs, fleet, opts, log_dir)
    else:
        capacity = opts.capacity_rps
    load = max(opts.loads)
    lead = opts.think_s * opts.turns[1] * 1.5
    schedules = {}
    for i, (tenant, (_, share, _)) in enumerate(rt.TENANTS.items()):
        w = routing._workload(opts, "none", opts.seed + 100 * i)
        if opts.tenant_prompts == "shared":
            w = dataclasses.replace(w, prompt_seed=opts.seed)
        schedules[tenant] = open_loop_schedule(
            Conversations(w),
            rate_rps=capacity * load * share / rt.UNITS,
            duration_s=opts.duration_s,
            warmup_s=opts.warmup_s,
            lead_s=lead,
            seed=opts.seed + 100 * i,
        )
    try:
        for r in range(repeat):
            for v in variants:
                # The router and sim-engines the bench starts inherit it: this tree first.
                os.environ["PYTHONPATH"] = os.path.join(v.tree, "src")
                opts.router_workers = v.workers
                run = await rt.one_run(
                    f"{load:g}x on", schedules, fleet, timing, opts, log_dir, flow=True
                )
                v.add(run)
                q = run.tenants
                print(
                    f"run {r + 1}/{repeat} {v.name}: p99 TTFT critical "
                    f"{rt._ms(q['critical'].ttft_p99)}, quiet {rt._ms(q['quiet'].ttft_p99)} ms",
                    flush=True,
                )
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    print(f"capacity C {capacity:.1f} req/s, load {load:g}x, flow on, {repeat} runs a variant")
    print("\n".join(table(variants)))
    if opts.breakdown:
        rows = [(v.name, t, v.split[t]) for v in variants for t in rt.TENANTS]
        print("\n" + "\n".join(breakdown.table(rows, first="variant")))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree", type=variant, action="append", required=True)
    p.add_argument("--repeat", type=int, default=3)
    own, rest = p.parse_known_args(argv)
    opts = rt.parse_args([*rest, "--no-write"])
    asyncio.run(amain(opts, own.tree, own.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
