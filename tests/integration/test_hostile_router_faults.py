"""A bad day behind the router: an engine that refuses the router's key, an engine
SIGKILLed. Every client gets an answer in OpenAI's shape, at the pace the docs give.

Real processes on 127.0.0.1 only (sim-engines, a router), bounded in count and time.
"""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pytest

from tests.integration.hostile import no_traceback
from tests.integration.router_fixtures import (
    base_config,
    chat_body,
    endpoint_entries,
    post,
    router,
    sim_engines,
)

pytestmark = pytest.mark.timeout(90)

KEY = "sk-engine-right"


class TestAnEngineRefusingTheRoutersKey:
    """An engine refusing the router's key is routed around."""

    async def test_the_client_gets_a_502_in_openais_shape(self, tmp_path: Path) -> None:
        """The router holds a wrong key for the only engine: 502 `engine_refused_key`,
        OpenAI's error object, never the engine's own 401 body."""
        with sim_engines(tmp_path, [50.0], extra=["--api-key", KEY]) as engines:
            entries = [{**e, "api_key": "sk-wrong"} for e in endpoint_entries(engines)]
            with router(tmp_path, base_config(endpoints=entries)) as r:
                async with aiohttp.ClientSession() as session:
                    rep = await post(session, r.url, chat_body("hello"))
                assert rep.status == 502, rep.body
                assert rep.headers["content-type"].startswith("application/json")
                doc = rep.json()
                assert set(doc) == {"error"}
                assert doc["error"]["code"] == "engine_refused_key"
                assert doc["error"]["type"] == "upstream_error"
                assert "Unauthorized" not in rep.body.decode()
                no_traceback(r.log_text())

    async def test_another_replica_serves_the_request(self, tmp_path: Path) -> None:
        """One engine refuses the router's key, the other takes it: every request is
        served, the refusing one tried at most once per request and then left out."""
        with sim_engines(tmp_path, [50.0, 50.0], extra=["--api-key", KEY]) as engines:
            entries = endpoint_entries(engines)
            entries = [{**entries[0], "api_key": "sk-wrong"}, {**entries[1], "api_key": KEY}]
            conf = base_config(
                endpoints=entries,
                policy="round_robin",
                breaker={"failure_threshold": 1, "cooldown_s": 30.0, "max_cooldown_s": 60.0},
            )
            with router(tmp_path, conf) as r:
                async with aiohttp.ClientSession() as session:
                    reps = [await post(session, r.url, chat_body(f"q{i}")) for i in range(6)]
                assert [x.status for x in reps] == [200] * 6
                assert {x.endpoint for x in reps} == {"e1"}
                no_traceback(r.log_text())


class TestADeadEngine:
    """Requests to a dead engine are answered within one cooldown."""

    async def test_requests_are_answered_within_one_cooldown_plus_the_probe(
        self, tmp_path: Path
    ) -> None:
        """The model's only engine is SIGKILLed: while failed probes double the breaker's
        cooldown (1, 2, 4, 8 s), each request is answered 503 with the reason within
        about the first cooldown (1 s) plus the probe, as docs/router.md says."""
        cooldown_s = 1.0
        with sim_engines(tmp_path, [50.0]) as engines:
            conf = base_config(
                endpoints=endpoint_entries(engines),
                hold_timeout_s=60.0,
                request_timeout_s=60.0,
                breaker={"failure_threshold": 1, "cooldown_s": cooldown_s, "max_cooldown_s": 60.0},
            )
            with router(tmp_path, conf) as r:
                async with aiohttp.ClientSession() as session:
                    assert (await post(session, r.url, chat_body("alive"))).status == 200
                    engines[0].kill()
                    waits: list[float] = []
                    whys: list[str] = []
                    # Past three doubled cooldowns (1 + 2 + 4 s) and into the fourth.
                    end = time.monotonic() + 9.0
                    while time.monotonic() < end:
                        t = time.monotonic()
                        rep = await post(session, r.url, chat_body("anyone?"))
                        waits.append(time.monotonic() - t)
                        assert rep.status == 503, rep.body
                        assert int(rep.headers["retry-after"]) >= 1
                        whys.append(rep.json()["error"]["message"])
                assert max(waits) < cooldown_s + 1.0, waits
                assert any("breaker is open" in w for w in whys), whys
                assert any("refused" in w or "tried" in w for w in whys), whys
                assert r.alive()
                no_traceback(r.log_text())
