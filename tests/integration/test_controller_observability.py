"""The controller's /metrics, read-only token, status data and decision log, on a real
controller process with heartbeating agents."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.controller_harness import (
    Db,
    FakeAgents,
    controller,
    spec,
    wait_for,
)
from tests.promtool import check_metrics, samples

pytestmark = pytest.mark.timeout(90)

ADMIN, READ = "admin-secret", "read-secret"


def get(url: str, token: str | None = None, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


class TestControllerObservability:
    """The controller's metrics, read-only token, status data and decision log."""

    def test_metrics_tokens_status_and_decisions(self, tmp_path: Path) -> None:
        """Metrics, read token, status data and decisions follow an engine failure and restart."""
        db = Db(f"sqlite:///{tmp_path / 'c.db'}")
        extra = ("--read-token", READ, "--log-format", "json")
        with controller(db, *extra, token=ADMIN, log_dir=tmp_path) as c:
            c.post("/admin/models", [spec("m", gpus_per_node=1), spec("huge", gpus_per_node=8)])
            with FakeAgents(c, {"a": 2, "b": 2}) as agents:
                rid = wait_for(lambda: c.replicas("m", "ready"), what="a ready replica")[0]["id"]
                # The engine dies: a failure, then a restart placement.
                agents.failing.add(rid)
                wait_for(lambda: any(r["restarts"] >= 1 for r in c.replicas("m")), what="a restart")
                agents.failing.discard(rid)
                wait_for(lambda: c.replicas("m", "ready"), what="the restarted replica ready")

                # Who may read what.
                assert get(c.url + "/metrics")[0] == 401
                assert get(c.url + "/metrics", "wrong")[0] == 401
                status, body = get(c.url + "/metrics", READ)
                assert status == 200
                assert get(c.url + "/admin/status", READ)[0] == 200
                assert get(c.url + "/admin/nodes", READ)[0] == 200
                code, denied = get(c.url + "/admin/nodes/a/cordon", READ, method="POST")
                assert code == 403
                assert json.loads(denied)["error"]["type"] == "permission_error"
                assert get(c.url + "/status")[0] == 200
                assert get(c.url + "/status/static/status.js")[0] == 200
                assert get(c.url + "/status/static/../config.py")[0] == 404

                check_metrics(body)
                got = samples(body)
                assert got["llmgw_controller_leader"] == 1.0
                assert got['llmgw_controller_gpus{fabric="ib0",gpu_class="H100-80G"}'] == 4.0
                assert got['llmgw_controller_gpus_used{fabric="ib0",gpu_class="H100-80G"}'] == 1.0
                assert got['llmgw_controller_gpus_free{fabric="ib0",gpu_class="H100-80G"}'] == 3.0
                assert got['llmgw_controller_nodes{state="ready"}'] == 2.0
                assert got['llmgw_controller_replicas{model="m",state="ready"}'] == 1.0
                assert got['llmgw_controller_model_unplaceable{model="huge"}'] == 1.0
                assert got['llmgw_controller_models{status="unplaceable"}'] == 1.0
                assert got['llmgw_controller_placements_total{reason="restart"}'] >= 1
                assert got['llmgw_controller_replica_failures_total{reason="engine_exited"}'] >= 1
                assert got["llmgw_controller_tick_duration_seconds_count"] > 0
                assert got["llmgw_controller_store_write_duration_seconds_count"] > 0
                assert 0 <= got['llmgw_controller_node_heartbeat_age_seconds{node="a"}'] < 5

                # The page's data and ctl's summary are one picture.
                doc = json.loads(get(c.url + "/admin/status", READ)[1])
                assert doc["summary"] == c.get("/admin/summary")
                assert [n[0] for n in doc["nodes"]] == ["a", "b"]
                assert {m[0]: m[6] is not None for m in doc["models"]} == {"huge": True, "m": False}
                # Deleting a model takes its series with it.
                c.call("DELETE", "/admin/models/huge")
                wait_for(
                    lambda: 'model="huge"' not in get(c.url + "/metrics", READ)[1].decode(),
                    what="huge's series gone",
                )
            log = c.program.log_text()
        decisions = [
            d
            for d in (json.loads(x) for x in log.splitlines() if x.startswith("{"))
            if d["logger"] == "llmgw.controller.decisions"
        ]
        events = [d for d in decisions if d["kind"] == "replica.failed"]
        assert len(events) == 1, events
        assert events[0]["reason_class"] == "engine_exited"
        assert events[0]["id"] == rid
        assert "exited with code 3" in events[0]["reason"]
        placed = [d for d in decisions if d["kind"] == "replica.placed"]
        assert [d["reason_class"] for d in placed] == ["new", "restart"]
