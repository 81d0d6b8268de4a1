"""The programs under their units' /proc view still export what docs/metrics.md promises.

The controller's and the router's units set `ProcSubset=pid` and `ProtectProc=invisible`:
systemd mounts a /proc that shows only process folders, so /proc/stat (where the boot
time lives) is gone. The test reads those settings from the unit, builds the same view
(a private mount namespace with /proc mounted `subset=pid,hidepid=invisible`), runs
the real program in it and scrapes its `process_*` family. Needs root (`unshare`).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from llmgw.testing import start_program
from tests.integration.router_fixtures import base_config, write_config

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a /proc of its own needs root"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare (util-linux)"),
]


def _proc_view(unit: str) -> tuple[str, ...]:
    """A prefix that execs the program with the /proc `unit` gives it (as systemd would)."""
    text = (UNITS / unit).read_text()
    subset = re.search(r"^ProcSubset=(\S+)$", text, re.M)
    protect = re.search(r"^ProtectProc=(\S+)$", text, re.M)
    options = ",".join(
        [f"subset={subset.group(1)}"] * (subset is not None and subset.group(1) == "pid")
        + [f"hidepid={protect.group(1)}"] * (protect is not None)
    )
    assert options, f"{unit} restricts nothing in /proc: this test has nothing to check"
    mount = f'mount -t proc -o {options} proc /proc && exec "$@"'
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh")


def _process_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.findall(r"^(process_[a-z_]+) (\S+)$", text, re.M)
    return {name: float(value) for name, value in found}


def _check(metrics: dict[str, float], started: float) -> None:
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total"):
        assert name in metrics, f"{name} missing: {sorted(metrics)}"
    # The start time is derived from the boot time; a wrong one would be decades off.
    assert abs(metrics["process_start_time_seconds"] - started) < 60, metrics


class TestProcSubset:
    """The controller and the router export `process_*` where /proc shows only processes."""

    def test_controller(self, tmp_path: Path) -> None:
        """The controller's unit's /proc view keeps its process metrics."""
        args = ["controller", "--port", "0", "--database", "memory://"]
        started = time.time()
        prefix = _proc_view("llmgw-controller.service")
        with start_program(args, prefix=prefix, log_dir=tmp_path) as ctl:
            _check(_process_metrics(ctl.url), started)

    @pytest.mark.parametrize("workers", [1, 2])
    def test_router(self, tmp_path: Path, workers: int) -> None:
        """The router's unit's /proc view keeps its process metrics, with workers or without."""
        path = write_config(tmp_path / "router.yaml", base_config(endpoints=[]))
        args = ["router", "--config", str(path), "--port", "0", "--workers", str(workers)]
        started = time.time()
        prefix = _proc_view("llmgw-router.service")
        with start_program(args, prefix=prefix, log_dir=tmp_path) as router:
            _check(_process_metrics(router.url), started)
