"""Engines answer the router only: a fresh key per replica, from the agent to the router.

A real controller, agent (sim-engine children) and router: the model is served through
the router, the engine itself answers 401 without its key, listens on the agent's
advertised address only, and the key shows nowhere but where it must be (the agent's
0600 state file, the engine's environment, the controller's database).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing.wait import until
from tests.integration.router_fixtures import base_config, chat_body, post, router
from tests.integration.test_agent_controller import (
    AUTH,
    TOKEN,
    ControllerRig,
    agent_rig,
    ctrl,
    sim_model,
    wait_replicas,
)
from tests.integration.test_agent_supervision import AgentRig

pytestmark = pytest.mark.timeout(120)

# The fixtures, used by name below.
__all__ = ["agent_rig", "ctrl"]


def _status(url: str, headers: dict[str, str] | None = None, body: bytes | None = None) -> int:
    req = urllib.request.Request(url, data=body, headers=headers or {})
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _get(url: str, headers: dict[str, str] | None = None) -> str:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return str(r.read().decode())


class TestEngineLockdown:
    """The engine key flows from the agent to the router and nowhere else."""

    async def test_engine_key_flows_to_the_router_and_nowhere_else(
        self, tmp_path: Path, ctrl: ControllerRig, agent_rig: AgentRig
    ) -> None:
        """The engine key flows to the router and nowhere else."""
        agent = agent_rig.start()
        async with (
            aiohttp.ClientSession(headers=AUTH) as s,
            s.post(f"{ctrl.url}/admin/models", json=sim_model("locked")) as r,
        ):
            assert r.status == 200, await r.text()
        ready = await wait_replicas(ctrl, "locked", ready=1)
        endpoint = ready[0]["endpoint_url"]
        port = int(endpoint.rsplit(":", 1)[1])

        # The key: the agent's state file holds it (mode 0600), nothing else shows it.
        state_file = agent_rig.tmp / "state" / "agent-state.json"
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        doc = json.loads(state_file.read_text())
        key = doc["shards"][0]["api_key"]
        assert len(key) >= 32

        body = json.dumps(chat_body("hi", model="locked")).encode()
        # The engine refuses anyone without its key, as vLLM does; /health stays open.
        assert _status(endpoint + "/v1/chat/completions", body=body) == 401
        assert _status(endpoint + "/v1/models") == 401
        assert _status(endpoint + "/v1/models", {"Authorization": f"Bearer {TOKEN}"}) == 401
        assert _status(endpoint + "/health") == 200
        assert _status(endpoint + "/v1/models", {"Authorization": f"Bearer {key}"}) == 200
        # It listens on the advertised address (127.0.0.1), not every interface.
        with socket.socket() as sock:
            sock.settimeout(2)
            assert sock.connect_ex(("127.0.0.2", port)) != 0

        cfg = base_config(controller={"url": ctrl.url, "token": TOKEN, "poll_timeout_s": 5.0})
        with router(tmp_path, cfg) as rt:
            async with aiohttp.ClientSession() as session:
                # Until the router has the controller's list and the replica answers it.
                async def served() -> bool:
                    reply = await post(session, rt.url, chat_body("hello", model="locked"))
                    assert reply.status == 200, reply.body  # shown if it never holds
                    return True

                await until(
                    served, timeout_s=20, every_s=0.2, ignore=(AssertionError,), what="a 200"
                )
                stream = await post(session, rt.url, chat_body("more", model="locked", stream=True))
                assert stream.status == 200
            router_metrics = _get(rt.url + "/metrics")
            router_admin = _get(rt.url + "/admin/endpoints")
            router_log = rt.log_text()

        shown: dict[str, str] = {
            "router /metrics": router_metrics,
            "router /admin/endpoints": router_admin,
            "router log": router_log,
            "engine /metrics": _get(endpoint + "/metrics"),
            "agent /status": _get(agent.url + "/status"),
            "agent log": agent.log_text(),
            "controller log": ctrl.proc.log_text() if ctrl.proc else "",
            "events": _get(f"{ctrl.url}/admin/events", AUTH),
            "replicas": _get(f"{ctrl.url}/admin/replicas", AUTH),
        }
        for path in (agent_rig.tmp / "state" / "logs").glob("*.log*"):
            shown[f"engine log {path.name}"] = path.read_text(errors="replace")
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
        env = {**os.environ, "LLMGW_CONTROLLER": ctrl.url, "LLMGW_TOKEN": TOKEN}
        for cmd in (["status"], ["replicas"], ["events"], ["models"], ["nodes"]):
            out = subprocess.run(
                [sys.executable, "-m", "llmgw", "ctl", "--controller", ctrl.url, *cmd],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            shown[f"ctl {' '.join(cmd)}"] = out.stdout + out.stderr
        for where, text in shown.items():
            assert key not in text, f"the engine key shows in {where}"
