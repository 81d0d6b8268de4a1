"""Precise mode for a controller-managed model, end to end: a real controller, a real
agent starting sim-engines with their KV-event publishers, and a real router that
follows them from the controller's endpoint list (docs/routing.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.router.routing.blockhash import request_block_hashes
from llmgw.router.routing.rendezvous import rendezvous_order
from tests.integration.router_fixtures import admin_endpoints, base_config, post, router
from tests.integration.test_agent_controller import (
    AUTH,
    TOKEN,
    ControllerRig,
    admin,
    wait_replicas,
)
from tests.integration.test_agent_supervision import AgentRig
from tests.integration.test_router_kv_events import CONNECTED, metric, post_engine, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MODEL = "pm"
N = 3


@pytest.fixture
def ctrl(tmp_path: Path) -> Iterator[ControllerRig]:
    c = ControllerRig(tmp_path)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def agent_rig(tmp_path: Path, ctrl: ControllerRig) -> Iterator[AgentRig]:
    r = AgentRig(tmp_path, ctrl.url, token=TOKEN, gpus=f"{N}xH100-80G")
    try:
        yield r
    finally:
        r.cleanup()


def precise_model(**routing: Any) -> dict[str, Any]:
    return {
        "name": MODEL,
        "engine": "sim",
        "gpu_classes": ["H100-80G"],
        "min_replicas": N,
        "max_replicas": N,
        "args": ["--speed", "20"],
        "routing": {"kv_events": True, **routing},
    }


def engine_keys(rig: AgentRig) -> dict[str, str]:
    """replica id → its engine's key, from the agent's state file (the test is its user)."""
    doc = json.loads((rig.tmp / "state" / "agent-state.json").read_text())
    return {s["replica_id"]: s["api_key"] for s in doc["shards"]}


def chat() -> dict[str, Any]:
    system = "You answer questions about the ACME corporation's products. " * 10
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "What does the anvil cost?"},
        ],
        "max_tokens": 4,
    }


class TestManagedPreciseMode:
    """Precise mode for a managed model, from spec to router."""

    async def test_spec_that_cannot_publish_is_refused(self, ctrl: ControllerRig) -> None:
        """llama.cpp publishes no KV events: 422 naming routing.kv_events, nothing applied."""
        body = {**precise_model(), "engine": "llamacpp", "source": "/m.gguf"}
        async with (
            aiohttp.ClientSession(headers=AUTH) as s,
            s.post(f"{ctrl.url}/admin/models", json=body) as resp,
        ):
            assert resp.status == 422
            text = await resp.text()
        assert "routing.kv_events" in text
        assert "llama-server publishes no KV-cache events" in text
        assert await admin("GET", f"{ctrl.url}/admin/models") == []

    async def test_router_follows_the_agent_s_publishers(
        self, tmp_path: Path, ctrl: ControllerRig, agent_rig: AgentRig
    ) -> None:
        """The agent starts each engine with a publisher on ports of its own, the controller
        names them in the endpoint list, and the router follows every replica precisely: a
        prompt sent straight to one engine draws the router's next such request there."""
        agent_rig.start()
        await admin("POST", f"{ctrl.url}/admin/models", precise_model())
        reps = await wait_replicas(ctrl, MODEL, ready=N, timeout_s=90)
        urls = {r["id"]: r["endpoint_url"] for r in reps}
        ids = sorted(urls)
        keys = engine_keys(agent_rig)
        cfg = base_config(controller={"url": ctrl.url, "token": TOKEN, "poll_timeout_s": 5.0})
        with router(tmp_path, cfg, workers=1) as r:

            def listed() -> bool:
                snaps = admin_endpoints(r.url)["endpoints"]
                return sorted(s["info"]["id"] for s in snaps) == ids

            await until(listed, timeout_s=30, what="the router has the controller's list")
            infos = {s["info"]["id"]: s["info"] for s in admin_endpoints(r.url)["endpoints"]}
            ports = set()
            for rid, info in infos.items():
                host_port = urls[rid].removeprefix("http://")
                http_port = int(host_port.rpartition(":")[2])
                pub, replay = info["kv_events"], info["kv_events_replay"]
                assert pub.startswith("tcp://127.0.0.1:"), info
                assert replay.startswith("tcp://127.0.0.1:"), info
                assert (info["kv_events_topic"], info["tokenizer"]) == (rid, "sim")
                ports |= {http_port, int(pub.rpartition(":")[2]), int(replay.rpartition(":")[2])}
            assert len(ports) == 3 * N, "every engine, publisher and replay port is its own"
            # The admin API shows them too (`ctl replicas --json`).
            for rep in reps:
                (sh,) = rep["shards"]
                assert infos[rep["id"]]["kv_events"].endswith(f":{sh['kv_events_port']}")
                assert infos[rep["id"]]["kv_events_replay"].endswith(
                    f":{sh['kv_events_replay_port']}"
                )

            for rid in ids:
                await until(
                    lambda rid=rid: metric(r.url, CONNECTED, endpoint=rid) == 1,
                    timeout_s=30,
                    what=f"{rid} subscribed",
                )

                # Known complete once the router has seen batch 0 or a reset; the reset
                # is repeated in case one went out before the subscription took.
                def synced(rid: str = rid) -> bool:
                    mode = {"endpoint": rid, "mode": "precise"}
                    if metric(r.url, "llmgw_router_prefix_mode", **mode) == 1:
                        return True
                    post_engine(urls[rid], "/reset_prefix_cache", key=keys[rid])
                    return False

                await until(synced, timeout_s=30, what=f"{rid} in precise mode")

            body = chat()
            # The replica the guessing mode would least pick for this prompt.
            target = rendezvous_order(request_block_hashes(body)[0], ids)[-1]
            async with aiohttp.ClientSession() as session:
                # Behind the router's back, with the engine's own key.
                async with session.post(
                    urls[target] + "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {keys[target]}"},
                ) as direct:
                    assert direct.status == 200, await direct.text()
                await until(
                    lambda: (
                        (metric(r.url, "llmgw_router_kv_events_blocks", endpoint=target) or 0) > 0
                    ),
                    what="the router applied the engine's BlockStored",
                )
                reply = await post(session, r.url, body, headers={"x-llmgw-debug": "1"})
            assert reply.status == 200, reply.body
            assert reply.endpoint == target, reply.headers.get("x-llmgw-scores")
            assert reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
