"""What a `Snapshot` costs in each shape it could take (issue 29).

The registry builds one `Snapshot` per endpoint of the model on every request, and
the scheduler reads about a dozen of its fields. Three shapes with its 17 fields,
each built by keyword and read as `load_of` reads it:
- `Hand`: a hand-written class with `__slots__` and a keyword-only `__init__` (what
  Snapshot is, replicas/snapshot.py);
- `Frozen`: `@dataclass(frozen=True, slots=True, kw_only=True)`;
- `Struct`: `msgspec.Struct, frozen=True, kw_only=True`, defined in a module of its
  own, never compiled (msgspec reads a Struct's annotations at run time).
The loop that builds and reads them runs as Python, and with `--compiled` also
compiled by mypyc (as registry.py and scheduler.py are: compiled.py), in a
temporary folder. ns per snapshot, best of 5 runs of 200,000.

Usage: .venv/bin/python bench/snapshot_shape.py [--compiled]
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

FIELDS = [
    "info",
    "stats",
    "drain_rate",
    "inflight",
    "running_capacity",
    "stale",
    "age_s",
    "breaker",
    "restarts",
    "inflight_at_scrape",
    "pending",
    "probe_in_s",
    "opened_total",
    "id",
    "weight",
    "priority",
    "engine_requests",
]

STRUCT = """
import msgspec

class Struct(msgspec.Struct, frozen=True, kw_only=True):
""" + "".join(f"    {f}: object\n" for f in FIELDS)

SHAPES = """
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from shape_struct import Struct


class Hand:
    __slots__ = {fields!r}

    def __init__(self, {params}) -> None:
{assigns}


@dataclass(frozen=True, slots=True, kw_only=True)
class Frozen:
{annotations}


def _read(s_inflight: object, s_pending: object, s_weight: object) -> int:
    return 1 if s_inflight is s_pending or s_weight is None else 0


def run_hand(n: int) -> float:
    t0 = time.process_time()
    for i in range(n):
        s = Hand({call})
        _read(s.inflight, s.pending, s.weight)
    return (time.process_time() - t0) / n * 1e9


def run_frozen(n: int) -> float:
    t0 = time.process_time()
    for i in range(n):
        s = Frozen({call})
        _read(s.inflight, s.pending, s.weight)
    return (time.process_time() - t0) / n * 1e9


def run_struct(n: int) -> float:
    t0 = time.process_time()
    for i in range(n):
        s = Struct({call})
        _read(s.inflight, s.pending, s.weight)
    return (time.process_time() - t0) / n * 1e9
"""


def write(folder: Path) -> None:
    (folder / "shape_struct.py").write_text(STRUCT)
    (folder / "shapes.py").write_text(
        SHAPES.format(
            fields=tuple(FIELDS),
            params="*, " + ", ".join(f"{f}: int" for f in FIELDS),
            assigns="".join(f"        self.{f}: Final = {f}\n" for f in FIELDS),
            # int, not object: mypyc's dataclass support looks annotations up by name.
            annotations="".join(f"    {f}: int\n" for f in FIELDS),
            call=", ".join(f"{f}=i" for f in FIELDS),
        )
    )


def measure(folder: Path) -> dict[str, float]:
    sys.path.insert(0, str(folder))
    shapes = importlib.import_module("shapes")
    out = {}
    for name in ("hand", "frozen", "struct"):
        run = getattr(shapes, f"run_{name}")
        out[name] = min(run(200_000) for _ in range(5))
    out["compiled"] = float(not shapes.__file__.endswith(".py"))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--compiled", action="store_true", help="also compiled by mypyc")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write(folder)
        if args.compiled:
            code = f"import sys; sys.path.insert(0, {tmp!r}); import shapes; print(shapes.__file__)"
            subprocess.run(
                [sys.executable, "-m", "mypyc", "shapes.py"],
                cwd=folder,
                check=True,
                capture_output=True,
            )
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            print(f"compiled: {done.stdout.strip()}")
        got = measure(folder)
    print("| shape | ns per snapshot, built by keyword and read |")
    print("|---|---:|")
    label = "compiled" if got["compiled"] else "Python"
    for name, title in (
        ("hand", "hand-written, __slots__"),
        ("frozen", "frozen dataclass (slots, kw_only)"),
        ("struct", "msgspec Struct (frozen, kw_only)"),
    ):
        print(f"| {title}, {label} | {got[name]:,.0f} |")


if __name__ == "__main__":
    main()
