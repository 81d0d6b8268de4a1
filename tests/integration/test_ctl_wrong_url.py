"""`ctl --controller <the router's URL>`: one line that says where the controller is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .controller_harness import Db, controller
from .router_fixtures import base_config, router


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", *args],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


class TestWrongUrl:
    """ctl pointed at the router says where the controller is."""

    def test_router_url_is_answered_with_the_controllers(self, tmp_path: Path) -> None:
        """A router URL is answered with where the controller is."""
        with (
            controller(Db(f"sqlite:///{tmp_path}/c.db"), log_dir=tmp_path) as c,
            router(tmp_path, base_config(controller={"url": c.url, "poll_timeout_s": 5.0})) as r,
        ):
            done = ctl("--controller", r.url, "status")
            assert done.returncode == 1
            assert done.stderr.count("\n") == 1, done.stderr
            assert "looks like the llmgw router, not the controller" in done.stderr
            assert f"its controller is at {c.url}" in done.stderr
            # And the real controller answers the same command.
            ok = ctl("--controller", c.url, "-o", "json", "status")
            assert ok.returncode == 0, ok.stderr
