"""Streams that go wrong inside a 200: a stalled engine, an engine's own error event.

Against real sim-engine and router processes.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest

from .router_fixtures import (
    MODEL,
    base_config,
    chat_body,
    endpoint_entries,
    post,
    router,
    sim_engines,
    snapshot,
    wait_until_scraped,
)

pytestmark = pytest.mark.slow


def error_events(events: list[str]) -> list[dict[str, object]]:
    return [json.loads(e)["error"] for e in events if e.startswith('{"error"')]


class TestStalledStream:
    """A silent engine's stream is ended."""

    async def test_silent_engine_ends_the_stream(self, tmp_path: Path) -> None:
        """An engine that goes silent mid-stream: after stream_idle_timeout_s the client
        gets an error event and [DONE] (not a hang until request_timeout_s), and the
        endpoint's breaker counts the failure."""
        with sim_engines(tmp_path, [20.0], extra=["--stall-after-tokens", "3"]) as engines:
            cfg = base_config(
                endpoints=endpoint_entries(engines),
                stream_idle_timeout_s=1.0,
                breaker={"failure_threshold": 1, "cooldown_s": 30.0, "max_cooldown_s": 60.0},
            )
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0"])
                t0 = time.monotonic()
                async with aiohttp.ClientSession() as session:
                    reply = await asyncio.wait_for(
                        post(session, r.url, chat_body("stall", max_tokens=50, stream=True)), 20
                    )
                took = time.monotonic() - t0
                snap = await asyncio.to_thread(snapshot, r.url, "e0")
        assert reply.status == 200
        events = reply.events()
        assert events[-1] == "[DONE]"
        errors = error_events(events)
        assert len(errors) == 1
        assert "no data for 1s" in str(errors[0]["message"])
        # Tokens came before the silence, and the silence was cut at about the bound.
        assert len(events) >= 4
        assert 0.9 < took < 15
        assert snap["breaker"] == "open"


class TestEngineErrorEvent:
    """A 5xx error event counts against the endpoint."""

    async def test_5xx_error_event_counts_against_the_endpoint(self, tmp_path: Path) -> None:
        """A stream that carries the engine's own 5xx error event is relayed as is, and
        counted as the endpoint's failure: enough of them open its breaker."""
        with sim_engines(tmp_path, [20.0], extra=["--error-after-tokens", "2"]) as engines:
            cfg = base_config(
                endpoints=endpoint_entries(engines),
                breaker={"failure_threshold": 2, "cooldown_s": 30.0, "max_cooldown_s": 60.0},
            )
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0"])
                async with aiohttp.ClientSession() as session:
                    first = await post(session, r.url, chat_body("a", stream=True))
                    after_one = await asyncio.to_thread(snapshot, r.url, "e0")
                    second = await post(session, r.url, chat_body("b", stream=True))
                after_two = await asyncio.to_thread(snapshot, r.url, "e0")
        for reply in (first, second):
            assert reply.status == 200
            events = reply.events()
            assert events[-1] == "[DONE]"
            assert [e["code"] for e in error_events(events)] == [500]
        assert after_one["breaker"] == "closed"
        assert after_two["breaker"] == "open"


class TestErrorEventBeforeOutput:
    """An error event before output is retried elsewhere or relayed."""

    async def test_retried_on_another_replica(self, tmp_path: Path) -> None:
        """An engine whose stream opens with its 5xx error event (after only the role
        opener) is retried on the other replica: the client gets a clean stream, and
        the failing engine's breaker counts the failure."""
        with sim_engines(tmp_path, [20.0, 20.0]) as engines:
            await set_faults(engines[0].url, error_after_tokens=0)
            cfg = base_config(
                endpoints=endpoint_entries(engines),
                policy="round_robin",
                breaker={"failure_threshold": 1, "cooldown_s": 30.0, "max_cooldown_s": 60.0},
            )
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0", "e1"])
                async with aiohttp.ClientSession() as session:
                    # Round robin: one of two requests in a row meets e0 first.
                    replies = [await post(session, r.url, chat_body(p, stream=True)) for p in "ab"]
                snap = await asyncio.to_thread(snapshot, r.url, "e0")
        for reply in replies:
            assert reply.status == 200
            assert reply.endpoint == "e1"
            events = reply.events()
            assert events[-1] == "[DONE]"
            assert error_events(events) == []
            assert len(events) >= 3  # the role opener, tokens, [DONE]
        assert snap["breaker"] == "open"

    @pytest.mark.parametrize(
        ("path", "body", "done"),
        [
            (
                "/v1/messages",
                {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
                '"type":"message_start"',
            ),
            ("/v1/responses", {"max_output_tokens": 8, "input": "hi"}, '"type":"response.created"'),
        ],
        ids=["messages", "responses"],
    )
    async def test_retried_after_the_opening_events(
        self, tmp_path: Path, path: str, body: dict[str, object], done: str
    ) -> None:
        """A Messages or Responses stream whose engine fails right after the events that
        open it (no output yet) is retried on the other replica, as chat's is after its
        role opener: the client gets one clean stream, the failing engine is counted."""
        with sim_engines(tmp_path, [20.0, 20.0]) as engines:
            await set_faults(engines[0].url, error_after_tokens=0)
            cfg = base_config(
                endpoints=endpoint_entries(engines),
                policy="round_robin",
                breaker={"failure_threshold": 1, "cooldown_s": 30.0, "max_cooldown_s": 60.0},
            )
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0", "e1"])
                async with aiohttp.ClientSession() as session:
                    replies = [
                        await post(
                            session,
                            r.url,
                            {"model": MODEL, "stream": True, **body},
                            path=path,
                        )
                        for _ in "ab"
                    ]
                snap = await asyncio.to_thread(snapshot, r.url, "e0")
        for reply in replies:
            assert reply.status == 200, reply.body
            assert reply.endpoint == "e1"
            text = reply.body.decode()
            assert '"type":"error"' not in text
            assert text.count(done) == 1, text
            assert "delta" in text
        assert snap["breaker"] == "open"

    async def test_relayed_when_no_replica_is_left(self, tmp_path: Path) -> None:
        """With a single replica there is nowhere to retry: the engine's error event is
        relayed in a 200 stream as before."""
        with sim_engines(tmp_path, [20.0], extra=["--error-after-tokens", "0"]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0"])
                async with aiohttp.ClientSession() as session:
                    reply = await post(session, r.url, chat_body("a", stream=True))
        assert reply.status == 200
        assert reply.endpoint == "e0"
        events = reply.events()
        assert events[-1] == "[DONE]"
        assert [e["code"] for e in error_events(events)] == [500]


async def set_faults(engine_url: str, **faults: object) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(engine_url + "/sim/faults", json=faults) as resp,
    ):
        assert resp.status == 200, await resp.text()
