"""The router following a real controller: endpoint long-poll, usage reports, scale from zero."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing import start_program

from .controller_harness import Db, FakeAgents, controller, spec, wait_for
from .router_fixtures import base_config, chat_body, get_json, post, router, sim_args

pytestmark = pytest.mark.slow

# FakeAgents hands out engine ports from 30001 upwards; a real sim-engine listens on
# the first one, so the replica the controller places there really answers.
FIRST_FAKE_PORT = 30001


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class TestScaleFromZero:
    """A held request is served once the controller places a replica."""

    # Two workers: the supervisor's one long-poll reaches both, and the demand of the
    # worker holding the request reaches the controller in the merged report.
    @pytest.mark.parametrize("workers", [1, 2])
    async def test_held_request_is_served_once_controller_places_a_replica(
        self, tmp_path: Path, workers: int
    ) -> None:
        """A request for a min-0 model is held, reported as demand, the controller places a
        replica, the new endpoint list reaches the router, and the request succeeds."""
        if not port_free(FIRST_FAKE_PORT):
            pytest.skip(f"port {FIRST_FAKE_PORT} is busy")
        engine = start_program(
            sim_args(model="cm", speed=20.0, port=FIRST_FAKE_PORT), log_dir=tmp_path
        )
        try:
            with controller(Db(f"sqlite:///{tmp_path}/c.db"), log_dir=tmp_path) as c:
                c.post("/admin/models", spec("cm", min_replicas=0, max_replicas=1))
                cfg = base_config(
                    controller={"url": c.url, "poll_timeout_s": 5.0},
                    hold_timeout_s=30.0,
                    report_interval_s=0.2,
                )
                with router(tmp_path, cfg, workers=workers) as r, FakeAgents(c, {"n1": 8}):
                    await asyncio.to_thread(
                        wait_for,
                        lambda: "cm" in {m["id"] for m in get_json(r.url + "/v1/models")["data"]},
                        what="router learns the model from the controller",
                    )
                    async with aiohttp.ClientSession() as session:
                        reply = await asyncio.wait_for(
                            post(session, r.url, chat_body("wake up", model="cm")), timeout=40
                        )
                    replicas = c.replicas("cm")
        finally:
            engine.stop(grace_s=3)
        assert reply.status == 200, reply.body
        assert reply.endpoint == replicas[0]["id"]
