"""No request waits for capacity that will not come: the controller's outlook in the
endpoint list makes the router refuse a model that cannot be placed at once."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from llmgw.router.request.holding import unplaceable_retry_after_s
from llmgw.testing import start_program
from llmgw.wire.endpoints import ModelOutlook

from .controller_harness import Db, FakeAgents, controller, spec, wait_for
from .router_fixtures import base_config, chat_body, get_json, post, router, sim_args

pytestmark = pytest.mark.slow

# FakeAgents hands out engine ports from 30001 upwards: the first replica placed
# (the only placeable model here) gets it, and a real sim-engine answers there.
FIRST_FAKE_PORT = 30001


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def ask(url: str, model: str) -> tuple[int, dict[str, str], dict[str, object], float]:
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as session:
        reply = await post(session, url, chat_body("hi", model=model))
    body = json.loads(reply.body)
    return reply.status, reply.headers, body, time.monotonic() - t0


class TestUnplaceable:
    """Unplaceable models are refused at once, placeable ones held and served."""

    async def test_unplaceable_model_is_refused_at_once_with_the_reason(
        self, tmp_path: Path
    ) -> None:
        """An unplaceable model is refused at once with the reason."""
        with controller(Db(f"sqlite:///{tmp_path}/c.db"), log_dir=tmp_path) as c:
            # 16 GPUs on one node; the only node has 8: no placement, nothing to evict.
            c.post("/admin/models", spec("huge", gpus_per_node=16, min_replicas=1, max_replicas=1))
            # Asked for only on demand (min 0), and just as impossible.
            c.post("/admin/models", spec("lazy", gpus_per_node=16, min_replicas=0, max_replicas=1))
            cfg = base_config(
                controller={"url": c.url, "poll_timeout_s": 5.0},
                hold_timeout_s=30.0,
                report_interval_s=0.2,
            )
            with router(tmp_path, cfg) as r, FakeAgents(c, {"n1": 8}):
                wait_for(
                    lambda: any(
                        o["state"] == "cannot_place"
                        and "huge" in o["models"]
                        and "16" in o["reason"]
                        for o in get_json(c.url + "/v1/endpoints")["outlook"]
                    ),
                    what="the controller says huge cannot be placed",
                )
                wait_for(
                    lambda: "huge" in {m["id"] for m in get_json(r.url + "/v1/models")["data"]},
                    what="the router knows huge",
                )
                await asyncio.sleep(0.5)  # the router's long-poll brings the same list
                status, headers, body, took = await ask(r.url, "huge")
                assert status == 503, body
                err = body["error"]
                assert isinstance(err, dict)
                assert err["code"] == "model_unplaceable"
                assert "cannot be placed" in str(err["message"])
                assert "16" in str(err["message"])  # the placement's own reason, with its counts
                assert int(headers["retry-after"]) >= 1
                assert took < 1.0, took

                # The demand-driven one: the first request waits only until the controller
                # has tried (a report and a tick), not the 30 s hold; later ones at once.
                status, _, body, took = await ask(r.url, "lazy")
                assert status == 503, body
                assert took < 15.0
                status, _, body, took = await asyncio.wait_for(ask(r.url, "lazy"), timeout=5)
                assert status == 503
                assert body["error"]["code"] == "model_unplaceable"  # type: ignore[index]
                assert took < 1.0, took

                # ctl status's data: asked for, cannot place, with the reason.
                def waiting() -> list[str]:
                    s = c.get("/admin/summary")
                    return [w["model"] for w in s["waiting_unplaceable"]]

                assert "lazy" in wait_for(waiting, what="lazy listed as waiting")

    async def test_a_placeable_model_is_held_and_served_while_another_is_refused(
        self,
        tmp_path: Path,
    ) -> None:
        """Scale from zero: a request for a placeable min-0 model is held until its replica is
        ready and then served; meanwhile one for a model that cannot be placed is refused in
        under a second, with the reason and the Retry-After the outlook's rule gives."""
        if not port_free(FIRST_FAKE_PORT):
            pytest.skip(f"port {FIRST_FAKE_PORT} is busy")
        engine = start_program(
            sim_args(model="cm", speed=20.0, port=FIRST_FAKE_PORT), log_dir=tmp_path
        )
        try:
            with controller(Db(f"sqlite:///{tmp_path}/c.db"), log_dir=tmp_path) as c:
                c.post("/admin/models", spec("cm", min_replicas=0, max_replicas=1))
                c.post("/admin/models", spec("huge", gpus_per_node=16, min_replicas=1))
                cfg = base_config(
                    controller={"url": c.url, "poll_timeout_s": 5.0},
                    hold_timeout_s=30.0,
                    report_interval_s=0.2,
                )
                with router(tmp_path, cfg) as r, FakeAgents(c, {"n1": 8}):

                    def huge_outlook() -> ModelOutlook | None:
                        for o in get_json(c.url + "/v1/endpoints")["outlook"]:
                            if "huge" in o["models"] and o["state"] == "cannot_place":
                                return ModelOutlook(**o)
                        return None

                    look = await asyncio.to_thread(
                        wait_for, huge_outlook, what="the controller says huge cannot be placed"
                    )
                    await asyncio.to_thread(
                        wait_for,
                        lambda: (
                            {"cm", "huge"}
                            <= {m["id"] for m in get_json(r.url + "/v1/models")["data"]}
                        ),
                        what="the router knows both models",
                    )
                    await asyncio.sleep(0.5)  # the router's long-poll brings the same outlook
                    assert c.replicas("cm") == []  # at zero: the request below is what wakes it
                    held = asyncio.create_task(ask(r.url, "cm"))
                    status, headers, body, took = await ask(r.url, "huge")
                    assert status == 503, body
                    err = body["error"]
                    assert isinstance(err, dict)
                    assert err["code"] == "model_unplaceable"
                    assert "needs 16" in str(err["message"])
                    assert int(headers["retry-after"]) == unplaceable_retry_after_s(look)
                    assert took < 1.0, took
                    assert not held.done()  # still held, not refused with the other

                    status, _, body, took = await asyncio.wait_for(held, timeout=40)
                    assert status == 200, body
                    (replica,) = c.replicas("cm")
                    assert replica["state"] == "ready"
                    placed = c.events(replica=replica["id"])
                    assert any(e.startswith("replica.placed") for e in placed)
        finally:
            engine.stop(grace_s=3)

    async def test_a_model_placeable_by_eviction_is_held_and_served(self, tmp_path: Path) -> None:
        """The README's eviction walkthrough in small: x is used once and left idle past its
        timeout; a request for big, which fits only in x's cards, is held (making room, never
        refused), x is evicted, big starts there, and the held request is served."""
        ports = (FIRST_FAKE_PORT, FIRST_FAKE_PORT + 1)  # x is placed first, big second
        if not all(port_free(p) for p in ports):
            pytest.skip(f"ports {ports} are busy")
        engines = [
            start_program(sim_args(model=name, speed=20.0, port=port), log_dir=tmp_path)
            for name, port in zip(("x", "big"), ports, strict=True)
        ]
        try:
            with controller(Db(f"sqlite:///{tmp_path}/c.db"), log_dir=tmp_path) as c:
                c.post(
                    "/admin/models",
                    [
                        spec("x", gpus_per_node=8, min_replicas=0, idle_timeout_s=1),
                        spec("big", gpus_per_node=8, min_replicas=0),
                    ],
                )
                cfg = base_config(
                    controller={"url": c.url, "poll_timeout_s": 5.0},
                    hold_timeout_s=60.0,
                    report_interval_s=0.2,
                )
                with router(tmp_path, cfg) as r, FakeAgents(c, {"n1": 8}):
                    await asyncio.to_thread(
                        wait_for,
                        lambda: (
                            {"x", "big"}
                            <= {m["id"] for m in get_json(r.url + "/v1/models")["data"]}
                        ),
                        what="the router knows both models",
                    )
                    status, _, body, _ = await asyncio.wait_for(ask(r.url, "x"), timeout=40)
                    assert status == 200, body
                    (victim,) = c.replicas("x")

                    # Known idle past its 1 s timeout (the router reports when it last used it).
                    await asyncio.to_thread(
                        wait_for,
                        lambda: c.get(f"/admin/replicas/{victim['id']}")["idle_seconds"] >= 2,
                        what="x known idle",
                    )
                    status, _, body, _ = await asyncio.wait_for(ask(r.url, "big"), timeout=50)
                    assert status == 200, body
                    (placed,) = c.replicas("big", "ready")
                    assert placed["shards"][0]["node"] == "n1"
                events = c.events(replica=victim["id"])
            evicted = [e for e in events if e.startswith("replica.evicted")]
            assert evicted, events
            assert "evicted for big" in evicted[0]
        finally:
            for e in engines:
                e.stop(grace_s=3)
