"""Fixtures the integration tests of several files share."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def up_folder(tmp_path: Path) -> Iterator[Path]:
    """A working folder for `llmgw up` with a fleet file; any process left mentioning it
    is killed after."""
    # Imported here: every other integration test would load up's helpers for nothing.
    from tests.integration.test_up_cli import FLEET, procs_of

    (tmp_path / "fleet.yaml").write_text(FLEET)
    try:
        yield tmp_path
    finally:
        for pid in procs_of(tmp_path):
            os.kill(pid, signal.SIGKILL)
