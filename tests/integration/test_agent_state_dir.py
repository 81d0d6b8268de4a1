"""One agent per state dir and per log dir, and `agent stop-engines`, with real processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmgw.agent.engineprocs import read_stat
from llmgw.agent.statefile import ShardRecord, StateStore, lock_state_dir
from llmgw.testing.procs import llmgw_argv, start_program
from llmgw.wire.agent import ShardSpec

pytestmark = pytest.mark.timeout(60)


class TestOneAgentPerStateDir:
    """A second agent on a state dir is refused."""

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


def _agent_args(state_dir: Path, *extra: str) -> list[str]:
    args = ["agent", "--controller", "http://127.0.0.1:9", "--node", "n", "--port", "0"]
    return [*args, "--gpus", "1xH100-80G", "--state-dir", str(state_dir), *extra]


class TestOneAgentPerLogDir:
    """A second agent on a log dir another agent holds is refused, and touches nothing there."""

    def test_second_agent_on_a_log_dir_is_refused_until_the_first_dies(
        self, tmp_path: Path
    ) -> None:
        """A second agent with its own state dir but the first's --log-dir exits 2 in one
        line naming the folder and the first's pid, leaving the first's engine logs; once
        the first is SIGKILLed, a new agent starts on that log dir."""
        logs = tmp_path / "logs"
        first = start_program(_agent_args(tmp_path / "a", "--log-dir", str(logs)), log_dir=tmp_path)
        with first:
            # As the first agent's running engines would write them, after its start sweep.
            logs.mkdir(exist_ok=True)
            live = {logs / f"r-{i}-rank0.log": f"engine {i}\n" for i in range(3)}
            for path, text in live.items():
                path.write_text(text)
            before = {p.name: p.read_bytes() for p in logs.iterdir()}
            out = subprocess.run(
                llmgw_argv(
                    *_agent_args(tmp_path / "b", "--log-dir", str(logs), "--ended-logs-keep", "0")
                ),
                capture_output=True,
                text=True,
                timeout=20,
                stdin=subprocess.DEVNULL,
                check=False,
            )
            assert first.alive()
            assert before == {p.name: p.read_bytes() for p in logs.iterdir()}
            assert out.returncode == 2
            assert out.stderr.count("\n") == 1, out.stderr
            assert f"another agent (pid {first.pid})" in out.stderr
            assert f"--log-dir {logs}" in out.stderr
            first.kill()
        with start_program(
            _agent_args(tmp_path / "b", "--log-dir", str(logs)), log_dir=tmp_path
        ) as second:
            assert second.alive()


def _record_sleeper(state_dir: Path, node: str) -> subprocess.Popen[bytes]:
    """A long-lived process in its own session, recorded in the state file like an engine."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    stat = read_stat(proc.pid)
    assert stat is not None
    spec = ShardSpec(
        replica_id="r-1", rank=0, model="m", served_names=("m",), engine="sim", gpu_indices=(0,)
    )
    record = ShardRecord(
        replica_id="r-1",
        rank=0,
        pid=proc.pid,
        start_ticks=stat[1],
        port=21000,
        spec=spec,
        log_path=str(state_dir / "r-1.log"),
        started_at=time.time(),
    )
    StateStore(state_dir, node=node).save((record,))
    return proc


def _stop_engines(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw_argv("agent", "stop-engines", *args),
        capture_output=True,
        text=True,
        timeout=45,
        stdin=subprocess.DEVNULL,
        check=False,
    )


class TestStopEngines:
    """agent stop-engines stops a dead agent's engines and leaves a live agent's alone."""

    def test_stops_what_a_dead_agent_left_running(self, tmp_path: Path) -> None:
        """`agent stop-engines` stops a recorded engine of a folder no agent holds."""
        state = tmp_path / "state"
        with _record_sleeper(state, "n") as engine:
            out = _stop_engines("--grace-s", "5", f"n={state}", f"gone={tmp_path / 'never'}")
            assert out.returncode == 0, out.stderr
            assert out.stdout.strip() == "stopped 1 engine(s)"
            assert engine.wait(timeout=10) == -signal.SIGTERM

    def test_leaves_a_live_agents_folder_alone(self, tmp_path: Path) -> None:
        """A folder whose agent still holds its lock is skipped, with a line naming it."""
        state = tmp_path / "state"
        with _record_sleeper(state, "n") as engine:
            try:
                with lock_state_dir(state):
                    out = _stop_engines(f"n={state}")
                assert out.returncode == 0, out.stderr
                assert out.stdout.strip() == "stopped 0 engine(s)"
                assert "skipped n: another agent" in out.stderr
                assert engine.poll() is None
            finally:
                engine.kill()
                engine.wait(timeout=10)

    def test_bad_argument_exits_2(self, tmp_path: Path) -> None:
        """A pair without '=' is a usage error."""
        out = _stop_engines(str(tmp_path))
        assert out.returncode == 2
        assert "expected NODE=STATE_DIR" in out.stderr
