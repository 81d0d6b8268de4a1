"""One agent per state dir, checked with real agent processes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llmgw.testing.procs import llmgw_argv, start_program

pytestmark = pytest.mark.timeout(60)


class TestOneAgentPerStateDir:
    def test_second_agent_on_a_state_dir_is_refused(self, tmp_path: Path) -> None:
        """A second agent on a live agent's state dir exits 2 naming the first one's pid."""
        args = ["agent", "--controller", "http://127.0.0.1:9", "--node", "n", "--port", "0"]
        args += ["--gpus", "1xH100-80G", "--state-dir", str(tmp_path / "state")]
        with start_program(args, log_dir=tmp_path) as first:
            out = subprocess.run(
                llmgw_argv(*args),
                capture_output=True,
                text=True,
                timeout=45,
                stdin=subprocess.DEVNULL,
                check=False,
            )
            assert first.alive()
        assert out.returncode == 2
        assert out.stderr.count("\n") == 1, out.stderr
        assert f"another agent (pid {first.pid})" in out.stderr
