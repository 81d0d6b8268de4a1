"""promtool (Debian's `prometheus` package; scripts/test installs it) from tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROMTOOL = shutil.which("promtool")


def promtool(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> str:
    """Run promtool; skip when it is not installed, fail with its output when it objects."""
    if PROMTOOL is None:
        pytest.skip("promtool is not installed (scripts/test installs Debian's prometheus)")
    out = subprocess.run(
        [PROMTOOL, *args], input=stdin, capture_output=True, timeout=60, check=False, cwd=cwd
    )
    text = (out.stdout + out.stderr).decode(errors="replace")
    assert out.returncode == 0, f"promtool {' '.join(args)} failed:\n{text}"
    return text


def check_metrics(body: bytes) -> None:
    """`promtool check metrics`: exposition format and naming conventions (lint)."""
    promtool("check", "metrics", stdin=body)


def samples(body: bytes) -> dict[str, float]:
    """`name{labels}` → value for every sample line (labels as exposed, sorted)."""
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out


def names(body: bytes) -> set[str]:
    """Every metric name with at least one sample."""
    return {k.split("{", 1)[0] for k in samples(body)}
