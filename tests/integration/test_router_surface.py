"""The router command line and its admin protection."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from llmgw.testing import free_port

from .router_fixtures import base_config, get_json, router


class TestCommandLine:
    """The router's command line: bad configs and SIGTERM."""

    def test_bad_config_exits_2_with_one_line(self, tmp_path: Path) -> None:
        """An invalid file stops the router at start with exit 2 and one line naming the field."""
        bad = tmp_path / "bad.yaml"
        bad.write_text("endpoints: [{id: a, url: 'http://x', models: [m], weight: heavy}]\n")
        proc = subprocess.run(
            [sys.executable, "-m", "llmgw", "router", "--config", str(bad), "--port", "0"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1
        assert "weight" in lines[0]

    def test_missing_config_exits_2(self, tmp_path: Path) -> None:
        """A file that does not exist is a clear error, not a traceback."""
        proc = subprocess.run(
            [sys.executable, "-m", "llmgw", "router", "--config", str(tmp_path / "none.yaml")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 2
        assert "cannot read" in proc.stderr

    def test_sigterm_exits_0(self, tmp_path: Path) -> None:
        """A router with nothing to do stops cleanly on SIGTERM."""
        with router(tmp_path, base_config()) as r:
            assert get_json(r.url + "/readyz")["ready"] is True
        assert r.proc.returncode == 0


class TestAdminToken:
    """Admin routes need the token."""

    def test_token_required(self, tmp_path: Path) -> None:
        """With an admin token, admin views need it; a client key is not enough."""
        with router(tmp_path, base_config(admin_token="adm-1")) as r:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                with pytest.raises(urllib.error.HTTPError) as info:
                    get_json(r.url + "/admin/endpoints", headers=headers)
                info.value.close()
                assert info.value.code == 401
            doc = get_json(r.url + "/admin/usage", headers={"Authorization": "Bearer adm-1"})
        assert doc["router_id"]


class TestControllerNotYetHeard:
    """Requests get 503 before the controller's first list."""

    def test_requests_get_503_not_404_before_the_first_list(self, tmp_path: Path) -> None:
        """With the controller unreachable since start, no model is known yet: a request is
        answered 503 with Retry-After (retry later), not 404 (no such model), and the
        router is not ready."""
        cfg = base_config(controller={"url": f"http://127.0.0.1:{free_port()}"})
        with router(tmp_path, cfg) as r:
            req = urllib.request.Request(
                r.url + "/v1/chat/completions",
                data=json.dumps({"model": "m", "messages": []}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(req, timeout=10)
            err = info.value
            body = json.loads(err.read())
            err.close()
            with pytest.raises(urllib.error.HTTPError) as ready:
                get_json(r.url + "/readyz")
            ready.value.close()
        assert err.code == 503, body
        assert int(err.headers["Retry-After"]) >= 1
        assert body["error"]["code"] == "no_replica"
        assert ready.value.code == 503
