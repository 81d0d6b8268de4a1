"""The real spawner's refusals: every way an engine cannot start is a SpawnError."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.engineprocs import PopenSpawner, SpawnError


class TestSpawnFailures:
    """Ways an engine cannot start become a SpawnError."""

    def test_unwritable_log_path_is_a_spawn_error(self, tmp_path: Path) -> None:
        """A log file that cannot be opened fails the shard; it must not kill the heartbeat loop."""
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("")
        with pytest.raises(SpawnError, match="log"):
            PopenSpawner().spawn(["true"], {}, blocker / "engine.log")
