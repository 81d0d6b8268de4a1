"""A real llama-server behind a real router: Anthropic Messages and /tokenize pass through.

llama.cpp's server serves `/v1/messages` and `/tokenize` itself; the router
routes them like any other route (model from the body, or its only model for
`/tokenize`, whose llama.cpp body has none). Needs LLMGW_LLAMA_SERVER
(scripts/build-llama-server; scripts/test exports it).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

from llmgw.agent.templates import render
from llmgw.testing import Program, free_port, tinygguf, wait_until
from llmgw.wire.agent import ShardSpec

from .router_fixtures import base_config, router

LLAMA_SERVER = os.environ.get("LLMGW_LLAMA_SERVER", "")

pytestmark = [
    pytest.mark.skipif(
        not (LLAMA_SERVER and os.access(LLAMA_SERVER, os.X_OK)),
        reason="no llama-server: run scripts/build-llama-server and set LLMGW_LLAMA_SERVER "
        "(scripts/test does both)",
    ),
    pytest.mark.timeout(120),
]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Program]:
    """llama-server on the tiny GGUF, served as `tiny`, behind one router."""
    tmp = tmp_path_factory.mktemp("router-llamacpp")
    model = tinygguf.write(tmp / "tiny.gguf")
    port = free_port()
    spec = ShardSpec(
        replica_id="r1",
        rank=0,
        model=str(model),
        served_names=("tiny",),
        engine="llamacpp",
        gpu_indices=(0,),
        args=("--parallel", "2", "--ctx-size", "2048"),
    )
    plan = render(spec, port=port, host="127.0.0.1", commands={"llamacpp": (LLAMA_SERVER,)})
    url = f"http://127.0.0.1:{port}"
    with Path(tmp / "engine.log").open("wb") as log:
        proc = subprocess.Popen(plan.argv, stdout=log, stderr=subprocess.STDOUT)
    try:

        def ready() -> bool:
            assert proc.poll() is None, (tmp / "engine.log").read_text()[-2000:]
            return _ready(url)

        wait_until(ready, timeout_s=60, every_s=0.1, what="llama-server ready")
        cfg = base_config(
            endpoints=[{"id": "l0", "url": url, "models": ["tiny"], "engine": "llamacpp"}]
        )
        with router(tmp, cfg) as r:
            yield r
    finally:
        proc.kill()
        proc.wait(timeout=10)


class TestLlamaServerThroughRouter:
    """Messages and /tokenize pass through to a real llama-server."""

    def test_messages_with_the_anthropic_sdk(self, fleet: Program) -> None:
        """The anthropic package's create, whole and streamed, reaches llama-server."""
        with anthropic.Anthropic(base_url=fleet.url, api_key="none", max_retries=0) as client:
            user = [{"role": "user", "content": "once upon a time"}]
            msg = client.messages.create(model="tiny", max_tokens=4, messages=user)  # type: ignore[arg-type]
            assert msg.type == "message"
            assert msg.usage.output_tokens > 0
            with client.messages.stream(model="tiny", max_tokens=4, messages=user) as stream:  # type: ignore[arg-type]
                final = stream.get_final_message()
            assert final.usage.output_tokens > 0

    def test_tokenize_without_a_model(self, fleet: Program) -> None:
        """llama.cpp's /tokenize body has no model: the router routes it to its only one."""
        req = urllib.request.Request(
            fleet.url + "/tokenize",
            data=b'{"content": "hello world"}',
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.headers["x-llmgw-endpoint"] == "l0"
            tokens = json.loads(resp.read())["tokens"]
        assert tokens
