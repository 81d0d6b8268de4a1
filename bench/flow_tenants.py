"""What flow control costs per queued request as the tenants waiting in one band grow.

Under saturation the router holds requests in a queue per (band, tenant) and grants
them by weighted fair queueing among the band's tenants (router/request/flow.py). This
times that work in-process, no network, with N tenants waiting in the `standard` band
(N = 1, 10, 100, 1,000, 10,000):

- **queue**: a `FlowQueue` with every tenant holding two requests. One cycle is what
  the gate does for one request at saturation: `push` (with the expected-wait bound
  computed, the grant rate known), `peek` (the gate's `_may_grant`), `pop` with a room
  set (its `_grant`) and `claim` (what a worker publishes to the others); the granted
  tenant's next request is the next cycle's push, so N stays put. Each call is timed on
  its own (`perf_counter_ns`, whose own cost, tens of ns, is in the figures).
- **passing**: N waiting, one request each, from a pool of 3 × N tenants served in
  turn (one key per user: a user's next request comes long after its last was
  granted, so most tenants the band has seen have nothing queued). A cycle is a
  `pop` and the next tenant's `push`, timed together.
- **gate**: a `FlowGate` with N waiters parked in `wait_turn` (one per tenant, on one
  asyncio loop): one cycle is a `freed()` that grants the first in line, the granted
  waiter leaving, and its tenant's next request arriving and parking. Wall time per
  cycle, the loop's own task switching included. Up to `--gate-max` tenants (parking
  them one by one is quadratic while a grant scans every tenant).

Each figure is the best of `--repeats` runs (the run least disturbed by other work on
the machine). A run's cycles go on for about
`BUDGET_S` of timed work (MIN_CYCLES..MAX_CYCLES), so a cheap cycle is timed over
enough of them to spread the index's occasional rebuilds (a grant that walks every
tenant keeps its run short with fewer).

Run it with this checkout's sources first on the path (the virtual environment may
hold another checkout's, installed editable); it says which it timed:

    PYTHONPATH=src .venv/bin/python bench/flow_tenants.py [--repeats 5]
        [--gate-max 1000] [--label NAME] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot, Stats
from llmgw.router.request import flow
from llmgw.router.request.flow import BANDS, BandLimits, FlowQueue, Refusal
from llmgw.router.request.flowgate import FlowGate
from llmgw.wire.endpoints import EndpointInfo

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
# The code timed: the flow modules and what they import.
CODE = "src/llmgw/router/request"
SECTION = "## flow_tenants.py"
TENANTS = (1, 10, 100, 1_000, 10_000)
BAND = "standard"
# Requests each tenant keeps queued in the queue scenario.
DEPTH = 2
# Tenants the band has seen in the passing scenario, per tenant waiting.
PASSING = 3
# Timed work per run, in ns, and the cycles it may take.
BUDGET_NS = 250_000_000
MIN_CYCLES = 20
MAX_CYCLES = 20_000


def more(cycles: int, spent_ns: int) -> bool:
    """Whether a run goes on for another cycle."""
    return cycles < MAX_CYCLES and (cycles < MIN_CYCLES or spent_ns < BUDGET_NS)


def limits(max_queued: int) -> dict[str, BandLimits]:
    # No bound is reached: the figures are the cost of the order, not of refusals.
    return {b: BandLimits(max_queued=max_queued, max_wait_s=1e9) for b in BANDS}


def queue_run(n: int) -> dict[str, float]:
    """One run of the queue scenario: µs per call of push, peek + pop, claim."""
    q = FlowQueue(limits(DEPTH * n + 2))
    names = [f"team-{i:05d}" for i in range(n)]
    now = 0.0
    for _ in range(DEPTH):
        for name in names:
            got = q.push(BAND, name, now, running=64)
            assert not isinstance(got, Refusal)
    room = frozenset({"e1", "e2"})
    # The grant rate known, so a push computes its expected wait, as under load.
    for _ in range(2):
        now += 0.001
        t = q.pop(now, room)
        assert t is not None
        q.push(BAND, t.tenant, now, running=64)
    cycles = 0
    clock = time.perf_counter_ns
    push_ns = grant_ns = claim_ns = 0
    tenant = names[0]
    while more(cycles, push_ns + grant_ns + claim_ns):
        cycles += 1
        now += 0.001
        a = clock()
        got = q.push(BAND, tenant, now, running=64)
        b = clock()
        q.peek()
        t = q.pop(now, room)
        c = clock()
        q.claim(now)
        d = clock()
        assert not isinstance(got, Refusal)
        assert t is not None
        tenant = t.tenant
        push_ns += b - a
        grant_ns += c - b
        claim_ns += d - c
    return {
        "push": push_ns / cycles / 1e3,
        "grant": grant_ns / cycles / 1e3,
        "claim": claim_ns / cycles / 1e3,
    }


def passing_run(n: int) -> float:
    """One run of the passing scenario: µs per pop and push."""
    q = FlowQueue(limits(n + 2))
    pool = [f"user-{i:06d}" for i in range(PASSING * n)]
    now = 0.0
    for name in pool[:n]:
        got = q.push(BAND, name, now, running=64)
        assert not isinstance(got, Refusal)
    # The rest of the pool came and went before (granted, or gave up: the band keeps
    # their last tags alike), so the band has seen every tenant, as in steady state.
    for name in pool[n:]:
        got = q.push(BAND, name, now, running=64)
        assert not isinstance(got, Refusal)
        q.remove(got[0])
    room = frozenset({"e1"})
    nxt = n
    cycles = 0
    clock = time.perf_counter_ns
    spent = 0
    while more(cycles, spent):
        cycles += 1
        now += 0.001
        a = clock()
        t = q.pop(now, room)
        got = q.push(BAND, pool[nxt], now, running=64)
        b = clock()
        assert t is not None
        assert not isinstance(got, Refusal)
        nxt = (nxt + 1) % len(pool)
        spent += b - a
    return spent / cycles / 1e3


def snapshot(running: int) -> Snapshot:
    """One replica with capacity 8 running `running` (8: full, its engine queueing)."""
    return Snapshot.of(
        info=EndpointInfo(id="e1", url="http://e1", models=("m",)),
        stats=Stats(running=running, waiting=1 if running >= 8 else 0, kv_usage=0.0),
        drain_rate=0.0,
        inflight=0,
        running_capacity=8,
        stale=False,
        age_s=1.0,
        breaker=BreakerState.CLOSED,
        restarts=0,
        inflight_at_scrape=0,
        pending=0,
    )


def gate_run(n: int) -> float:
    """One run of the gate scenario: µs of wall time per grant and arrival."""
    full = [snapshot(8)]
    room = [snapshot(7)]

    def saturated() -> Sequence[Snapshot]:
        return full

    def with_room(_model: str) -> Sequence[Snapshot]:
        return room

    async def main() -> float:
        gate = FlowGate(limits(n + 2))
        stop = False

        async def tenant(name: str) -> None:
            # Granted, its next request arrives at once: N stay waiting.
            while not stop:
                await gate.wait_turn("m", BAND, name, deadline=1e18, snapshots=saturated)

        async with asyncio.TaskGroup() as tg:
            for i in range(n):
                tg.create_task(tenant(f"team-{i:05d}"))
            while gate.waiting < n:
                await asyncio.sleep(0)
            cycles = 0
            t0 = time.perf_counter_ns()
            while more(cycles, time.perf_counter_ns() - t0):
                cycles += 1
                gate.freed("m", with_room)
                while gate.waiting < n:
                    await asyncio.sleep(0)
            per = (time.perf_counter_ns() - t0) / cycles / 1e3
            assert gate.waiting == n
            stop = True
            while gate.waiting:
                gate.freed("m", with_room)
                await asyncio.sleep(0)
        return per

    return asyncio.run(main())


def timed_code() -> str:
    """Which code is timed: this checkout's, by the last commit that changed it (and
    whether it has changes since), or another checkout's, by its path."""
    where = Path(flow.__file__).resolve()
    if not where.is_relative_to(ROOT / CODE):
        print(f"timing {where}, not this checkout's (PYTHONPATH=src)", file=sys.stderr)
        return f"{where.parent} (not this checkout)"
    try:
        last = subprocess.run(
            ["git", "log", "-1", "--format=%h", "--", CODE],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.strip()
        changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", CODE], cwd=ROOT)
    except (OSError, subprocess.CalledProcessError):
        return f"{CODE} (no git)"
    return f"{CODE} at {last}" + (" with uncommitted changes" if changed.returncode else "")


def write_subsection(label: str, body: str) -> None:
    """Put `body` under `### label` in this benchmark's section of RESULTS.md, replacing
    a subsection of that label; the section is appended if missing, others untouched."""
    old = RESULTS.read_text()
    sub = f"### {label}\n\n{body.strip()}\n\n"
    m = re.search(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", old, re.MULTILINE | re.DOTALL)
    if m is None:
        RESULTS.write_text(old.rstrip() + f"\n\n{SECTION}\n\n{sub}")
        return
    section = m.group(0)
    pattern = re.compile(rf"^### {re.escape(label)}\n.*?(?=^###? |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(section):
        section = pattern.sub(lambda _m: sub, section)
    else:
        section = section.rstrip() + "\n\n" + sub
    RESULTS.write_text(old[: m.start()] + section + old[m.end() :])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gate-max", type=int, default=1_000, help="most tenants for the gate")
    ap.add_argument("--label", default="", help="RESULTS.md subsection (default: the code)")
    ap.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md")
    opts = ap.parse_args(argv)
    rows = [
        "| tenants waiting | push µs | peek + pop µs | claim µs | push + grant µs | "
        "passing: pop + push µs | gate: grant + arrival µs |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    code = timed_code()
    print(code, rows[0], rows[1], sep="\n", flush=True)
    for n in TENANTS:
        runs = [queue_run(n) for _ in range(opts.repeats)]
        fig = {k: min(r[k] for r in runs) for k in runs[0]}
        total = min(r["push"] + r["grant"] for r in runs)
        passing = min(passing_run(n) for _ in range(opts.repeats))
        gate = "-"
        if n <= opts.gate_max:
            gate = f"{min(gate_run(n) for _ in range(opts.repeats)):,.1f}"
        rows.append(
            f"| {n:,} | {fig['push']:,.2f} | {fig['grant']:,.2f} | {fig['claim']:,.2f} "
            f"| {total:,.2f} | {passing:,.2f} | {gate} |"
        )
        print(rows[-1], flush=True)
    load = os.getloadavg()
    command = " ".join(
        ["PYTHONPATH=src nice -n 15 .venv/bin/python", "bench/flow_tenants.py", *argv]
    )
    label = opts.label or code
    body = "\n".join(
        [
            f"Command: `{command}`; Python {sys.version.split()[0]}, Python modules (flow.py "
            f"and flowgate.py are not in the mypyc build), load average {load[0]:.1f} / "
            f"{load[1]:.1f} / {load[2]:.1f} at the end.",
            "",
            *rows,
        ]
    )
    if not opts.no_write:
        write_subsection(label, body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
