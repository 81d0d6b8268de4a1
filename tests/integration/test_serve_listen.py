"""Every program refuses a port it cannot listen on with one line, not a traceback."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing.procs import llmgw_argv

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port with a listener on 127.0.0.1 for the whole test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw_argv(*args),
        capture_output=True,
        text=True,
        timeout=45,
        stdin=subprocess.DEVNULL,
        check=False,
    )


class TestPortInUse:
    """A port that cannot be listened on is refused in one line."""

    def test_sim_engine_says_which_port_in_one_line(self, taken_port: int) -> None:
        """A sim-engine on a taken port exits 1 naming the address, without a traceback."""
        out = run("sim-engine", "--model", "m", "--port", str(taken_port))
        assert out.returncode == 1
        assert "Traceback" not in out.stderr
        assert f"llmgw sim-engine: cannot listen on 127.0.0.1:{taken_port}" in out.stderr
        assert "in use" in out.stderr

    def test_agent_says_which_port_in_one_line(self, taken_port: int, tmp_path: Path) -> None:
        """An agent whose own port is taken exits 1 with one line and never starts heartbeating."""
        out = run(
            "agent",
            "--controller",
            "http://127.0.0.1:9",
            "--node",
            "n",
            "--gpus",
            "1xH100-80G",
            "--state-dir",
            str(tmp_path),
            "--port",
            str(taken_port),
        )
        assert out.returncode == 1
        assert "Traceback" not in out.stderr
        assert "heartbeat failed" not in out.stderr
        assert f"llmgw agent: cannot listen on 127.0.0.1:{taken_port}" in out.stderr

    def test_port_out_of_range_is_one_line(self) -> None:
        """A port number above 65535 is refused with one line."""
        out = run("sim-engine", "--model", "m", "--port", "70000")
        assert out.returncode != 0
        assert "Traceback" not in out.stderr
        assert "70000" in out.stderr
