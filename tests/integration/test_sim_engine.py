"""A real sim-engine process under load: prefix caching, waiting, preemption, metrics."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import Iterator

import aiohttp
import pytest

from llmgw.simengine.kvcache import prompt_block_hashes
from llmgw.simengine.tokenizer import prompt_ids_for_body
from llmgw.testing import Program, start_program
from llmgw.testing.wait import until

SAMPLE = re.compile(r"^([^{# ]+)(?:\{([^}]*)\})? (\S+)$", re.MULTILINE)


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """/metrics as name → value, summed over label sets (what the router does)."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for name, _labels, value in SAMPLE.findall(text):
        out[name] = out.get(name, 0.0) + float(value)
    return out


async def stream_chat(
    session: aiohttp.ClientSession, url: str, body: dict[str, object]
) -> tuple[float, dict[str, object]]:
    """Send a streaming chat request; returns (seconds to first token, usage)."""
    t0 = time.monotonic()
    ttft = -1.0
    usage: dict[str, object] = {}
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with session.post(url + "/v1/chat/completions", json=payload) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content") and ttft < 0:
                ttft = time.monotonic() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    return ttft, usage


@pytest.fixture
def prefix_engine() -> Iterator[Program]:
    # A slow prefill (0.2 ms/token) makes the cache's effect on TTFT large next to the
    # noise of a loaded test machine.
    prog = start_program(
        ["sim-engine", "--port", "0", "--model", "m", "--prefill-ms-per-token", "0.2"]
    )
    try:
        yield prog
    finally:
        prog.stop()


class TestPrefixCache:
    """A real sim-engine caches repeated prefixes."""

    async def test_repeated_long_prefix_is_cached(self, prefix_engine: Program) -> None:
        """The same long prefix twice: cached tokens, a faster first token, more hits."""
        url = prefix_engine.url
        system = "You are a helpful assistant. " * 600  # 17,400 chars: 4,350 tokens
        sys_msg = {"role": "system", "content": system}
        body = {
            "model": "m",
            "max_tokens": 2,
            "messages": [sys_msg, {"role": "user", "content": "a"}],
        }
        second = {**body, "messages": [sys_msg, {"role": "user", "content": "b"}]}
        async with aiohttp.ClientSession() as s:
            before = await scrape(s, url)
            ttft1, usage1 = await stream_chat(s, url, body)
            ttft2, usage2 = await stream_chat(s, url, second)
            after = await scrape(s, url)
        details1 = usage1["prompt_tokens_details"]
        details2 = usage2["prompt_tokens_details"]
        assert details1 == {"cached_tokens": 0}
        assert isinstance(details2, dict)
        assert details2["cached_tokens"] >= 4300
        # Predicted: ~0.9 s of prefill vs ~8 ms; a loaded machine adds noise, not 0.4 s.
        assert ttft2 < ttft1 / 2, (ttft1, ttft2)
        hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
        assert hits == details2["cached_tokens"]

    async def test_sim_cache_lists_the_prompt_hashes(self, prefix_engine: Program) -> None:
        """/sim/cache holds exactly the hashes an oracle computes from the request body."""
        url = prefix_engine.url
        body = {
            "model": "m",
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "The quick brown fox. " * 40}],
        }
        expected = prompt_block_hashes(prompt_ids_for_body(body), 16)
        async with aiohttp.ClientSession() as s:
            await stream_chat(s, url, body)
            async with s.get(url + "/sim/cache") as r:
                cache = await r.json()
        held = {b["hash"] for b in cache["blocks"]}
        assert cache["block_size"] == 16
        assert {h.hex() for h in expected} <= held
        assert all(b["ref_cnt"] == 0 for b in cache["blocks"])  # finished: evictable


@pytest.fixture
def small_engine() -> Iterator[Program]:
    # 4 sequences at most, and a KV cache of 39 blocks × 16 = 624 tokens.
    prog = start_program(
        [
            "sim-engine",
            "--port",
            "0",
            "--model",
            "m",
            "--max-num-seqs",
            "4",
            "--num-gpu-blocks",
            "40",
            "--max-model-len",
            "512",
            "--speed",
            "2",
        ]
    )
    try:
        yield prog
    finally:
        prog.stop()


async def watch(session: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> dict[str, float]:
    """Poll /metrics until `stop`; returns the maximum seen of each series."""
    peak: dict[str, float] = {}
    while not stop.is_set():
        for k, v in (await scrape(session, url)).items():
            peak[k] = max(peak.get(k, v), v)
        await asyncio.sleep(0.02)
    return peak


class TestSaturation:
    """Requests beyond the engine's capacity wait and finish."""

    async def test_more_requests_than_max_num_seqs_wait_and_finish(
        self, small_engine: Program
    ) -> None:
        """12 concurrent requests on a 4-sequence engine: some wait, all finish."""
        url = small_engine.url
        async with aiohttp.ClientSession() as s:
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch(s, url, stop))
            bodies = [
                {
                    "model": "m",
                    "max_tokens": 40,
                    "ignore_eos": True,
                    "messages": [{"role": "user", "content": f"q{i}"}],
                }
                for i in range(12)
            ]
            results = await asyncio.gather(*(stream_chat(s, url, b) for b in bodies))
            stop.set()
            peak = await watcher
            final = await scrape(s, url)
        assert [u["completion_tokens"] for _, u in results] == [40] * 12
        assert peak["vllm:num_requests_waiting"] > 0
        assert peak["vllm:num_requests_running"] == 4
        assert (final["vllm:num_requests_running"], final["vllm:num_requests_waiting"]) == (0, 0)
        assert final["vllm:request_success_total"] == 12

    async def test_full_kv_cache_makes_requests_wait(self, small_engine: Program) -> None:
        """Requests whose KV does not fit together wait (and may be preempted), yet all finish."""
        url = small_engine.url
        prompt = "lorem ipsum dolor sit amet " * 20  # ~135 tokens + template
        async with aiohttp.ClientSession() as s:
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch(s, url, stop))
            bodies = [
                {
                    "model": "m",
                    "max_tokens": 150,
                    "ignore_eos": True,
                    "messages": [{"role": "user", "content": f"{i} {prompt}"}],
                }
                for i in range(6)
            ]
            results = await asyncio.gather(*(stream_chat(s, url, b) for b in bodies))
            stop.set()
            peak = await watcher
            final = await scrape(s, url)
        assert [u["completion_tokens"] for _, u in results] == [150] * 6
        # ~140-token prompts (9 blocks) are admitted four at a time; grown to ~290
        # tokens (19 blocks) only two fit in 39 blocks, so decode must preempt.
        assert peak["vllm:num_requests_waiting"] > 0
        assert final["vllm:num_preemptions_total"] > 0
        assert peak["vllm:kv_cache_usage_perc"] > 0.8
        assert final["vllm:kv_cache_usage_perc"] == 0.0


class TestDialect:
    """The SGLang dialect's metric names."""

    async def test_sglang_names(self) -> None:
        """--metrics-dialect sglang switches /metrics to SGLang's names and /v1/models' owner."""
        with start_program(
            ["sim-engine", "--port", "0", "--model", "m", "--metrics-dialect", "sglang"]
        ) as prog:
            async with aiohttp.ClientSession() as s:
                await stream_chat(
                    s, prog.url, {"model": "m", "messages": [{"role": "user", "content": "x"}]}
                )
                m = await scrape(s, prog.url)
                async with s.get(prog.url + "/v1/models") as r:
                    owner = (await r.json())["data"][0]["owned_by"]
        assert (m["sglang:num_requests_total"], m["sglang:num_running_reqs"]) == (1, 0)
        assert m["sglang:max_total_num_tokens"] > 0
        assert not any(k.startswith("vllm:") for k in m)
        assert owner == "sglang"


class TestLifecycle:
    """SIGTERM and disconnects in a real sim-engine."""

    async def test_sigterm_lets_streams_finish(self) -> None:
        """SIGTERM mid-stream: the stream still ends with [DONE], then the process exits 0."""
        prog = start_program(["sim-engine", "--port", "0", "--model", "m"])
        try:
            body = {
                "model": "m",
                "max_tokens": 60,
                "ignore_eos": True,
                "stream": True,
                "messages": [{"role": "user", "content": "count"}],
            }
            lines = []
            async with (
                aiohttp.ClientSession() as s,
                s.post(prog.url + "/v1/chat/completions", json=body) as r,
            ):
                async for raw in r.content:
                    line = raw.decode().strip()
                    if line.startswith("data: "):
                        lines.append(line)
                        if len(lines) == 3:
                            prog.signal(signal.SIGTERM)
            code = prog.proc.wait(timeout=15)
        finally:
            prog.stop()
        assert (lines[-1], code) == ("data: [DONE]", 0)
        assert len(lines) == 1 + 60 + 1  # role, 60 tokens, [DONE]

    async def test_client_disconnect_aborts(self, prefix_engine: Program) -> None:
        """A client that goes away mid-stream frees its slot; the request counts as aborted."""
        url = prefix_engine.url
        body = {
            "model": "m",
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
            "messages": [{"role": "user", "content": "long"}],
        }
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                seen = 0
                async for raw in r.content:
                    seen += raw.startswith(b"data: ")
                    if seen == 3:
                        break
                r.close()

            async def none_running() -> dict[str, float] | None:
                m = await scrape(s, url)
                return None if m["vllm:num_requests_running"] else m

            m = await until(none_running, timeout_s=5, what="no request running")
        assert m["vllm:request_success_total"] == 1  # the abort
        assert m["vllm:kv_cache_usage_perc"] == 0.0

    async def test_client_leaving_while_queued_frees_its_place(self) -> None:
        """A streaming client that leaves while its request waits is aborted there, not later."""
        # One sequence at a time, slow steps: the blocker runs for seconds.
        argv = ["sim-engine", "--port", "0", "--model", "m", "--max-num-seqs", "1"]
        with start_program([*argv, "--speed", "0.5"]) as prog:
            url = prog.url

            def body(text: str) -> dict[str, object]:
                return {
                    "model": "m",
                    "max_tokens": 2000,
                    "ignore_eos": True,
                    "stream": True,
                    "messages": [{"role": "user", "content": text}],
                }

            async with (
                aiohttp.ClientSession() as s,
                aiohttp.ClientSession() as leaver,
                s.post(url + "/v1/chat/completions", json=body("blocker")) as blocker,
            ):
                await blocker.content.readline()  # running: it holds the only slot
                queued = await leaver.post(url + "/v1/chat/completions", json=body("queued"))

                async def waiting(n: int) -> dict[str, float] | None:
                    m = await scrape(s, url)
                    return m if m["vllm:num_requests_waiting"] == n else None

                await until(lambda: waiting(1), timeout_s=10, what="the request queued")
                queued.close()
                m = await until(lambda: waiting(0), timeout_s=10, what="the queue empty")
                assert (m["vllm:num_requests_waiting"], m["vllm:num_requests_running"]) == (0, 1)
