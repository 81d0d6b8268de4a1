"""One agent per state dir: the lock that keeps a second agent off the first one's engines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw.agent.statefile import StateDirBusy, lock_state_dir


class TestStateDirLock:
    """The state-dir lock admits one agent and names the holder to the next."""

    def test_second_holder_is_refused_with_the_first_pid(self, tmp_path: Path) -> None:
        """While one agent holds the state dir, another is refused, told the holder's pid."""
        held = lock_state_dir(tmp_path)
        try:
            with pytest.raises(StateDirBusy, match=f"pid {os.getpid()}"):
                lock_state_dir(tmp_path)
        finally:
            held.close()

    def test_released_lock_can_be_taken_again(self, tmp_path: Path) -> None:
        """Once the holder is gone (its file closed, as at exit), the next agent gets the dir."""
        lock_state_dir(tmp_path).close()
        lock_state_dir(tmp_path).close()

    def test_refusal_leaves_the_holders_pid_in_place(self, tmp_path: Path) -> None:
        """A refused agent does not overwrite the holder's pid in the lock file."""
        held = lock_state_dir(tmp_path)
        try:
            with pytest.raises(StateDirBusy):
                lock_state_dir(tmp_path)
            with pytest.raises(StateDirBusy, match=f"pid {os.getpid()}"):
                lock_state_dir(tmp_path)
        finally:
            held.close()
