"""One real llama-server, started with the agent's own command line for it.

The engine's contracts that llmgw relies on, checked against the real binary
(scripts/build-llama-server; scripts/test exports LLMGW_LLAMA_SERVER): /health
answers 503 "Loading model" until the model is loaded and 200 after, and the
agent's probe calls only that 200 ready; its /metrics has the names the router's
llamacpp parser reads (the layout of tests/fixtures/engine-metrics/llamacpp.txt);
a file that is not a GGUF makes it exit 1 with llama.cpp's reason in its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.agent.probe import HttpHealthProbe
from llmgw.agent.templates import render
from llmgw.router.replicas.enginemetrics import parse
from llmgw.testing import free_port, tinygguf, wait_until
from llmgw.wire.agent import ShardSpec

LLAMA_SERVER = os.environ.get("LLMGW_LLAMA_SERVER", "")
FIXTURE = Path(__file__).parent.parent / "fixtures" / "engine-metrics" / "llamacpp.txt"

pytestmark = pytest.mark.skipif(
    not (LLAMA_SERVER and os.access(LLAMA_SERVER, os.X_OK)),
    reason="no llama-server: run scripts/build-llama-server and set LLMGW_LLAMA_SERVER "
    "(scripts/test does both)",
)


def _argv(model: Path, port: int) -> tuple[str, ...]:
    spec = ShardSpec(
        replica_id="r1",
        rank=0,
        model=str(model),
        served_names=("tiny",),
        engine="llamacpp",
        gpu_indices=(0,),
        args=("--parallel", "2", "--ctx-size", "4096"),
    )
    # No key: this file checks the engine's own answers; keys are in test_engine_key.py.
    plan = render(spec, port=port, host="127.0.0.1", commands={"llamacpp": (LLAMA_SERVER,)})
    assert plan.health_path == "/health"
    return plan.argv


def _status(url: str) -> tuple[int | None, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return None, b""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tinygguf.write(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture
def engine(model: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, list]]:
    """The engine, with /health polled from before it starts until it answers 200."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    seen: list[tuple[int | None, bytes]] = []
    started = threading.Event()

    def answered() -> bool:
        status, body = _status(url + "/health")
        seen.append((status, body))
        return status == 200

    def poll() -> None:
        started.set()
        # Never 200: the test says so from `seen`, not this thread.
        with contextlib.suppress(AssertionError):
            wait_until(answered, timeout_s=30, every_s=0.001, what="llama-server's 200")

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    started.wait()
    with (tmp_path / "engine.log").open("wb") as log:
        proc = subprocess.Popen(_argv(model, port), stdout=log, stderr=subprocess.STDOUT)
    try:
        t.join(timeout=35)
        yield proc, url, seen
    finally:
        proc.kill()
        proc.wait(timeout=10)


class TestLlamaServer:
    """A real llama-server's health, metrics and start failures."""

    def test_health_is_503_while_loading_then_200(
        self,
        engine: tuple[subprocess.Popen[bytes], str, list],
    ) -> None:
        """llama-server listens before it loads: 503 'Loading model' first, then 200; the
        agent's probe is ready only on the 200."""
        proc, url, seen = engine
        statuses = [s for s, _ in seen]
        assert statuses[-1] == 200, statuses[-5:]
        loading = [body for status, body in seen if status == 503]
        assert loading, f"never saw the loading answer: {sorted(set(statuses), key=str)}"
        assert json.loads(loading[0])["error"]["message"] == "Loading model"
        # Nothing but "not listening yet", "loading" and finally "ready".
        assert set(statuses) <= {None, 503, 200}
        assert 200 not in statuses[:-1]

        async def probe() -> bool:
            p = HttpHealthProbe()
            try:
                return await p.check("127.0.0.1", int(url.rsplit(":", 1)[1]), "/health")
            finally:
                await p.close()

        assert asyncio.run(probe()) is True
        assert proc.poll() is None

    def test_real_metrics_match_the_parser(
        self, engine: tuple[subprocess.Popen[bytes], str, list]
    ) -> None:
        """After one request, /metrics parses with the llamacpp names; the series are the
        same as in the fixture the router's unit tests use."""
        _proc, url, _seen = engine
        body = json.dumps({"prompt": "once upon a time", "max_tokens": 5}).encode()
        req = urllib.request.Request(
            url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            usage = json.loads(resp.read())["usage"]
        assert usage["completion_tokens"] == 5
        status, text = _status(url + "/metrics")
        assert status == 200
        stats = parse(text, "llamacpp")
        assert stats.running == 0
        assert stats.waiting == 0
        assert stats.prompt_tokens == usage["prompt_tokens"]
        assert stats.generation_tokens == 5
        # No KV gauge in this llama.cpp (removed upstream in 2025): unknown, not zero.
        assert stats.kv_usage is None

        def names(raw: str) -> set[str]:
            return {ln.split()[2] for ln in raw.splitlines() if ln.startswith("# TYPE ")}

        assert names(text.decode()) == names(FIXTURE.read_text())

    def test_bad_model_file_exits_with_llamacpps_reason(self, tmp_path: Path) -> None:
        """Not a GGUF: exit 1, and llama.cpp says why in its last log lines."""
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(b"not a model\n" * 100)
        out = subprocess.run(
            _argv(bad, free_port()), capture_output=True, text=True, timeout=30, check=False
        )
        assert out.returncode == 1
        tail = (out.stdout + out.stderr).splitlines()[-5:]
        assert any("failed to load model" in line for line in tail), tail

    def test_real_metrics_show_running_and_waiting_under_load(
        self,
        engine: tuple[subprocess.Popen[bytes], str, list],
    ) -> None:
        """Four long requests on two slots (`--parallel 2`): the scrape the router parses
        shows two running and the rest waiting while they last (llama.cpp's
        `requests_processing` and `requests_deferred`)."""
        _proc, url, _seen = engine
        body = json.dumps(
            {"prompt": "the long road home", "max_tokens": 1500, "ignore_eos": True}
        ).encode()
        results: list[int] = []

        def one() -> None:
            req = urllib.request.Request(
                url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:
                    results.append(resp.status)
            except OSError:
                results.append(-1)

        clients = [threading.Thread(target=one, daemon=True) for _ in range(4)]
        for c in clients:
            c.start()
        seen: list[tuple[float, float]] = []

        def two_running_one_waiting() -> bool:
            status, text = _status(url + "/metrics")
            if status == 200:
                stats = parse(text, "llamacpp")
                seen.append((stats.running, stats.waiting))
                if stats.running == 2 and stats.waiting >= 1:
                    return True
            return len(results) == 4  # all answered: nothing more to see

        wait_until(two_running_one_waiting, timeout_s=60, every_s=0.02, what="2 running, 1 waiting")
        for c in clients:
            c.join(timeout=120)
        assert any(r == 2 and w >= 1 for r, w in seen), seen[-10:]
        assert results == [200] * 4
