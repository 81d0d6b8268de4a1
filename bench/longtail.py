"""Long tail on a simulated fleet: today's eviction by stopping against sleeping, in one run.

Fleet: 4 nodes × 8 H100-80G (32 cards), 2 TiB host memory each. 24 models of mixed
sizes, together wanting more cards than there are (longtail_fleet.py drives the real
controller's tick, heartbeat and outlook code; only agents, engines and the router are
simulated):

    size    count  TP  weights  cold start  sleep  wake (level 1)
    small    12     1   16 GB      47 s      1.0 s     0.8 s
    medium    8     2   70 GB      72 s      2.8 s     2.9 s
    large     4     4  235 GB      98 s      5.9 s     5.7 s

Cold starts, wakes and sleeps are vLLM's published figures (vLLM 0.11.0 on A100s: a 30B
on one card starts in 47 s, a 235B on four in 98 s; wakes 0.1-0.8 s small, 2.9 s 30B,
5.3-5.7 s 235B; level-1 sleeps 0.41-0.42 s for an 8 GB model, 2.78 s for the 30B,
5.78-6.01 s for the 235B: the weights copied to host memory; the small models here,
16 GB, take 1.0 s). Demand:
Zipf over the models (`--zipf`, rank order shuffled against size), Poisson arrivals
(`--rate`), plus bursts (a random model gets 30 requests in a minute, every 5 minutes
on average). Each request is in flight 8 s; an awake replica answers its first token
in 0.3 s. Routers hold a request up to 120 s and refuse one whose model the controller
says it cannot place, as llmgw's router does. Every model: min 0, max 1 replica,
`idle_timeout_s` from `--idle-s`; in sleep mode also `sleep_mode: true`, its
`weights_gb` and `sleep_after_s` (`--sleep-after-s`, one sleep run per value). The
controller: tick 0.5 s, heartbeats every 1 s (0.25 s while an engine swaps), routers
report every 0.5 s, scale-down cool-down 120 s. The same seed, workload and settings
for every mode; only the sleep fields differ.

Measured after a 30-minute warm-up, over 3 hours of simulated time:
- requests to a model that was not awake (no ready replica when it arrived), the
  share that waited for a cold start, their p50/p99 time to first token;
- the same for requests to a model that had a sleeping replica when they arrived;
- requests refused (all requests);
- GPU-hours: cards held by engines that are starting, serving or waking, per model
  that served at least one request.

Usage: .venv/bin/python bench/longtail.py [--hours 3] [--seed 1] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.controller.config import ControllerConfig
from llmgw.wire.endpoints import ModelOutlook
from llmgw.wire.models import ModelSpec
from longtail_fleet import Agent, Controller, Router, Timing, add_models, add_node, h100s

SECTION = "## longtail.py"
COMMAND = ".venv/bin/python bench/longtail.py"
DT = 0.25
TICK_S = 0.5
HEARTBEAT_S = 1.0
REPORT_S = 0.5
HOLD_S = 120.0
BASE_TTFT_S = 0.3
IN_FLIGHT_S = 8.0
WARM_UP_S = 1800.0
NODES = 4
HOST_MIB = 2 * 1024 * 1024

SIZES = {
    "small": (1, 16.0, Timing(cold_s=47.0, sleep_s=1.0, wake_s=0.8)),
    "medium": (2, 70.0, Timing(cold_s=72.0, sleep_s=2.8, wake_s=2.9)),
    "large": (4, 235.0, Timing(cold_s=98.0, sleep_s=5.9, wake_s=5.7)),
}


def models(rng: random.Random) -> list[tuple[str, str]]:
    """(name, size) by popularity rank, sizes shuffled over the ranks."""
    sizes = ["small"] * 12 + ["medium"] * 8 + ["large"] * 4
    rng.shuffle(sizes)
    return [(f"m{i:02d}-{size}", size) for i, size in enumerate(sizes)]


def spec(name: str, size: str, *, sleep: bool, idle_s: float, sleep_after_s: float) -> ModelSpec:
    tp, weights, _ = SIZES[size]
    return ModelSpec(
        name=name,
        engine="sim",
        gpu_classes=("H100-80G",),
        gpus_per_node=tp,
        min_replicas=0,
        max_replicas=1,
        idle_timeout_s=idle_s,
        sleep_mode=sleep,
        sleep_after_s=sleep_after_s if sleep else None,
        weights_gb=weights,
    )


def arrivals(
    names: list[str], rng: random.Random, *, seconds: float, rate: float, zipf: float
) -> list[tuple[float, str]]:
    weights = [1.0 / (i + 1) ** zipf for i in range(len(names))]
    total = sum(weights)
    out: list[tuple[float, str]] = []
    for name, w in zip(names, weights, strict=True):
        lam = rate * w / total
        t = rng.expovariate(lam)
        while t < seconds:
            out.append((t, name))
            t += rng.expovariate(lam)
    t = rng.expovariate(1 / 300)
    while t < seconds:
        name = rng.choice(names)
        out.extend((t + rng.uniform(0, 60), name) for _ in range(30))
        t += rng.expovariate(1 / 300)
    out.sort()
    return out


@dataclass
class Held:
    at: float
    model: str
    asleep: bool
    counted: bool  # arrived after the warm-up


@dataclass
class Outcome:
    """What happened to the requests of one mode."""

    total: int = 0
    refused: int = 0
    # Requests to a model not awake at arrival: "wake", "cold" or "refused", with TTFT.
    not_awake: list[tuple[str, float | None, bool]] = field(default_factory=list)
    card_s: float = 0.0
    served_models: set[str] = field(default_factory=set)
    wakes: int = 0
    cold_starts: int = 0
    wall_s: float = 0.0


@dataclass(frozen=True)
class Workload:
    seed: int = 1
    hours: float = 3.0
    rate: float = 1.0  # requests per second, the Zipf part
    zipf: float = 1.1
    idle_s: float = 120.0  # every model's idle_timeout_s
    sleep_after_s: float = 10.0  # sleep mode: every model's sleep_after_s
    warm_up_s: float = WARM_UP_S  # simulated time before anything is counted


def run(sleep: bool, w: Workload) -> Outcome:
    seed, hours, rate = w.seed, w.hours, w.rate
    rng = random.Random(seed)
    defs = models(rng)
    timing = {name: SIZES[size][2] for name, size in defs}
    config = ControllerConfig(
        tick_s=TICK_S,
        heartbeat_interval_s=HEARTBEAT_S,
        heartbeat_timeout_s=10.0,
        drain_grace_s=30.0,
        scale_down_cooldown_s=120.0,
        starting_deadline_s=300.0,
    )
    c = Controller(config=config)
    add_models(
        c,
        (spec(n, s, sleep=sleep, idle_s=w.idle_s, sleep_after_s=w.sleep_after_s) for n, s in defs),
    )
    agents = []
    for i in range(NODES):
        name = f"n{i}"
        add_node(c, name, h100s(8), HOST_MIB)
        agents.append(Agent(name, h100s(8), HOST_MIB, timing, next_heartbeat=c.now + i * DT))
    seconds = hours * 3600 + w.warm_up_s
    queue = arrivals(
        [n for n, _ in defs], random.Random(seed + 1), seconds=seconds, rate=rate, zipf=w.zipf
    )
    router = Router()
    ends: list[tuple[float, str]] = []  # (end time, replica id) of requests in flight
    held: list[Held] = []
    out = Outcome()
    looks = c.outlook()
    qi = 0
    start = c.now
    wall0 = time.perf_counter()
    steps = int(seconds / DT)
    for step in range(steps):
        now = c.now
        t = now - start
        counted = t >= w.warm_up_s
        ready = _ready(c)
        # Arrivals in this step.
        while qi < len(queue) and queue[qi][0] < t + DT:
            model = queue[qi][1]
            qi += 1
            out.total += counted
            rid = ready.get(model)
            if rid is not None:
                _dispatch(router, ends, rid, model, now)
                out.served_models.add(model)
                continue
            look = looks.get(model)
            asleep = any(
                r.model == model and r.state in ("sleeping", "waking")
                for r in c.state.replicas.values()
            )
            if look is not None and look.state == "cannot_place":
                if counted:
                    out.refused += 1
                    out.not_awake.append(("refused", None, asleep))
                continue
            held.append(Held(now, model, asleep, counted))
        for a in agents:
            a.advance(now)
        # Heartbeats, as often as the controller asks (faster during swaps).
        for a in agents:
            if now >= a.next_heartbeat:
                shards, interval_s = c.heartbeat(a.heartbeat(now))
                a.apply(shards, now)
                a.next_heartbeat = now + interval_s
        if step % int(REPORT_S / DT) == 0:
            demand: dict[str, int] = {}
            for h in held:
                demand[h.model] = demand.get(h.model, 0) + 1
            router.report(c, demand, REPORT_S)
        if step % int(TICK_S / DT) == 0:
            c.tick()
            looks = c.outlook()
        ready = _ready(c)
        held = _serve_held(c, held, ready, looks, router, ends, now, out)
        while ends and ends[0][0] <= now:
            _, rid = heapq.heappop(ends)
            router.inflight[rid] -= 1
            if router.inflight[rid] <= 0:
                del router.inflight[rid]
        if counted:
            out.card_s += DT * sum(a.awake_cards() for a in agents)
        c.clock.advance(DT)
    out.wall_s = time.perf_counter() - wall0
    after = start + w.warm_up_s
    out.wakes = sum(1 for at, kind, _, _ in c.events if at >= after and kind == "replica.waking")
    out.cold_starts = sum(
        1 for at, kind, _, _ in c.events if at >= after and kind == "replica.placed"
    )
    return out


def _ready(c: Controller) -> dict[str, str]:
    out: dict[str, str] = {}
    for rid in sorted(c.index.in_state("ready")):
        r = c.state.replicas[rid]
        out.setdefault(r.model, rid)
    return out


def _dispatch(
    router: Router, ends: list[tuple[float, str]], rid: str, model: str, now: float
) -> None:
    router.last_used[rid] = now
    router.inflight[rid] = router.inflight.get(rid, 0) + 1
    router.started[model] = router.started.get(model, 0) + 1
    heapq.heappush(ends, (now + IN_FLIGHT_S, rid))


def _serve_held(
    c: Controller,
    held: list[Held],
    ready: dict[str, str],
    looks: dict[str, ModelOutlook],
    router: Router,
    ends: list[tuple[float, str]],
    now: float,
    out: Outcome,
) -> list[Held]:
    keep: list[Held] = []
    for h in held:
        counted, at = h.counted, h.at
        rid = ready.get(h.model)
        if rid is not None:
            _dispatch(router, ends, rid, h.model, now)
            out.served_models.add(h.model)
            if counted:
                reason = c.state.replicas[rid].reason or ""
                how = "wake" if reason.startswith("awake") else "cold"
                out.not_awake.append((how, now - at + BASE_TTFT_S, h.asleep))
            continue
        look = looks.get(h.model)
        if now - at >= HOLD_S or (look is not None and look.state == "cannot_place"):
            if counted:
                out.refused += 1
                out.not_awake.append(("refused", None, h.asleep))
            continue
        keep.append(h)
    return keep


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def rows(name: str, o: Outcome) -> list[str]:
    na = o.not_awake
    asleep = [x for x in na if x[2]]
    served = [t for _, t, _ in na if t is not None]
    served_asleep = [t for _, t, a in na if t is not None and a]
    cold = sum(1 for how, _, _ in na if how == "cold")
    no_cold_asleep = sum(1 for how, _, _ in asleep if how == "wake")
    gpu_h = o.card_s / 3600
    return [
        f"| {name} | {o.total:,} | {len(na):,} | {cold / max(1, len(na)):.1%} | "
        f"{pct(served, 0.5):.1f} | {pct(served, 0.99):.1f} | {len(asleep):,} | "
        f"{no_cold_asleep / max(1, len(asleep)):.1%} | {pct(served_asleep, 0.5):.1f} | "
        f"{pct(served_asleep, 0.99):.1f} | {o.refused:,} | {o.wakes:,} | {o.cold_starts:,} | "
        f"{gpu_h:.0f} | {gpu_h / max(1, len(o.served_models)):.1f} |"
    ]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=3.0, help="measured simulated hours")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate", type=float, default=1.0, help="requests per second, Zipf part")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent over the models")
    p.add_argument("--idle-s", type=float, default=120.0, help="every model's idle_timeout_s")
    p.add_argument(
        "--sleep-after-s",
        default="10,2",
        help="sleep mode's sleep_after_s; comma-separated values give one sleep row each",
    )
    p.add_argument(
        "--warm-up-min", type=float, default=WARM_UP_S / 60, help="minutes before counting"
    )
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    w = Workload(
        seed=args.seed,
        hours=args.hours,
        rate=args.rate,
        zipf=args.zipf,
        idle_s=args.idle_s,
        warm_up_s=args.warm_up_min * 60,
    )
    stop = run(False, w)
    sleeps = [
        (float(v), run(True, dataclasses.replace(w, sleep_after_s=float(v))))
        for v in args.sleep_after_s.split(",")
    ]
    head = (
        "| mode | requests | to a model not awake | waited for a cold start | TTFT p50 s | "
        "TTFT p99 s | to a model asleep | asleep: no cold start | asleep TTFT p50 s | "
        "asleep TTFT p99 s | refused | wakes | cold starts | GPU-hours | GPU-hours per model "
        "served |"
    )
    sep = "|---|" + "---:|" * 14
    table = [head, sep, *rows("stop (today)", stop)]
    for after, o in sleeps:
        table += rows(f"sleep, sleep_after_s {after:g}", o)
    text = "\n".join(
        [
            f"Fleet: 4 × 8 H100-80G, 24 models (12 × TP1 16 GB, 8 × TP2 70 GB, 4 × TP4 235 GB), "
            f"Zipf {args.zipf:g} at {args.rate:g} req/s plus bursts of 30, idle_timeout_s "
            f"{args.idle_s:g}, {args.hours:g} h measured after "
            f"a {args.warm_up_min:g} min warm-up, seed {args.seed}; the real controller tick, "
            "heartbeat and outlook code (bench/longtail_fleet.py). 'Asleep': the model had a "
            "sleeping replica when the request arrived. TTFT over requests served.",
            "",
            f"Command: `{COMMAND} --hours {args.hours:g} --seed {args.seed} --rate {args.rate:g}"
            f" --zipf {args.zipf:g} --idle-s {args.idle_s:g} --sleep-after-s {args.sleep_after_s}"
            f" --warm-up-min {args.warm_up_min:g}`",
            "",
            *table,
            "",
            f"Simulation wall time per mode: {stop.wall_s:.0f} s (stop), "
            + ", ".join(f"{o.wall_s:.0f} s" for _, o in sleeps)
            + " (sleep).",
            "",
        ]
    )
    print(text)
    if not args.no_write:
        _write_section(Path(__file__).with_name("RESULTS.md"), text)
    return 0


def _write_section(path: Path, body: str) -> None:
    """Replace (or append) this benchmark's own section of RESULTS.md, leaving the others."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = old.splitlines(keepends=True)
    begin = next((i for i, ln in enumerate(lines) if ln.strip() == SECTION), None)
    section = f"{SECTION}\n\n{body}\n"
    if begin is None:
        path.write_text(old.rstrip("\n") + "\n\n" + section)
        return
    end = next((i for i in range(begin + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    rest = "\n" + "".join(lines[end:]) if end < len(lines) else ""
    path.write_text("".join(lines[:begin]) + section + rest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
