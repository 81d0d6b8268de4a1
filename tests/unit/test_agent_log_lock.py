"""One agent per log dir: the lock that keeps a second agent's start sweep off the first's logs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw.agent import logfiles
from llmgw.agent.logfiles import LOCK_FILE, LogDirBusy, lock_log_dir
from llmgw.agent.statefile import lock_state_dir


class TestLogDirLock:
    """The log-dir lock admits one agent, names the folder and holder to the next, and is
    never taken for an engine log."""

    def test_second_holder_is_refused_naming_the_folder_and_pid(self, tmp_path: Path) -> None:
        """While one agent holds the log dir, another is refused in one line naming both."""
        held = lock_log_dir(tmp_path)
        try:
            with pytest.raises(LogDirBusy) as refused:
                lock_log_dir(tmp_path)
        finally:
            held.close()
        msg = str(refused.value)
        assert f"another agent (pid {os.getpid()}) is running with --log-dir {tmp_path};" in msg
        assert "\n" not in msg

    def test_released_lock_can_be_taken_again(self, tmp_path: Path) -> None:
        """Once the holder is gone (its file closed, as at exit), the next agent gets the dir."""
        lock_log_dir(tmp_path).close()
        lock_log_dir(tmp_path).close()

    def test_a_missing_log_dir_is_created(self, tmp_path: Path) -> None:
        """The default `<state-dir>/logs` need not exist yet: taking the lock creates it."""
        with lock_log_dir(tmp_path / "state" / "logs"):
            assert (tmp_path / "state" / "logs" / LOCK_FILE).is_file()

    def test_one_folder_as_state_and_log_dir_does_not_lock_itself_out(self, tmp_path: Path) -> None:
        """An agent given one folder for --state-dir and --log-dir holds both locks."""
        with lock_state_dir(tmp_path), lock_log_dir(tmp_path):
            pass

    def test_a_symlinked_log_dir_is_refused_by_name(self, tmp_path: Path) -> None:
        """A symlinked log dir is refused as the log folder, and nothing is written where it
        points."""
        real = tmp_path / "real"
        real.mkdir()
        (tmp_path / "link").symlink_to(real)
        with pytest.raises(LogDirBusy, match=r"^--log-dir: the log folder .* is a symbolic link"):
            lock_log_dir(tmp_path / "link")
        assert list(real.iterdir()) == []

    def test_a_symlinked_lock_is_not_followed(self, tmp_path: Path) -> None:
        """A lock file planted as a symlink is refused, its target left as it was."""
        victim = tmp_path / "victim.txt"
        victim.write_text("precious\n")
        logs = tmp_path / "logs"
        logs.mkdir()
        (logs / LOCK_FILE).symlink_to(victim)
        with pytest.raises(LogDirBusy, match="symbolic link"):
            lock_log_dir(logs)
        assert victim.read_text() == "precious\n"

    def test_the_lock_is_neither_counted_nor_removed_as_a_left_over_log(
        self, tmp_path: Path
    ) -> None:
        """The start sweep with nothing to keep removes the engine logs, never the lock."""
        (tmp_path / "r-1-rank0.log").write_text("old\n")
        with lock_log_dir(tmp_path):
            assert logfiles.leftovers(tmp_path, ()) == [tmp_path / "r-1-rank0.log"]
            ended = logfiles.EndedLogs(keep=0)
            for path in logfiles.leftovers(tmp_path, ()):
                ended.add(path)
            logfiles.tidy((), ended.take_expired(), max_bytes=1024, keep=3)
            assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE]
