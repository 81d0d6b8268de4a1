"""What an operator sees of a reload that did not apply: /metrics and /admin/config, from
a real router (one process, and workers, whose supervisor watches the file)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from llmgw.testing.wait import until

from .router_fixtures import (
    base_config,
    config_path,
    endpoint_entries,
    get_json,
    router,
    sim_engines,
    write_config,
)

pytestmark = pytest.mark.slow


def gauge(url: str, name: str) -> float:
    """One unlabelled gauge's value from the router's /metrics."""
    with urllib.request.urlopen(url + "/metrics") as resp:
        text = resp.read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, f"{name}: {values}"
    return values[0]


class TestReloadStatusShown:
    """A refused reload is on /metrics and /admin/config, not only in the log."""

    @pytest.mark.parametrize("workers", [1, 2])
    async def test_a_refused_then_fixed_reload(self, tmp_path: Path, workers: int) -> None:
        """A file that does not validate turns the gauge to 0 and shows its error; the
        file fixed with a restart-only change turns it back to 1 and names the field."""
        successful = "llmgw_router_config_last_reload_successful"
        with sim_engines(tmp_path, [20.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg, workers=workers) as r:
                assert gauge(r.url, successful) == 1.0
                started_at = get_json(r.url + "/admin/config")["last_success_at"]
                config_path(tmp_path).write_text("endpoints: [{id: broken}]\n")
                await until(lambda: gauge(r.url, successful) == 0.0, blocking=True)
                shown = get_json(r.url + "/admin/config")
                assert "missing required field `url`" in shown["last_error"]
                assert shown["last_success_at"] == started_at
                cfg["max_body_bytes"] = 1000
                write_config(config_path(tmp_path), cfg)
                await until(lambda: gauge(r.url, successful) == 1.0, blocking=True)
                shown = get_json(r.url + "/admin/config")
                assert gauge(r.url, "llmgw_router_config_restart_pending") == 1.0
        assert (shown["last_error"], shown["restart_pending"]) == (None, ["max_body_bytes"])
        assert shown["last_success_at"] > started_at
