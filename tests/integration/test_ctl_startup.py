"""`llmgw ctl` starts fast: its entry point imports nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys

# Imported by some command, never by `llmgw ctl --help`.
HEAVY = ("aiohttp", "rich", "msgspec", "yaml", "sqlalchemy", "uvloop", "prometheus_client")


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

    def test_help_imports_nothing_heavy(self) -> None:
        """`llmgw ctl --help` loads none of them either (-X importtime lists every import):
        what it costs is in its imports, and a timed budget fails on a loaded machine."""
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "llmgw", "ctl", "--help"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        names = {
            line.rsplit("|", 1)[1].strip().split(".")[0]
            for line in proc.stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2
        }
        assert "llmgw" in names, proc.stderr[-500:]
        assert sorted(names & set(HEAVY)) == []

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
