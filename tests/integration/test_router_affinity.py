"""Prefix affinity: conversations stick to one replica within a load bound; routers agree."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing.wait import until

from .router_fixtures import (
    MODEL,
    base_config,
    endpoint_entries,
    post,
    router,
    sim_engines,
    snapshot,
    wait_until_scraped,
)

pytestmark = pytest.mark.slow


def system_prompt(tag: str) -> str:
    return f"[{tag}] You are a helpful assistant for the ACME corporation. " * 12


async def conversation_turns(
    session: aiohttp.ClientSession, url: str, *, tag: str, turns: int
) -> list[str]:
    """Run a multi-turn chat, sending the whole history each turn; the endpoint of each."""
    messages: list[dict[str, str]] = [{"role": "system", "content": system_prompt(tag)}]
    where: list[str] = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i}: tell me more please"})
        body = {"model": MODEL, "messages": messages, "max_tokens": 16}
        r = await post(session, url, body)
        assert r.status == 200, r.body
        where.append(r.endpoint or "?")
        messages.append(r.json()["choices"][0]["message"])
    return where


@contextlib.asynccontextmanager
async def busy(engine_url: str, *, requests: int, max_tokens: int) -> AsyncIterator[None]:
    """Load one engine directly (not through the router) for the duration of the block."""
    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": uuid.uuid4().hex}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
            }
            with contextlib.suppress(aiohttp.ClientError):
                async with session.post(engine_url + "/v1/chat/completions", json=body) as resp:
                    await resp.read()

        tasks = [asyncio.create_task(one()) for _ in range(requests)]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def engine_running(engine_url: str) -> float:
    with urllib.request.urlopen(engine_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running{")
    )


class TestConversation:
    """A conversation sticks to its replica until overloaded."""

    async def test_sticks_until_overloaded(self, tmp_path: Path) -> None:
        """Every turn of a conversation lands on one replica; once that replica is loaded
        beyond the bound, the next turn goes elsewhere."""
        with sim_engines(tmp_path, [10.0, 10.0, 10.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0", "e1", "e2"])
                async with aiohttp.ClientSession() as session:
                    where = await conversation_turns(session, r.url, tag="sticky", turns=6)
                    assert len(set(where)) == 1, where
                    holder = where[0]
                    engine = engines[int(holder[1:])]
                    # A full batch's worth of long requests straight at the holder: the
                    # router sees it only through the engine's metrics.
                    async with busy(engine.url, requests=24, max_tokens=4000):
                        await until(
                            lambda: engine_running(engine.url) >= 20,
                            what="20 running on the holder",
                            blocking=True,
                        )
                        await until(
                            lambda: snapshot(r.url, holder)["stats"]["running"] >= 20,
                            what="the router seeing 20 running on the holder",
                            blocking=True,
                        )
                        moved = await conversation_turns(session, r.url, tag="sticky", turns=1)
        assert moved[0] != holder, (holder, moved)


class TestTwoRouters:
    """Two routers send a new prefix to the same replica."""

    async def test_new_prefix_goes_to_the_same_replica(self, tmp_path: Path) -> None:
        """Two routers that never talk send each new prefix to the same replica."""
        with sim_engines(tmp_path, [20.0, 20.0, 20.0, 20.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg, name="ra") as ra, router(tmp_path, cfg, name="rb") as rb:
                await wait_until_scraped(ra.url, ["e0", "e1", "e2", "e3"])
                await wait_until_scraped(rb.url, ["e0", "e1", "e2", "e3"])
                async with aiohttp.ClientSession() as session:
                    pairs = []
                    for i in range(8):
                        body = {
                            "model": MODEL,
                            "messages": [
                                {"role": "system", "content": system_prompt(f"tenant-{i}")},
                                {"role": "user", "content": "hello"},
                            ],
                            "max_tokens": 4,
                        }
                        a = await post(session, ra.url, json.dumps(body).encode())
                        b = await post(session, rb.url, json.dumps(body).encode())
                        pairs.append((a.endpoint, b.endpoint))
        assert all(a == b for a, b in pairs), pairs
        # Homes spread over the fleet rather than all landing on one replica.
        assert len({a for a, _ in pairs}) >= 2, pairs


def router_metrics(router_url: str) -> str:
    with urllib.request.urlopen(router_url + "/metrics", timeout=5) as resp:
        return str(resp.read().decode())


class TestSessionHints:
    """New conversations find the shared system prompt."""

    async def test_new_conversations_find_the_shared_system_prompt(self, tmp_path: Path) -> None:
        """Conversations of different users (`user` field, X-Session-ID header) over one
        system prompt all go where that prompt is cached, and hit it: a hint is no part
        of the prefix chain (each got its own chain, and its own home, before)."""
        with sim_engines(tmp_path, [20.0] * 4) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0", "e1", "e2", "e3"])
                async with aiohttp.ClientSession() as session:
                    where, cached = [], []
                    for i in range(8):
                        body = {
                            "model": MODEL,
                            "messages": [
                                {"role": "system", "content": system_prompt("shared") * 3},
                                {"role": "user", "content": f"user {i} asks question {i}"},
                            ],
                            "max_tokens": 4,
                        }
                        headers = {}
                        if i % 2:
                            headers["X-Session-ID"] = f"conversation-{i}"
                        else:
                            body["user"] = f"user-{i}"
                        reply = await post(session, r.url, body, headers=headers)
                        assert reply.status == 200, reply.body
                        where.append(reply.endpoint)
                        details = reply.json()["usage"]["prompt_tokens_details"]
                        cached.append(details["cached_tokens"])
        assert len(set(where)) == 1, where
        assert cached[0] == 0
        assert all(c >= 256 for c in cached[1:]), cached


class TestPredictionFeedback:
    """Engine answers check and correct the prefix index."""

    async def test_engine_answers_check_and_correct_the_index(self, tmp_path: Path) -> None:
        """The engine's cached_tokens (streamed and not) is compared with the index's
        prediction: hits while they agree; after the engine's cache is reset behind
        the router's back, three empty answers in a row reset the index."""
        prompts = [system_prompt(f"tenant-{i}") * 2 for i in range(3)]  # ~1.5 KB each

        def body(i: int, question: str, stream: bool) -> dict[str, Any]:
            b: dict[str, Any] = {
                "model": MODEL,
                "messages": [
                    {"role": "system", "content": prompts[i]},
                    {"role": "user", "content": question},
                ],
                "max_tokens": 4,
                "stream": stream,
            }
            if stream:
                b["stream_options"] = {"include_usage": True}
            return b

        with sim_engines(tmp_path, [20.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0"])
                async with aiohttp.ClientSession() as session:
                    for question in ("first", "second"):
                        for i in range(3):
                            reply = await post(session, r.url, body(i, question, i != 2))
                            assert reply.status == 200, reply.body
                    text = router_metrics(r.url)
                    assert 'llmgw_router_prefix_predictions_total{outcome="hit"} 6.0' in text
                    assert "llmgw_router_prefix_corrections_total 0.0" in text
                    async with session.post(engines[0].url + "/reset_prefix_cache") as resp:
                        assert (resp.status, await resp.json()) == (200, {"reset": True})
                    for i in range(3):
                        reply = await post(session, r.url, body(i, "third", i != 2))
                        assert reply.status == 200, reply.body
                    text = router_metrics(r.url)
                    assert 'llmgw_router_prefix_predictions_total{outcome="cleared"} 3.0' in text
                    assert "llmgw_router_prefix_corrections_total 1.0" in text
                    # The index kept the chain just served: the engine holds it again.
                    again = await post(session, r.url, body(2, "fourth", False))
                    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 256
                    text = router_metrics(r.url)
                    assert 'llmgw_router_prefix_predictions_total{outcome="hit"} 7.0' in text
