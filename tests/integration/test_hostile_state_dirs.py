"""State folders a hostile neighbour prepared: symlinks and files are refused, never followed.

Real `llmgw agent` and `llmgw up` processes; each is refused before it starts anything.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llmgw.testing.procs import free_port, llmgw_argv, up_engine_ports

pytestmark = pytest.mark.timeout(60)


def agent(state_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["agent", "--controller", "http://127.0.0.1:9", "--node", "n", "--port", "0"]
    args += ["--gpus", "1xH100-80G", "--state-dir", str(state_dir), *extra]
    return subprocess.run(
        llmgw_argv(*args),
        capture_output=True,
        text=True,
        timeout=45,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def up(state_dir: Path) -> subprocess.CompletedProcess[str]:
    args = ["up", "--state-dir", str(state_dir), "--port", str(free_port()), *up_engine_ports()]
    return subprocess.run(
        llmgw_argv(*args),
        capture_output=True,
        text=True,
        timeout=45,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.stderr.count("\n") == 1, out.stderr
    assert "Traceback" not in out.stderr
    return out.stderr


class TestAgentStateDir:
    """The agent refuses a state dir or lock it would have to follow."""

    def test_a_symlinked_state_dir_is_refused(self, tmp_path: Path) -> None:
        """A symlinked state dir is refused."""
        real = tmp_path / "real"
        real.mkdir()
        link = tmp_path / "link"
        link.symlink_to(real)
        out = agent(link)
        assert out.returncode == 2
        assert "is a symbolic link" in one_line(out)
        assert list(real.iterdir()) == []

    def test_a_file_as_state_dir_is_refused_by_name(self, tmp_path: Path) -> None:
        """A file as state dir is refused by name."""
        f = tmp_path / "state"
        f.write_text("not a folder\n")
        out = agent(f)
        assert out.returncode == 2
        msg = one_line(out)
        assert "exists but is not a folder" in msg
        assert "Errno" not in msg
        assert f.read_text() == "not a folder\n"

    def test_a_symlinked_lock_is_not_followed(self, tmp_path: Path) -> None:
        """A symlinked lock is not followed."""
        state = tmp_path / "state"
        state.mkdir()
        victim = tmp_path / "victim.txt"
        victim.write_text("precious\n")
        (state / "agent.lock").symlink_to(victim)
        out = agent(state)
        assert out.returncode == 2
        assert "refusing to follow it" in one_line(out)
        assert victim.read_text() == "precious\n"


class TestAgentLogDir:
    """The agent refuses a log dir it would have to follow, as it does a state dir."""

    def test_a_symlinked_log_dir_is_refused(self, tmp_path: Path) -> None:
        """A symlinked --log-dir is refused as the log folder, nothing written behind it."""
        real = tmp_path / "real"
        real.mkdir()
        link = tmp_path / "link"
        link.symlink_to(real)
        out = agent(tmp_path / "state", "--log-dir", str(link))
        assert out.returncode == 2
        assert f"--log-dir: the log folder {link} is a symbolic link" in one_line(out)
        assert list(real.iterdir()) == []


class TestUpStateFolder:
    """llmgw up refuses a symlinked or file state folder."""

    def test_a_symlinked_folder_and_a_file_are_refused(self, tmp_path: Path) -> None:
        """A symlinked folder and a file are refused."""
        real = tmp_path / "real"
        real.mkdir()
        link = tmp_path / "link"
        link.symlink_to(real)
        out = up(link)
        assert out.returncode == 1
        assert "is a symbolic link" in one_line(out)
        assert list(real.iterdir()) == []
        f = tmp_path / "file"
        f.write_text("x")
        out = up(f)
        assert out.returncode == 1
        assert "exists but is not a folder" in one_line(out)
