"""A symlink planted at the agent's state file's temp name, before start or while it runs:
refused, never followed, and the agent ends with one line and exit 2, never a traceback
(issue 34, item 9). A real controller and a real agent starting a real sim-engine."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest

from llmgw.testing import start_program
from llmgw.testing.procs import llmgw_argv
from tests.integration.controller_harness import Db, controller, spec, wait_for

pytestmark = pytest.mark.timeout(90)

TOKEN = "state-token"
TEMP = "agent-state.json.tmp"
# The token in the environment: on the command line the agent warns (a second line).
ENV = {"LLMGW_AGENT_TOKEN": TOKEN}


def agent_args(url: str, state: Path) -> list[str]:
    lo = random.randrange(30000, 60000, 50)
    return [
        "agent", "--controller", url, "--node", "n1",
        "--gpus", "1xH100-80G", "--address", "127.0.0.1", "--port-range", f"{lo}-{lo + 49}",
        "--state-dir", str(state), "--interval-s", "0.2", "--port", "0",
        # The engine it starts goes with it: nothing outlives the test.
        "--stop-engines-on-exit", "--stop-grace-s", "3",
    ]  # fmt: skip


class TestStateFileTempRefused:
    """A symlink at the state file's temp name stops the agent in one line."""

    def test_at_start_one_line_exit_2(self, tmp_path: Path) -> None:
        """A symlink at the temp name before start: exit 2, one line naming it, target kept."""
        state = tmp_path / "state"
        state.mkdir()
        victim = tmp_path / "victim.txt"
        victim.write_text("precious\n")
        (state / TEMP).symlink_to(victim)
        out = subprocess.run(
            llmgw_argv(*agent_args("http://127.0.0.1:9", state)),
            capture_output=True,
            text=True,
            timeout=45,
            stdin=subprocess.DEVNULL,
            check=False,
            env={**os.environ, **ENV},
        )
        assert out.returncode == 2
        assert out.stderr.count("\n") == 1, out.stderr
        assert f"{TEMP} is a symbolic link; refusing to follow it" in out.stderr
        assert victim.read_text() == "precious\n"

    def test_while_running_one_line_exit_2(self, tmp_path: Path) -> None:
        """Planted while the agent runs: its next state write (an engine it just started) is
        refused, and the agent stops with the same one line and exit 2."""
        state = tmp_path / "state"
        victim = tmp_path / "victim.txt"
        victim.write_text("precious\n")
        db = Db(f"sqlite:///{tmp_path}/c.db")
        with controller(db, token=TOKEN, log_dir=tmp_path) as c:
            agent = start_program(agent_args(c.url, state), env=ENV, log_dir=tmp_path / "agent")
            try:
                wait_for(lambda: c.get("/admin/nodes"), what="the agent's first heartbeat")
                assert (state / "agent-state.json").exists()
                (state / TEMP).symlink_to(victim)
                c.post("/admin/models", spec("m", min_replicas=1, max_replicas=1))
                wait_for(lambda: not agent.alive(), timeout_s=60, what="the agent to stop")
                code = agent.stop(grace_s=5)
            finally:
                agent.stop(grace_s=5)
            log = agent.log_text()
        assert code == 2, log[-2000:]
        assert f"llmgw agent: --state-dir: {state / TEMP} is a symbolic link" in log
        assert "Traceback" not in log, log[-3000:]
        assert victim.read_text() == "precious\n"
