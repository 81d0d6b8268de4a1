"""Real programs configured only by LLMGW_* variables and the controller's config file."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from llmgw.testing import start_program


def _get(url: str, token: str | None = None) -> object:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return json.loads(r.read())


class TestSettingsFromEnvironment:
    """What a systemd EnvironmentFile= gives a program is what it runs with."""

    def test_sim_engine_from_variables(self, tmp_path: Path) -> None:
        """No flags at all: the model and the port come from LLMGW_SIM_ENGINE_*."""
        env = {"LLMGW_SIM_ENGINE_MODEL": "from-env", "LLMGW_SIM_ENGINE_PORT": "0"}
        with start_program(["sim-engine"], env=env, log_dir=tmp_path) as sim:
            models = _get(sim.url + "/v1/models")
        assert isinstance(models, dict)
        assert [m["id"] for m in models["data"]] == ["from-env"]

    def test_controller_from_file_and_variables(self, tmp_path: Path) -> None:
        """--config gives the settings, the admin token comes from a file a variable names."""
        (tmp_path / "token").write_text("file-token\n")
        conf = tmp_path / "controller.yaml"
        conf.write_text("database: 'memory://'\nport: 0\nheartbeat_timeout_s: 17\n")
        env = {
            "LLMGW_CONTROLLER_CONFIG": str(conf),
            "LLMGW_CONTROLLER_TOKEN_FILE": str(tmp_path / "token"),
        }
        with start_program(["controller"], env=env, log_dir=tmp_path) as ctl:
            nodes = _get(ctl.url + "/admin/nodes", token="file-token")
            log = ctl.log_text()
        assert isinstance(nodes, list | dict)
        assert "visible to every local user" not in log
