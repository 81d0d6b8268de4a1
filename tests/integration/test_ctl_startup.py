"""`llmgw ctl` starts fast: its entry point imports nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
import time

# Imported by some command, never by `llmgw ctl --help`.
HEAVY = ("aiohttp", "rich", "msgspec", "yaml", "sqlalchemy", "uvloop", "prometheus_client")

# Over bare `python -c pass`, best of several runs. Generous for a loaded 2-core
# machine; the real figure is about 20 ms.
BUDGET_S = 0.150


def _best_wall(argv: list[str], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
        best = min(best, time.perf_counter() - start)
    return best


class TestStartup:
    """ctl starts fast and lists its commands."""

    def test_entry_point_imports_nothing_heavy(self) -> None:
        """Importing llmgw.ctl.main loads no aiohttp, rich, msgspec, yaml or sqlalchemy."""
        code = (
            "import json, sys, llmgw.ctl.main; "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=30
        ).stdout
        assert json.loads(out) == []

    def test_help_is_within_budget(self) -> None:
        """`llmgw ctl --help` costs under 150 ms over a bare interpreter (best of 5)."""
        bare = _best_wall([sys.executable, "-c", "pass"])
        help_ = _best_wall([sys.executable, "-m", "llmgw", "ctl", "--help"])
        assert help_ - bare < BUDGET_S, f"ctl --help took {help_:.3f}s vs bare {bare:.3f}s"

    def test_help_lists_the_commands(self) -> None:
        """--help names every command and exits 0."""
        proc = subprocess.run(
            [sys.executable, "-m", "llmgw", "ctl", "--help"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 0
        for name in ("status", "nodes", "replicas", "drain", "apply", "bench"):
            assert name in proc.stdout
