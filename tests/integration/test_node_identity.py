"""A node is who heartbeats it, from where it says: real agents against a real controller.

- an agent whose --address is not one of its host's addresses exits 2 at start;
- a second agent claiming a live node's name from another address (127.0.0.2: all of
  127/8 is this host's loopback) is refused with 409 on every heartbeat, an event says
  so, and the first node's record, replica and engine are untouched;
- the agent reports its spec policy, and the controller refuses at apply time a spec
  that policy refuses, with the reason, applying nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing.procs import start_program
from llmgw.testing.wait import until
from tests.integration.hostile import no_traceback
from tests.integration.test_agent_controller import (
    AUTH,
    TOKEN,
    ControllerRig,
    admin,
    agent_rig,
    ctrl,
    sim_model,
    wait_replicas,
)
from tests.integration.test_agent_supervision import AgentRig, alive

pytestmark = pytest.mark.timeout(120)

# The fixtures, used by name below.
__all__ = ["agent_rig", "ctrl"]


async def _events(ctrl: ControllerRig, kind: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = await admin("GET", f"{ctrl.url}/admin/events?limit=500")
    return [e for e in events if e["kind"] == kind]


async def _agent_status(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/status") as resp:
        data: dict[str, Any] = await resp.json()
        return data


class TestNodeIdentity:
    """A node is who heartbeats it, from an address on its host."""

    def test_an_address_not_on_this_host_exits_2(self, tmp_path: Path) -> None:
        """192.0.2.1 (TEST-NET-1) is on no interface here: one line on stderr, exit 2."""
        args = ["agent", "--controller", "http://127.0.0.1:9", "--node", "n", "--port", "0"]
        args += ["--gpus", "1xH100-80G", "--state-dir", str(tmp_path / "state")]
        args += ["--address", "192.0.2.1"]
        prog = start_program(args, log_dir=tmp_path, wait=False)
        try:
            assert prog.proc.wait(timeout=60) == 2
        finally:
            prog.stop(grace_s=2)
        text = prog.log_text()
        assert (
            "llmgw agent: --address '192.0.2.1' (192.0.2.1) is not an address of this node" in text
        )
        no_traceback(text)
        # Refused before anything was set up.
        assert not (tmp_path / "state").exists()

    async def test_a_second_agent_claiming_a_live_node_name_is_refused(
        self, tmp_path: Path, ctrl: ControllerRig, agent_rig: AgentRig
    ) -> None:
        """A second agent claiming a live node name is refused."""
        agent_rig.start()
        await admin("POST", f"{ctrl.url}/admin/models", sim_model("m1"))
        # The ready one: a full run once listed another beside it (one that had failed
        # or was replaced first), which is not what this test is about.
        (before,) = [r for r in await wait_replicas(ctrl, "m1", ready=1) if r["state"] == "ready"]
        node_before = await admin("GET", f"{ctrl.url}/admin/nodes/n1")

        impostor = AgentRig(
            tmp_path, ctrl.url, token=TOKEN, node="n1", address="127.0.0.2", name="impostor"
        )
        try:
            prog = impostor.start()
            await until(
                lambda: "HTTP 409" in prog.log_text(), timeout_s=60, what="a refused heartbeat"
            )
            assert "claims node 'n1'" in prog.log_text()
            conflicts = await _events(ctrl, "node.name_conflict")
            assert len(conflicts) >= 1
            assert "127.0.0.2 claims node 'n1'" in conflicts[0]["message"]
            # Several refused heartbeats later: one event, not one per heartbeat.
            seen = prog.log_text().count("HTTP 409")
            await until(
                lambda: prog.log_text().count("HTTP 409") >= seen + 3,
                timeout_s=60,
                what="three more refused heartbeats",
            )
            assert len(await _events(ctrl, "node.name_conflict")) == 1
            # The first node is untouched: its address, GPUs, replica, engine and endpoint.
            node_now = await admin("GET", f"{ctrl.url}/admin/nodes/n1")
            assert node_now["address"] == "127.0.0.1"
            assert node_now["gpus"] == node_before["gpus"]
            (now,) = [r for r in await wait_replicas(ctrl, "m1", ready=1) if r["state"] == "ready"]
            assert now["id"] == before["id"]
            assert now["endpoint_url"] == before["endpoint_url"]
            assert now["shards"][0]["pid"] == before["shards"][0]["pid"]
            assert alive(before["shards"][0]["pid"])
            # The impostor started nothing.
            status = await _agent_status(prog.url)
            assert status["shards"] == []
            assert status["controller"]["consecutive_failures"] >= 1
        finally:
            impostor.cleanup()

    async def test_a_spec_no_agent_accepts_is_refused_at_apply(
        self, ctrl: ControllerRig, agent_rig: AgentRig
    ) -> None:
        """A spec no agent accepts is refused at apply."""
        agent_rig.start()
        async with aiohttp.ClientSession(headers=AUTH) as s:
            await ctrl.node_registered(s)
            bad = {**sim_model("remote"), "args": ["--speed", "10", "--trust_remote"]}
            async with s.post(f"{ctrl.url}/admin/models", json=bad) as resp:
                body = await resp.json()
                assert resp.status == 422, body
            err = body["error"]
            assert err["param"] == "[0].args[2]"
            assert "n1: args[2] --trust_remote (read as --trust-remote-code)" in err["message"]
            assert "nothing was applied" in err["message"]
            async with s.get(f"{ctrl.url}/admin/models") as resp:
                assert [m["name"] for m in await resp.json()] == []
            secret = {**sim_model("preload"), "env_from": {"LD_PRELOAD": {"env": "HOME"}}}
            async with s.post(f"{ctrl.url}/admin/models", json=secret) as resp:
                body = await resp.json()
                assert resp.status == 422, body
            assert body["error"]["param"] == "[0].env_from.LD_PRELOAD"
