"""Every llmgw server takes the open files its hard limit allows, as the router does:
under systemd's default soft limit (1,024) a controller capped its client connections at
448, fewer than a fleet of a few hundred agents and routers keeps open."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmgw.testing import start_program

SOFT, HARD = 256, 4096

CONTROLLER = ["controller", "--port", "0", "--database", "memory://"]
AGENT = [
    "agent",
    "--controller",
    "http://127.0.0.1:9",
    "--node",
    "n",
    "--port",
    "0",
    "--gpus",
    "1xH100-80G",
]


def open_files_limit(pid: int) -> tuple[int, int]:
    """The (soft, hard) open-file limit of process `pid`, from /proc."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-file limit for {pid}")


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed")
class TestOpenFiles:
    """The controller and the agent raise their soft open-file limit to the hard one."""

    @pytest.mark.parametrize("args", [CONTROLLER, AGENT], ids=["controller", "agent"])
    def test_the_soft_limit_is_raised_to_the_hard_one(
        self, args: list[str], tmp_path: Path
    ) -> None:
        """Started with a soft limit of 256 under a hard one of 4,096, it runs with 4,096."""
        argv = [*args, "--state-dir", str(tmp_path / "state")] if args is AGENT else args
        prefix = ["prlimit", f"--nofile={SOFT}:{HARD}", "--"]
        with start_program(argv, log_dir=tmp_path, prefix=prefix) as p:
            assert open_files_limit(p.pid) == (HARD, HARD)
