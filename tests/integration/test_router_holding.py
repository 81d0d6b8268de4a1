"""Holding requests for models with no replica, and reloading the config without a restart."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing.wait import until

from .router_fixtures import (
    base_config,
    chat_body,
    config_path,
    endpoint_entries,
    get_json,
    post,
    router,
    sim_engines,
    write_config,
)

pytestmark = pytest.mark.slow


def endpoint_ids(url: str) -> list[str]:
    return [s["info"]["id"] for s in get_json(url + "/admin/endpoints")["endpoints"]]


class TestHolding:
    """Held requests proceed when a replica appears, within the queue bound."""

    async def test_held_request_proceeds_when_endpoint_file_adds_one(self, tmp_path: Path) -> None:
        """A request for a configured model with no endpoint waits, is reported as demand,
        and succeeds once the file is edited to add an endpoint."""
        with sim_engines(tmp_path, [20.0], model="late") as engines:
            cfg = base_config(models=["late"], hold_timeout_s=30.0)
            with router(tmp_path, cfg) as r:
                async with aiohttp.ClientSession() as session:
                    held = asyncio.create_task(post(session, r.url, chat_body("hi", model="late")))
                    await until(
                        lambda: get_json(r.url + "/admin/usage")["demand"] == {"late": 1},
                        blocking=True,
                    )
                    assert not held.done()
                    cfg["endpoints"] = endpoint_entries(engines, model="late")
                    write_config(config_path(tmp_path), cfg)
                    reply = await asyncio.wait_for(held, timeout=15)
        assert reply.status == 200, reply.body
        assert reply.endpoint == "e0"

    async def test_hold_queue_bound(self, tmp_path: Path) -> None:
        """Beyond max_held, a request for a model with no replica is refused at once."""
        cfg = base_config(models=["late"], hold_timeout_s=30.0, max_held=1)
        with router(tmp_path, cfg) as r:
            async with aiohttp.ClientSession() as session:
                first = asyncio.create_task(post(session, r.url, chat_body("a", model="late")))
                await until(
                    lambda: get_json(r.url + "/admin/usage")["demand"] == {"late": 1}, blocking=True
                )
                second = await asyncio.wait_for(
                    post(session, r.url, chat_body("b", model="late")), timeout=5
                )
                first.cancel()
        assert second.status == 503
        assert second.headers["retry-after"]


class TestReload:
    """SIGHUP reloads the config and in-flight streams survive it."""

    async def test_sighup_reloads_and_bad_file_is_ignored(self, tmp_path: Path) -> None:
        """SIGHUP applies a new file; an invalid file is rejected and the old config kept."""
        with sim_engines(tmp_path, [20.0, 20.0]) as engines:
            entries = endpoint_entries(engines)
            # Polling effectively off: only SIGHUP reloads.
            cfg = base_config(endpoints=entries[:1], reload_poll_s=3600.0)
            with router(tmp_path, cfg) as r:
                cfg["endpoints"] = entries
                write_config(config_path(tmp_path), cfg)
                r.signal(signal.SIGHUP)
                await until(lambda: endpoint_ids(r.url) == ["e0", "e1"], blocking=True)
                config_path(tmp_path).write_text("endpoints: [{id: broken}]\n")
                r.signal(signal.SIGHUP)
                await until(lambda: "reload rejected" in r.log_text(), what="the reload rejected")
                assert r.alive()
                assert endpoint_ids(r.url) == ["e0", "e1"]

    async def test_inflight_stream_survives_reload_that_removes_its_endpoint(
        self, tmp_path: Path
    ) -> None:
        """A stream in progress finishes normally although a reload removed its endpoint."""
        with sim_engines(tmp_path, [4.0, 20.0]) as engines:
            entries = endpoint_entries(engines)
            cfg = base_config(endpoints=entries[:1])
            with router(tmp_path, cfg) as r:
                async with aiohttp.ClientSession() as session:
                    stream = asyncio.create_task(
                        post(session, r.url, chat_body("long one", max_tokens=200, stream=True))
                    )
                    await until(
                        lambda: get_json(r.url + "/admin/usage")["inflight"].get("e0") == 1,
                        blocking=True,
                    )
                    cfg["endpoints"] = entries[1:]
                    write_config(config_path(tmp_path), cfg)
                    await until(
                        lambda: (
                            [
                                s["info"]["id"]
                                for s in get_json(r.url + "/admin/endpoints")["endpoints"]
                            ]
                            == ["e1"]
                        ),
                        blocking=True,
                    )
                    reply = await asyncio.wait_for(stream, timeout=30)
                    after = await post(session, r.url, chat_body("next"))
        assert reply.status == 200
        events = reply.events()
        assert events[-1] == "[DONE]"
        assert not [e for e in events if e.startswith('{"error"')]
        assert after.endpoint == "e1"


class TestHeldBehindAnOpenBreaker:
    """Requests waiting for a half-open probe are not refused."""

    async def test_requests_waiting_for_a_half_open_probe_are_not_refused(
        self, tmp_path: Path
    ) -> None:
        """Requests held while a model's only replica has its breaker open all succeed once
        it recovers: those that lose the race for the half-open probe keep waiting instead
        of being answered 503."""
        with sim_engines(tmp_path, [2.0]) as engines:
            cfg = base_config(
                endpoints=endpoint_entries(engines),
                hold_timeout_s=20.0,
                breaker={"failure_threshold": 1, "cooldown_s": 1.0, "max_cooldown_s": 1.0},
            )
            with router(tmp_path, cfg) as r:
                faults = engines[0].url + "/sim/faults"
                async with aiohttp.ClientSession() as session:
                    async with session.post(faults, json={"fail_rate": 1.0}) as resp:
                        assert resp.status == 200
                    failed = await post(session, r.url, chat_body("fail"))
                    assert failed.status == 500
                    async with session.post(faults, json={"fail_rate": 0.0}) as resp:
                        assert resp.status == 200
                    # The breaker is open: these wait, then race for the one probe.
                    bodies = [chat_body(f"q{i}", max_tokens=24) for i in range(4)]
                    replies = await asyncio.wait_for(
                        asyncio.gather(*(post(session, r.url, b) for b in bodies)), timeout=30
                    )
        assert [x.status for x in replies] == [200] * 4, [x.body[:200] for x in replies]
