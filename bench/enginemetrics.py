"""Engine-metrics parser vs prometheus_client's text parser.

Per fixture: microseconds per parse for `llmgw.router.replicas.enginemetrics.parse`
(bytes in, Stats out) and for `prometheus_client.parser.text_string_to_metric_families`
(str in, every family materialised — what a scraper built on it would pay),
best of several repeats. Target: ≥ 10× faster on vllm-v1.txt.

    .venv/bin/python bench/enginemetrics.py [--repeat 7] [--no-write]
"""

from __future__ import annotations

import argparse
import platform
import re
import sys
import timeit
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from llmgw.router.replicas.enginemetrics import parse

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "engine-metrics"
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## enginemetrics.py"
TARGET = 10.0


def best_us(fn: object, repeat: int) -> float:
    """Best per-call microseconds over `repeat` runs, each long enough to time."""
    timer = timeit.Timer(fn)  # type: ignore[arg-type]
    number, _ = timer.autorange()
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e6


def prometheus_parse(text: str) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(text))


def measure(repeat: int) -> list[tuple[str, int, float, float | None]]:
    rows = []
    for path in sorted(FIXTURES.glob("*.txt")):
        raw = path.read_bytes()
        text = raw.decode()
        engine = re.search(rb"engine=(\S+)", raw).group(1).decode()  # type: ignore[union-attr]
        ours = best_us(lambda raw=raw, engine=engine: parse(raw, engine), repeat)
        try:
            theirs: float | None = best_us(lambda text=text: prometheus_parse(text), repeat)
        except ValueError:  # prometheus_client refuses some real-world expositions
            theirs = None
        rows.append((path.name, len(raw), ours, theirs))
    return rows


def table(rows: list[tuple[str, int, float, float | None]]) -> str:
    lines = [
        "| fixture | size KB | ours µs | prometheus_client µs | speed-up |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, size, ours, theirs in rows:
        ratio = "-" if theirs is None else f"{theirs / ours:.0f}×"
        their = "error" if theirs is None else f"{theirs:,.0f}"
        lines.append(f"| {name} | {size / 1024:.0f} | {ours:,.1f} | {their} | {ratio} |")
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
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md")
    args = ap.parse_args()
    rows = measure(args.repeat)
    out = table(rows)
    print(out)
    v1 = next(r for r in rows if r[0] == "vllm-v1.txt")
    speedup = (v1[3] or 0.0) / v1[2]
    verdict = "met" if speedup >= TARGET else "NOT met"
    summary = (
        f"vllm-v1.txt: {speedup:.0f}× faster than prometheus_client "
        f"(target ≥ {TARGET:.0f}×: {verdict})"
    )
    print(summary)
    if not args.no_write:
        write_section(
            "Parsing one /metrics body into `Stats` (`llmgw.router.replicas.enginemetrics.parse`, "
            "bytes in) vs `prometheus_client.parser.text_string_to_metric_families` "
            "(str in, every family materialised); best of "
            f"{args.repeat} repeats, Python {platform.python_version()}, "
            "on the shared 2-core dev machine.\n\n"
            "Command: `.venv/bin/python bench/enginemetrics.py`\n\n"
            f"{out}\n\n{summary}."
        )
    return 0 if speedup >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
