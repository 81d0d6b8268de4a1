"""The router's /metrics and access log against real sim-engines (issue: see the fleet).

Every request is counted with its outcome (the router's own 4xx and client
disconnects included), aliases count under the served name, tokens come from
the usage the engine returned, and the exposition passes `promtool check metrics`.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing import start_program
from llmgw.testing.wait import until
from tests.integration.router_fixtures import (
    base_config,
    chat_body,
    config_path,
    post,
    router,
    sim_engines,
    wait_until_scraped,
    write_config,
)
from tests.promtool import check_metrics, samples

pytestmark = pytest.mark.timeout(90)


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        body: bytes = resp.read()
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return body


def req_count(body: bytes, **labels: str) -> float:
    """Sum of llmgw_router_requests_total over series whose labels include `labels`."""
    total = 0.0
    for key, value in samples(body).items():
        if not key.startswith("llmgw_router_requests_total{"):
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += value
    return total


class TestRouterObservability:
    """The router's metrics and access log against real engines."""

    async def test_outcomes_tokens_aliases_and_access_log(self, tmp_path: Path) -> None:
        """Outcomes, tokens and aliases are counted and each request is logged."""
        # Speed 1: a token every 6.5 ms, so the streamed answer reaches the router as
        # several chunks (inter-token latency) even on a loaded machine.
        with sim_engines(tmp_path, [1.0], extra=["--served-model-name", "m", "m-alias"]) as engines:
            cfg = base_config(
                endpoints=[{"id": "e0", "url": engines[0].url, "models": ["m", "m-alias"]}],
                access_log=True,
            )
            path = write_config(config_path(tmp_path), cfg)
            argv = ["router", "--config", str(path), "--port", "0", "--log-format", "json"]
            argv += ["--workers", "1"]
            with start_program(argv, log_dir=tmp_path) as r:
                await wait_until_scraped(r.url, ["e0"])
                async with aiohttp.ClientSession() as s:
                    ok = await post(s, r.url, chat_body("hello there", max_tokens=4))
                    assert ok.status == 200
                    usage = ok.json()["usage"]
                    aliased = {**chat_body("hello there", max_tokens=3), "model": "m-alias"}
                    alias = await post(s, r.url, aliased)
                    assert alias.status == 200
                    alias_usage = alias.json()["usage"]
                    streamed = await post(
                        s,
                        r.url,
                        {
                            **chat_body("hello there", max_tokens=5),
                            "stream": True,
                            "stream_options": {"include_usage": True},
                        },
                    )
                    assert streamed.status == 200
                    stream_usage = json.loads(streamed.events()[-2])["usage"]
                    unknown = await post(s, r.url, {**chat_body("hi"), "model": "no-such-model"})
                    assert unknown.status == 404
                    bad = await post(s, r.url, b"{not json")
                    assert bad.status == 400
                    no_url = await post(s, r.url, chat_body("hi"), path="/v1/nothing")
                    assert no_url.status == 404
                    # A client that leaves mid-stream: a long generation, cut after one chunk.
                    long = {**chat_body("hello there", max_tokens=400), "stream": True}
                    async with s.post(r.url + "/v1/chat/completions", json=long) as resp:
                        assert resp.status == 200
                        await resp.content.readany()
                        resp.close()
                body = await until(
                    lambda: (
                        b if req_count(b := scrape(r.url), outcome="disconnected") >= 1 else None
                    ),
                    timeout_s=5,
                    blocking=True,
                    what="a request counted as disconnected",
                )
                check_metrics(body)
                got = samples(body)
                assert req_count(body, model="m", outcome="ok", code="200") == 3
                # The alias counts under the served name; no series for the alias itself.
                assert 'model="m-alias"' not in body.decode()
                assert req_count(body, model="", code="404", outcome="rejected") == 2
                assert req_count(body, model="", code="400", outcome="rejected") == 1
                assert req_count(body, model="m", code="499", outcome="disconnected") == 1
                assert 'model="no-such-model"' not in body.decode()
                prompt = got['llmgw_router_prompt_tokens_total{model="m"}']
                completion = got['llmgw_router_completion_tokens_total{model="m"}']
                # Two JSON answers and the stream that asked for usage; 4 + 3 + 5 tokens.
                assert completion == 12
                assert prompt == sum(u["prompt_tokens"] for u in (usage, alias_usage, stream_usage))
                assert 'llmgw_router_cached_tokens_total{model="m"}' in got
                assert got['llmgw_router_inter_token_latency_seconds_count{model="m"}'] >= 1
                ttft = 'llmgw_router_time_to_first_token_seconds_count{endpoint="e0",model="m"}'
                assert got[ttft] >= 2
            log = r.log_text()
        lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
        access = [x for x in lines if x.get("logger") == "llmgw.router.access"]
        outcomes = sorted(x["outcome"] for x in access)
        assert outcomes == sorted(
            ["ok", "ok", "ok", "rejected", "rejected", "rejected", "disconnected"]
        ), log[-2000:]
        streamed_line = next(x for x in access if x["outcome"] == "ok" and x["ttft_s"] is not None)
        assert streamed_line["completion_tokens"] == 5
        assert streamed_line["endpoint"] == "e0"
        assert streamed_line["model"] == "m"
        assert len(streamed_line["request_id"]) > 0
        assert streamed_line["duration_s"] >= streamed_line["ttft_s"]

    async def test_removed_endpoint_series_are_removed(self, tmp_path: Path) -> None:
        """An endpoint dropped by a reload takes its per-endpoint series with it."""
        with sim_engines(tmp_path, [20.0, 20.0]) as engines:
            eps = [{"id": f"e{i}", "url": p.url, "models": ["m"]} for i, p in enumerate(engines)]
            cfg = base_config(endpoints=eps)
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0", "e1"])
                async with aiohttp.ClientSession() as s:
                    for _ in range(6):
                        reply = await post(s, r.url, chat_body("hello there", max_tokens=2))
                        assert reply.status == 200
                assert 'endpoint="e1"' in scrape(r.url).decode()
                write_config(config_path(tmp_path), base_config(endpoints=eps[:1]))
                body = await until(
                    lambda: b if 'endpoint="e1"' not in (b := scrape(r.url)).decode() else None,
                    timeout_s=5,
                    blocking=True,
                    what="e1's series gone",
                )
                check_metrics(body)
