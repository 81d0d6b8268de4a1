"""A real inference engine in the loop: llama.cpp's llama-server under `llmgw up`.

One system for the whole file (tests run in file order, each leaving the fleet
as the next expects): two nodes of two CPU units each, a tiny random llama GGUF
written here (llmgw.testing.tinygguf) served by two llama-server replicas, and a
model whose file is not a GGUF at all. The binary comes from
scripts/build-llama-server (scripts/test builds it and exports
LLMGW_LLAMA_SERVER); without it the file skips and says so.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from llmgw.testing import tinygguf
from tests.e2e.conftest import System, kill_leftovers, pid_alive, start_up, wait_for

LLAMA_SERVER = os.environ.get("LLMGW_LLAMA_SERVER", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not (LLAMA_SERVER and os.access(LLAMA_SERVER, os.X_OK)),
        reason="no llama-server: run scripts/build-llama-server and set LLMGW_LLAMA_SERVER "
        "(scripts/test does both)",
    ),
]

MODEL = "tiny"
CONTROLLER_ARGS = [
    "--tick-s",
    "0.5",
    "--heartbeat-timeout-s",
    "4",
    "--unreachable-grace-s",
    "6",
    "--restart-backoff-s",
    "2",
]
BROKEN = "broken"


@pytest.fixture(scope="module")
def llama_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    tmp = tmp_path_factory.mktemp("e2e-llamacpp")
    tinygguf.write(tmp / "tiny.gguf")
    (tmp / "broken.gguf").write_bytes(b"this is not a GGUF file\n" * 64)
    fleet = {
        "nodes": [{"prefix": "cpu", "count": 2, "gpus": "2xCPU-16G"}],
        "controller_args": CONTROLLER_ARGS,
        "agent_args": ["--interval-s", "0.5"],
        "router": {"scrape_interval_s": 0.5, "scrape_timeout_s": 0.4, "report_interval_s": 0.5},
        "models": [
            {
                "name": MODEL,
                "engine": "llamacpp",
                # Relative: the fleet file's folder.
                "source": "tiny.gguf",
                "gpu_classes": ["CPU-16G"],
                "min_replicas": 2,
                "max_replicas": 2,
                "idle_timeout_s": 3600,
                "args": ["--parallel", "2", "--ctx-size", "8192"],
            },
            {
                "name": BROKEN,
                "engine": "llamacpp",
                "source": str(tmp / "broken.gguf"),
                "gpu_classes": ["CPU-16G"],
                "min_replicas": 1,
                "max_replicas": 1,
            },
        ],
    }
    (tmp / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    system = start_up(tmp, tmp / "fleet.yaml")
    try:
        yield system
    finally:
        try:
            system.stop(grace_s=60)
        finally:
            kill_leftovers(tmp)


def _admin_endpoints(system: System) -> dict[str, Any]:
    with urllib.request.urlopen(system.router_url + "/admin/endpoints", timeout=10) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def _snapshots(system: System) -> dict[str, dict[str, Any]]:
    return {s["info"]["id"]: s for s in _admin_endpoints(system)["endpoints"]}


def _engine_key(system: System, replica_id: str) -> str:
    """The key the agent started the replica's rank 0 with (its 0600 state file)."""
    for path in (system.state_dir / "agents").glob("*/agent-state.json"):
        for shard in json.loads(path.read_text())["shards"]:
            if shard["replica_id"] == replica_id and shard["rank"] == 0:
                return str(shard["api_key"])
    raise KeyError(replica_id)


def _engine_metrics(url: str, key: str) -> dict[str, float]:
    # llama-server wants its key on /metrics too (it leaves /health open).
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:") and "{" not in line:
            name, value = line.split()
            out[name] = float(value)
    return out


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


class TestLlamacpp:
    """Real llama-server engines under llmgw up."""

    def test_replicas_come_up_as_real_engines(self, llama_system: System) -> None:
        """Two ready replicas, each a llama-server process serving the GGUF; the router
        scrapes both with llama.cpp's metric names."""
        ready = wait_for(
            lambda: len(llama_system.ready(MODEL)) == 2 and llama_system.ready(MODEL),
            timeout_s=120,
            what="two tiny replicas ready",
        )
        for rep in ready:
            argv = _cmdline(rep["shards"][0]["pid"])
            assert argv[0] == LLAMA_SERVER
            assert argv[argv.index("--model") + 1].endswith("tiny.gguf")
            # Bound to the agent's address under up, its key in LLAMA_API_KEY, not argv.
            assert argv[argv.index("--host") + 1] == "127.0.0.1"
            assert "--api-key" not in argv
        snaps = wait_for(
            lambda: (
                len(s := _snapshots(llama_system)) == 2
                and all(v["stats"] is not None for v in s.values())
                and s
            ),
            timeout_s=30,
            what="both endpoints scraped",
        )
        assert {v["info"]["engine"] for v in snaps.values()} == {"llamacpp"}

    def test_chat_and_completions_stream_and_not(self, llama_system: System) -> None:
        """The real engine's answers through the router: exact token counts (the tiny
        model never samples end-of-text), printable text, streamed and not."""
        client = llama_system.client()
        msgs: Any = [{"role": "user", "content": "hello there"}]
        chat = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12)
        assert chat.usage is not None
        assert chat.usage.completion_tokens == 12
        assert chat.usage.prompt_tokens > len("hello there")  # chat template + BOS
        assert chat.choices[0].finish_reason == "length"
        text = chat.choices[0].message.content or ""
        assert text
        assert text.isascii()

        chunks = list(
            client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, stream=True)
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed
        assert streamed.isascii()
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

        comp = client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=9)
        assert comp.usage is not None
        assert comp.usage.completion_tokens == 9
        assert comp.usage.prompt_tokens == 1 + len("once upon a time")  # BOS + bytes
        assert comp.choices[0].text

        parts = list(
            client.completions.create(
                model=MODEL, prompt="once upon a time", max_tokens=7, stream=True
            )
        )
        assert "".join(p.choices[0].text for p in parts if p.choices)

    def test_bad_request_is_the_engines_error(self, llama_system: System) -> None:
        """A prompt longer than the context is refused with llama.cpp's own 400."""
        client = llama_system.client()
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt="x" * 9000, max_tokens=4)
        assert "context" in str(info.value).lower()

    def test_scrape_fills_running_and_waiting(self, llama_system: System) -> None:
        """While a long stream runs, the router's scrape of the real /metrics shows it
        running on the replica that serves it, and nothing waiting."""
        client = llama_system.client()
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "a long answer please"}],
            max_tokens=8000,
            stream=True,
        )
        eid = raw.headers["x-llmgw-endpoint"]
        stream = raw.parse()
        try:
            got = 0
            for chunk in stream:
                got += bool(chunk.choices)
                if got >= 2:
                    break

            def running() -> dict[str, Any] | None:
                stats = _snapshots(llama_system)[eid]["stats"]
                return stats if stats and stats["running"] == 1 else None

            stats = wait_for(running, timeout_s=15, what="running=1 in the router's scrape")
            assert stats["waiting"] == 0
            # This llama.cpp exports no KV gauge (the layout of tests/fixtures/
            # engine-metrics/llamacpp.txt): unknown, never a made-up zero.
            assert stats["kv_usage"] is None
            assert stats["prompt_tokens"] is not None
        finally:
            stream.close()

    def test_shared_prefix_goes_to_the_same_replica_and_reuses_the_cache(
        self, llama_system: System
    ) -> None:
        """Two requests sharing a long system prompt: the second goes by prefix
        affinity to the replica that served the first, which reuses the cached prompt."""
        client = llama_system.client()
        system_prompt = "You are the ACME assistant; answer briefly and kindly. " * 40
        urls = {r["id"]: r["endpoint_url"] for r in llama_system.ready(MODEL)}

        def ask(question: str) -> tuple[str, Any]:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[
                    {"role": "system", "content": system_prompt},
                    {"role": "user", "content": question},
                ],
                max_tokens=4,
            )
            return raw.headers["x-llmgw-endpoint"], raw.parse()

        first_eid, first = ask("what is one plus one?")
        key = _engine_key(llama_system, first_eid)
        with pytest.raises(urllib.error.HTTPError) as refused:
            _engine_metrics(urls[first_eid], "not-the-key")
        refused.value.close()
        assert refused.value.code == 401
        before = _engine_metrics(urls[first_eid], key)["llamacpp:prompt_tokens_cached_total"]
        second_eid, second = ask("and what is two plus two?")
        assert second_eid == first_eid
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached >= len(system_prompt), (cached, second.usage)
        assert cached < second.usage.prompt_tokens
        after = _engine_metrics(urls[first_eid], key)["llamacpp:prompt_tokens_cached_total"]
        assert after - before >= len(system_prompt)
        assert first.usage.prompt_tokens_details.cached_tokens < len(system_prompt)

    def test_bad_model_file_fails_with_the_engines_reason(self, llama_system: System) -> None:
        """A file that is not a GGUF: the replica fails, and `ctl replicas` carries
        llama.cpp's own words for why."""

        def failed() -> list[dict[str, Any]]:
            return [
                r
                for r in llama_system.replicas(BROKEN)
                if r["state"] == "failed" or "load" in (r.get("reason") or "")
            ]

        reps = wait_for(failed, timeout_s=60, what="the broken replica failed")
        reason = reps[0]["reason"] or ""
        assert "exited with code" in reason
        assert "failed to load model" in reason or "invalid magic" in reason, reason
        assert llama_system.ready(BROKEN) == []

    def test_kill_mid_stream_gives_an_error_frame_and_a_new_replica(
        self, llama_system: System
    ) -> None:
        """SIGKILL of llama-server while it streams: the client gets an error event,
        not a silent end, and the controller starts a replacement replica."""
        client = llama_system.client()
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "tell me a very long story"}],
            max_tokens=8000,
            stream=True,
        )
        eid = raw.headers["x-llmgw-endpoint"]
        rep = next(r for r in llama_system.ready(MODEL) if r["id"] == eid)
        pid = rep["shards"][0]["pid"]
        stream = raw.parse()
        got = 0
        error: openai.APIError | None = None
        try:
            for chunk in stream:
                got += bool(chunk.choices)
                if got == 3:
                    os.kill(pid, signal.SIGKILL)
        except openai.APIError as exc:
            error = exc
        assert got >= 3
        assert error is not None, f"the stream ended without an error after {got} chunks"
        assert error.message
        wait_for(lambda: not pid_alive(pid), timeout_s=10, what="llama-server gone")

        def replaced() -> bool:
            ready = llama_system.ready(MODEL)
            return len(ready) == 2 and all(r["id"] != eid for r in ready)

        wait_for(replaced, timeout_s=90, what="the killed replica replaced")
        ready = {r["id"] for r in llama_system.ready(MODEL)}

        def router_follows() -> bool:
            routed = set(_snapshots(llama_system))
            return ready <= routed and eid not in routed

        wait_for(router_follows, timeout_s=30, what="the router's list has the replacement")
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "still there?"}], max_tokens=3
        )
        assert r.usage is not None
        assert r.usage.completion_tokens == 3
