"""Flow control under overload: three tenants on one fleet, flow control off vs on (issue 30).

Reuses bench/routing.py's harness by import (its fleet of real `llmgw sim-engine`
processes, workload, streaming client, engine counters, calibration); only the
tenants, the router's file and the figures are this file's.

Fleet and capacity
    `--engines` sim-engines (bench/routing.py's defaults otherwise), restarted for
    every run. Capacity C is bench/routing.py's closed-loop round-robin calibration.

Tenants (one client key each, the key's team = the tenant)
    noisy      standard band, offered 3 units
    quiet      standard band, offered 0.3 units
    critical   critical band, offered 0.2 units
    The three together offer L x C (L = `--loads`, 1.5 and 2 by default) in
    proportion 3 : 0.3 : 0.2 (so at 2x, noisy alone offers 1.7 C). Each tenant's
    requests are bench/routing.py's multi-turn conversations (own seed), open-loop,
    streamed. `--tenant-prompts own` (the default): each tenant has its own 8 system
    prompts, 24 on a fleet whose engines cache 3 each, so at overload the noisy
    tenant's prompts crowd the others' out of the cache; `shared`: all three draw from
    the same 8.

Engines run `--scheduling-policy priority` and the router's file says so
(`priority_scheduling`), as the agent starts vLLM and the sim-engine: the router
writes each key's band into the engine's queue order (docs/tenants.md, "Engine
priority"). `--engine-priority off`: FCFS engines, bodies as the clients sent them.

Runs, in one invocation, each on fresh engines and a fresh router:
    unloaded   quiet and critical alone at their rates of the highest load (well
               below capacity: their p99 TTFT with nobody else on the fleet)
    L off      all three, the router's `flow: {enabled: false}`
    L on       all three, flow control on with its default bounds

Figures (measured window only, after `--warmup-s`)
    Per tenant: TTFT p50/p99 of the requests served (a request still without its
    first token when the drain ends counts its elapsed time, as in routing.py);
    goodput = requests served in full, within the router's request deadline and
    with TTFT <= `--slo-s` (default: no bound but the deadline), per second of the
    window; refusals by HTTP status (429 flow_queue_full, 503 flow_wait_exceeded or
    no replica); lost = neither served nor refused when the drain ended; late =
    served after the router's request deadline.
    Fairness: Jain's index over the standard band's tenants of goodput / max-min
    fair share, the share computed from the band's total goodput (quiet's share is
    its demand when that is below half; noisy's the rest). 1.0: each got its fair
    share; with two tenants the floor is 0.5. Only one standard tenant is
    backlogged here, so an index over backlogged tenants alone would be 1 by
    definition; this one also sees a quiet tenant crowded out.
    Held: requests flow control held and then granted, and their wait in its queue
    (p50/p99 from the router's llmgw_router_flow_wait_seconds histogram, interpolated
    within its buckets, from the warm-up's end to the drain's end): the router's
    share of a tenant's TTFT.
    Hit rate: engines' prefix-cache hits / queries over the window.
    Router CPU: its user+system seconds per request sent.
    `--breakdown`: the engines write `--request-log` and every request carries an
    x-request-id; a second table splits each tenant's TTFT, per run, into router
    (client send to engine arrival), engine queue and prefill, p50/p90/p99, with the
    share of cache misses and of preempted requests (bench/breakdown.py).

Usage: .venv/bin/python bench/routing_tenants.py [--short] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import math
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

import breakdown
import routing
from routing import (
    Conversations,
    Fleet,
    Processes,
    Request,
    Result,
    Timing,
    counters,
    cpu_seconds,
    machine_ticks,
    open_loop_schedule,
    pct,
    stream_one,
    wait_router_scraped,
)

HEADING = "## bench/routing_tenants.py"
# Tenant → (band, share of the offered load in units, the key).
TENANTS = {
    "noisy": ("standard", 3.0, "sk-bench-noisy"),
    "quiet": ("standard", 0.3, "sk-bench-quiet"),
    "critical": ("critical", 0.2, "sk-bench-critical"),
}
UNITS = sum(share for _, share, _ in TENANTS.values())
REQUEST_TIMEOUT_S = 120.0


class TenantProcesses(Processes):
    """bench/routing.py's processes with a router that knows the tenants' keys."""

    flow = True
    engine_priority = True
    workers: int | None = None  # the router's own default (one per core)
    request_logs = False  # engines write --request-log into the log folder (--breakdown)

    def start_engines(self, *, kv_events: bool = False) -> dict[str, str]:
        if self.engine_priority:
            self.engine_extra = ["--scheduling-policy", "priority"]
        return super().start_engines(kv_events=kv_events)

    def engine_flags(self, eid: str) -> list[str]:
        if not self.request_logs:
            return []
        path = breakdown.log_path(self.log_dir, eid)
        # Every run's engines reuse the folder and the ids: start each run's log empty.
        path.unlink(missing_ok=True)
        return ["--request-log", str(path)]

    def start_router(self, policy: str, urls: dict[str, str]) -> str:
        cfg = self.log_dir / f"router-{policy}.yaml"
        lines = [
            "policy: ours",
            f"scrape_interval_s: {self.fleet.scrape_interval_s}",
            f"scrape_timeout_s: {self.fleet.scrape_interval_s * 0.75}",
            f"request_timeout_s: {REQUEST_TIMEOUT_S}",
            f"flow: {{enabled: {'true' if self.flow else 'false'}}}",
            "api_keys:",
        ]
        for name, (band, _, key) in TENANTS.items():
            digest = hashlib.sha256(key.encode()).hexdigest()
            lines.append(f"  - {{name: {name}, team: {name}, priority: {band}, sha256: {digest}}}")
        lines.append("endpoints:")
        prio = ", priority_scheduling: true" if self.engine_priority else ""
        for eid, url in urls.items():
            lines.append(f"  - {{id: {eid}, url: '{url}', models: [{routing.MODEL}]{prio}}}")
        cfg.write_text("\n".join(lines) + "\n")
        argv = ["router", "--config", str(cfg), "--port", "0"]
        if self.workers is not None:
            argv += ["--workers", str(self.workers)]
        self.router = routing.start_program(argv, log_dir=self.log_dir)
        return self.router.url


@dataclass
class TenantStats:
    sent: int = 0
    served: int = 0
    good: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    late: int = 0
    ttft_p50: float = math.nan
    ttft_p99: float = math.nan
    goodput_rps: float = math.nan
    # Requests held by flow control and granted, and their wait there (the router's
    # llmgw_router_flow_wait_seconds, interpolated within its buckets).
    held: int = 0
    wait_p50: float = math.nan
    wait_p99: float = math.nan


@dataclass
class Run:
    name: str
    tenants: dict[str, TenantStats]
    hit_rate: float
    fairness: float
    router_cpu_ms: float  # per request sent
    machine_busy: float
    lag_resets: int
    # Per tenant: every measured request's TTFT (s), and the flow-wait histogram
    # (bucket bound → granted requests, cumulative), for pooling runs (routing_tenants_ab.py).
    ttfts: dict[str, list[float]] = field(default_factory=dict)
    waits: dict[str, dict[float, float]] = field(default_factory=dict)
    # Per tenant: every measured request's router / engine split (--breakdown; empty
    # without it), kept whole so routing_tenants_ab.py pools exactly.
    split: dict[str, list[breakdown.Sample]] = field(default_factory=dict)


_WAIT_BUCKET = re.compile(r"^llmgw_router_flow_wait_seconds_bucket\{([^}]*)\} (\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


async def flow_waits(session: aiohttp.ClientSession, url: str) -> dict[str, dict[float, float]]:
    """Team → the router's flow-wait histogram: bucket bound → requests (cumulative)."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, dict[float, float]] = {}
    for labels, n in _WAIT_BUCKET.findall(text):
        got = dict(_LABEL.findall(labels))
        team, le = got.get("team", ""), got.get("le", "+Inf")
        bound = math.inf if le == "+Inf" else float(le)
        by = out.setdefault(team, {})
        by[bound] = by.get(bound, 0.0) + float(n)
    return out


def bucket_quantile(cum: dict[float, float], q: float) -> float:
    """The q-quantile of a cumulative histogram, linear within its bucket (as
    Prometheus' histogram_quantile); nan when empty."""
    bounds = sorted(cum)
    total = cum[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    rank, lo, below = q * total, 0.0, 0.0
    for b in bounds:
        if cum[b] >= rank:
            if math.isinf(b):
                return lo
            return lo + (b - lo) * (rank - below) / max(cum[b] - below, 1e-12)
        lo, below = b, cum[b]
    return lo


def jain(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    if not xs or not any(xs):
        return math.nan
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def fairness(stats: dict[str, TenantStats], demand: dict[str, float]) -> float:
    """Jain's index of goodput / max-min share over the standard band's tenants."""
    band = [t for t, (b, _, _) in TENANTS.items() if b == "standard" and t in stats]
    if len(band) < 2:
        return math.nan
    cap = sum(stats[t].goodput_rps for t in band)
    share: dict[str, float] = {}
    left, todo = cap, sorted(band, key=lambda t: demand[t])
    while todo:
        even = left / len(todo)
        t = todo.pop(0)
        share[t] = min(demand[t], even)
        left -= share[t]
    return jain([stats[t].goodput_rps / share[t] for t in band if share[t] > 0])


async def one_run(
    name: str,
    schedules: dict[str, list[Request]],
    fleet: Fleet,
    timing: Timing,
    opts: argparse.Namespace,
    log_dir: Path,
    *,
    flow: bool,
) -> Run:
    procs = TenantProcesses(fleet, log_dir)
    procs.flow = flow
    procs.engine_priority = opts.engine_priority == "on"
    procs.workers = opts.router_workers
    procs.request_logs = opts.breakdown
    loop = asyncio.get_running_loop()
    try:
        urls = await asyncio.to_thread(procs.start_engines)
        sessions = {
            t: aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                headers={"Authorization": f"Bearer {key}"},
            )
            for t, (_, _, key) in TENANTS.items()
        }
        try:
            any_session = next(iter(sessions.values()))
            rurl = await asyncio.to_thread(procs.start_router, name, urls)
            await wait_router_scraped(any_session, rurl, fleet.engines)
            url = rurl + "/v1/chat/completions"
            router_pid = procs.pids()["router"]
            cpu0 = cpu_seconds(router_pid)
            busy0 = machine_ticks()
            lag0 = await routing.lag_resets(any_session, urls)
            merged = sorted(
                (
                    (req.at_s, t, f"{t}-{n}" if opts.breakdown else None, req)
                    for t, sched in schedules.items()
                    for n, req in enumerate(sched)
                ),
                key=lambda x: x[0],
            )
            results: dict[str, list[Result]] = {t: [] for t in schedules}
            tasks: set[asyncio.Task[None]] = set()
            t0 = loop.time() + 0.2

            async def fire(tenant: str, rid: str | None, req: Request) -> None:
                res = Result(req, loop.time(), rid=rid)
                results[tenant].append(res)
                await stream_one(sessions[tenant], url, req, res, False)

            async def at_warmup() -> tuple[dict[str, tuple[float, float]], dict[str, Any]]:
                await asyncio.sleep(max(0.0, t0 + timing.warmup_s - loop.time()))
                waits = await flow_waits(any_session, rurl)
                return await counters(any_session, urls), waits

            warm = asyncio.create_task(at_warmup())
            for at, tenant, rid, req in merged:
                delay = t0 + at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(fire(tenant, rid, req))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.sleep(max(0.0, t0 + timing.duration_s - loop.time()))
            c1_at = loop.time()
            c1 = await counters(any_session, urls)
            if tasks:
                await asyncio.wait(set(tasks), timeout=timing.drain_s)
            end_s = loop.time()
            waits1 = await flow_waits(any_session, rurl)
            c0, waits0 = await warm
            router_cpu = cpu_seconds(router_pid) - cpu0
            busy1 = machine_ticks()
            lags = await routing.lag_resets(any_session, urls) - lag0
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for s in sessions.values():
                await s.close()
    finally:
        await asyncio.to_thread(procs.stop)
    assert c1_at >= t0
    h = sum(c1[e][0] - c0[e][0] for e in urls)
    q = sum(c1[e][1] - c0[e][1] for e in urls)
    window = timing.duration_s - timing.warmup_s
    out: dict[str, TenantStats] = {}
    all_ttfts: dict[str, list[float]] = {}
    all_waits: dict[str, dict[float, float]] = {}
    split: dict[str, list[breakdown.Sample]] = {}
    logs = [breakdown.log_path(log_dir, e) for e in urls] if opts.breakdown else []
    engine_lines = breakdown.read_logs(logs)
    sent_all = 0
    for tenant, rs in results.items():
        s = out[tenant] = TenantStats()
        measured = [r for r in rs if r.req.at_s >= timing.warmup_s]
        sent_all += len(rs)
        s.sent = len(measured)
        served = [r for r in measured if r.error is None and r.done_s is not None]
        s.served = len(served)
        for r in measured:
            if r.error is not None:
                s.refused[r.error] += 1
            elif r.done_s is None:
                s.lost += 1
        s.late = sum(1 for r in served if r.e2e(end_s) > REQUEST_TIMEOUT_S)
        ok = [r for r in measured if r.error is None]
        ttfts = [r.ttft(end_s) for r in ok]
        s.ttft_p50, s.ttft_p99 = pct(ttfts, 0.50), pct(ttfts, 0.99)
        all_ttfts[tenant] = ttfts
        s.good = sum(1 for r in served if r.ttft(end_s) <= opts.slo_s)
        s.goodput_rps = s.good / window
        w1, w0 = waits1.get(tenant, {}), waits0.get(tenant, {})
        waited = {b: n - w0.get(b, 0.0) for b, n in w1.items()}
        s.held = round(waited.get(math.inf, 0.0))
        s.wait_p50, s.wait_p99 = bucket_quantile(waited, 0.50), bucket_quantile(waited, 0.99)
        all_waits[tenant] = waited
        if opts.breakdown:
            split[tenant] = breakdown.samples(measured, engine_lines)
    demand = {t: len([r for r in schedules[t] if r.at_s >= timing.warmup_s]) / window for t in out}
    return Run(
        name=name,
        tenants=out,
        hit_rate=h / q if q else math.nan,
        fairness=fairness(out, demand),
        router_cpu_ms=router_cpu * 1000 / max(1, sent_all),
        machine_busy=(busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]),
        lag_resets=lags,
        ttfts=all_ttfts,
        waits=all_waits,
        split=split,
    )


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:,.0f}"


def table(runs: list[Run]) -> list[str]:
    lines = [
        "| run | tenant | sent | TTFT p50 ms | TTFT p99 ms | goodput req/s | refused | lost"
        " | late | held | held p50 / p99 ms |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for run in runs:
        for t, s in run.tenants.items():
            refused = ", ".join(f"{k}: {n}" for k, n in sorted(s.refused.items())) or "0"
            lines.append(
                f"| {run.name} | {t} | {s.sent} | {_ms(s.ttft_p50)} | {_ms(s.ttft_p99)} | "
                f"{s.goodput_rps:.2f} | {refused} | {s.lost} | {s.late} | {s.held} | "
                f"{_ms(s.wait_p50)} / {_ms(s.wait_p99)} |"
            )
    lines += [
        "",
        "| run | hit rate | fairness (Jain, standard band) | router CPU ms / request |"
        " machine busy | sim lag resets |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        lines.append(
            f"| {run.name} | {run.hit_rate:.1%} | {run.fairness:.3f} | {run.router_cpu_ms:.2f} | "
            f"{run.machine_busy:.0%} | {run.lag_resets} |"
        )
    return lines


def verdicts(runs: list[Run], top: str) -> list[str]:
    by = {r.name: r for r in runs}
    base = by["unloaded"]
    on, off = by[f"{top} on"], by[f"{top} off"]
    out = []

    def say(ok: bool, what: str) -> None:
        out.append(f"- {'met' if ok else 'MISSED'}: {what}")

    for tenant, bound in (("quiet", 1.5), ("critical", 1.2)):
        ratio = on.tenants[tenant].ttft_p99 / base.tenants[tenant].ttft_p99
        say(ratio <= bound, f"{tenant} p99 TTFT at {top} {ratio:.2f}x its unloaded (<= {bound}x)")
    say(on.fairness >= 0.95, f"fairness index at {top} {on.fairness:.3f} (>= 0.95)")
    gap = (off.hit_rate - on.hit_rate) * 100
    say(abs(gap) <= 2.0 or gap < 0, f"hit rate at {top} {gap:+.1f} points below flow off (<= 2)")
    for run in runs:
        lost = sum(s.lost + s.late for s in run.tenants.values())
        if run.name.endswith(" on") or run.name == "unloaded":
            say(lost == 0, f"{run.name}: {lost} requests lost or past their deadline (0)")
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--engines", type=int, default=4)
    a("--loads", type=float, nargs="+", default=(1.5, 2.0))
    a("--duration-s", type=float, default=40.0, help="per run, including the warm-up")
    a("--warmup-s", type=float, default=8.0)
    a("--drain-s", type=float, default=45.0, help="after the last arrival (past 30 s waits)")
    a(
        "--slo-s",
        type=float,
        default=REQUEST_TIMEOUT_S,
        help="TTFT within which a served request counts as goodput (default: the deadline)",
    )
    a("--capacity-rps", type=float, default=None, help="skip calibration, use this")
    a("--short", action="store_true", help="shorter runs and calibration (noisier)")
    a("--seed", type=int, default=1)
    a(
        "--engine-priority",
        choices=("on", "off"),
        default="on",
        help="engines order their queues by the band the router writes (default on)",
    )
    a(
        "--tenant-prompts",
        choices=("own", "shared"),
        default="own",
        help="each tenant its own system prompts, or all the same ones (default own)",
    )
    a(
        "--router-workers",
        type=int,
        default=None,
        help="the router's --workers (default: the router's own, one per core)",
    )
    a(
        "--breakdown",
        action="store_true",
        help="split each tenant's TTFT into router, engine queue and prefill (engine logs)",
    )
    a("--no-write", action="store_true")
    own, rest = p.parse_known_args(argv)
    base = routing.parse_args(rest)
    for k, v in vars(own).items():
        setattr(base, k, v)
    base.calib_conc = 8 * base.engines
    if own.short:
        base.duration_s, base.warmup_s, base.calib_s, base.calib_warmup_s = 25.0, 5.0, 12.0, 4.0
    return base


def write_results(text: str) -> None:
    path = routing.RESULTS
    doc = path.read_text()
    start = doc.find(HEADING + "\n")
    if start < 0:
        doc = doc.rstrip("\n") + "\n\n" + text
    else:
        end = doc.find("\n## ", start + len(HEADING))
        doc = doc[:start] + text + (doc[end + 1 :] if end >= 0 else "")
    path.write_text(doc)


async def amain(opts: argparse.Namespace, command: str) -> int:
    fleet = routing._fleet(opts)
    timing = Timing(opts.duration_s, opts.warmup_s, opts.drain_s)
    log_dir = Path(tempfile.mkdtemp(prefix="llmgw-bench-tenants-"))
    began = time.monotonic()
    lead = opts.think_s * opts.turns[1] * 1.5
    try:
        if opts.capacity_rps is not None:
            capacity = opts.capacity_rps
        else:
            convs = Conversations(routing._workload(opts, "none", opts.seed))
            capacity, _ = await routing.calibrate(convs, fleet, opts, log_dir)
        print(f"capacity C: {capacity:.1f} req/s", flush=True)

        def schedules(load: float, only: tuple[str, ...]) -> dict[str, list[Request]]:
            out = {}
            for i, (t, (_, share, _)) in enumerate(TENANTS.items()):
                if t not in only:
                    continue
                w = routing._workload(opts, "none", opts.seed + 100 * i)
                if opts.tenant_prompts == "shared":
                    w = dataclasses.replace(w, prompt_seed=opts.seed)
                convs = Conversations(w)
                out[t] = open_loop_schedule(
                    convs,
                    rate_rps=capacity * load * share / UNITS,
                    duration_s=opts.duration_s,
                    warmup_s=opts.warmup_s,
                    lead_s=lead,
                    seed=opts.seed + 100 * i,
                )
            return out

        top = max(opts.loads)
        runs = [
            await one_run(
                "unloaded",
                schedules(top, ("quiet", "critical")),
                fleet,
                timing,
                opts,
                log_dir,
                flow=True,
            )
        ]
        print("\n".join(table(runs)), flush=True)
        for load in opts.loads:
            sched = schedules(load, tuple(TENANTS))
            for flow in (False, True):
                name = f"{load:g}x {'on' if flow else 'off'}"
                runs.append(await one_run(name, sched, fleet, timing, opts, log_dir, flow=flow))
                print("\n".join(table(runs[-1:])[2:]), flush=True)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    lines = table(runs)
    if opts.breakdown:
        rows = [(run.name, t, ss) for run in runs for t, ss in run.split.items()]
        lines += ["", *breakdown.table(rows)]
    checks = verdicts(runs, f"{top:g}x")
    elapsed = time.monotonic() - began
    print("\n".join(lines))
    print("\n".join(checks))
    print(f"whole run: {elapsed:.0f} s")
    if not opts.no_write:
        text = "\n".join(
            [
                HEADING,
                "",
                f"Command: `{command}`; {opts.engines} sim-engines, capacity C "
                f"{capacity:.1f} req/s (closed-loop round-robin); loads {list(opts.loads)} x C, "
                f"split noisy 3 : quiet 0.3 : critical 0.2; "
                f"goodput: served with TTFT <= {opts.slo_s:g} s; "
                f"engine priority {opts.engine_priority}; "
                f"system prompts: {opts.tenant_prompts}. "
                f"{elapsed:.0f} s in all.",
                "",
                *lines,
                "",
                *checks,
                "",
            ]
        )
        write_results(text)
    return 0


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    command = " ".join(["bench/routing_tenants.py", *argv])
    return asyncio.run(amain(opts, command))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
