"""Time to first token split between the router and the engine (routing_tenants.py
--breakdown, routing_tenants_ab.py --breakdown).

Each request goes out with an `x-request-id` of its own (`<tenant>-<n>`), which the
router forwards to the engine; the sim-engines run with `--request-log` and write,
per request, when it arrived, was first scheduled and got its first token, on
CLOCK_MONOTONIC, the clock the client read (`time.monotonic()`) just before its POST.
The engines' lines are joined to the client's requests on that id. A request the
router retried on another engine has a line on each: the later arrival is the one
that served it.

Figures, per tenant, over the measured requests that got a first token
    router        engine arrival - client send: the client's own send, the router
                  (authentication, flow control's queue, routing, the forward) and
                  both hops; for a retried request, its first tries too
    engine queue  first scheduled - engine arrival: the engine's waiting queue
    prefill       first token - first scheduled: the prefill steps, shared with the
                  running requests' decodes (and, for a request preempted before its
                  first token, its second wait)
    misses        share whose cached tokens were under half of the prompt
    preempted     share the engine preempted at least once
What is left of TTFT (the first token's way back to the client) is not shown.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from routing import Result, pct


@dataclass(frozen=True)
class Sample:
    """One request's split, in seconds."""

    router_s: float
    queue_s: float
    prefill_s: float
    miss: bool
    preempted: bool


def log_path(log_dir: Path, eid: str) -> Path:
    return log_dir / f"{eid}.requests.jsonl"


def read_logs(paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """request_id → the engine's line for it (the later arrival where there are two).

    A missing file reads as empty: a tree whose sim-engine has no --request-log
    ignores the flag, as it ignores every flag it does not know.
    """
    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        if not path.exists():
            continue
        for raw in path.read_text().splitlines():
            line = json.loads(raw)
            rid = line.get("request_id")
            if rid is None:
                continue
            seen = out.get(rid)
            if seen is None or line["arrival_s"] >= seen["arrival_s"]:
                out[rid] = line
    return out


def samples(results: Iterable[Result], lines: dict[str, dict[str, Any]]) -> list[Sample]:
    """The split of every request in `results` that got a first token and has a line."""
    out = []
    for r in results:
        line = lines.get(r.rid) if r.rid is not None else None
        if r.first_s is None or r.sent_mono is None or line is None:
            continue
        scheduled, first = line["scheduled_s"], line["first_token_s"]
        if scheduled is None or first is None:
            continue
        prompt, cached = line["prompt_tokens"], line["cached_tokens"] or 0
        out.append(
            Sample(
                router_s=line["arrival_s"] - r.sent_mono,
                queue_s=scheduled - line["arrival_s"],
                prefill_s=first - scheduled,
                miss=cached < prompt / 2,
                preempted=line["preemptions"] > 0,
            )
        )
    return out


def _three(xs: Sequence[float]) -> str:
    """p50/p90/p99 in ms, to a tenth: the router's share is a few ms."""
    ps = [pct(xs, q) for q in (0.50, 0.90, 0.99)]
    return "/".join("-" if math.isnan(v) else f"{v * 1000:,.1f}" for v in ps)


def _share(flags: Sequence[bool]) -> str:
    return f"{sum(flags) / len(flags):.0%}" if flags else "-"


def table(rows: Iterable[tuple[str, str, Sequence[Sample]]], *, first: str = "run") -> list[str]:
    """Markdown rows, one per (run or variant, tenant, its samples); `first` heads the
    first column."""
    lines = [
        f"| {first} | tenant | requests | router p50/p90/p99 ms | engine queue p50/p90/p99 ms"
        " | prefill p50/p90/p99 ms | misses | preempted |",
        "|---|---|---:|---|---|---|---:|---:|",
    ]
    for name, tenant, ss in rows:
        lines.append(
            f"| {name} | {tenant} | {len(ss)} | {_three([s.router_s for s in ss])} | "
            f"{_three([s.queue_s for s in ss])} | {_three([s.prefill_s for s in ss])} | "
            f"{_share([s.miss for s in ss])} | {_share([s.preempted for s in ss])} |"
        )
    return lines
