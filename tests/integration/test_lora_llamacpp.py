"""LoRA adapters on a real llama-server: tiny GGUF adapters written with `gguf`, loaded by
the engine the agent starts, selected per request by the router (docs/sleep-and-adapters.md).

Needs the llama-server binary (scripts/build-llama-server, LLMGW_LLAMA_SERVER); without it
the file skips and says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.testing import Program, tinygguf
from tests.integration.controller_harness import wait_for
from tests.integration.router_fixtures import base_config, get_json, router
from tests.integration.test_agent_controller import TOKEN, ControllerRig
from tests.integration.test_agent_supervision import AgentRig
from tests.integration.test_hostile_controller import call

LLAMA_SERVER = os.environ.get("LLMGW_LLAMA_SERVER", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not (LLAMA_SERVER and os.access(LLAMA_SERVER, os.X_OK)),
        reason="no llama-server: run scripts/build-llama-server and set LLMGW_LLAMA_SERVER",
    ),
]


class Rig:
    """A controller, one agent with two CPU units, a router, and the GGUF files."""

    def __init__(self, tmp: Path, ctrl: ControllerRig, router: Program) -> None:
        self.tmp = tmp
        self.ctrl = ctrl
        self.router = router
        self.client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="none", max_retries=0)

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        raw = None if body is None else json.dumps(body).encode()
        status, _, data = call(self.ctrl.url, method, path, raw, token=TOKEN)
        return status, data

    def serving(self, name: str) -> list[dict[str, Any]]:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        eps = get_json(f"{self.ctrl.url}/v1/endpoints", headers=auth)["endpoints"]
        return [e for e in eps if name in e["models"]]

    def text(self, model: str) -> tuple[str, str]:
        """(the answer's model, its text) for one greedy chat request."""
        a = self.client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=12,
            temperature=0,
        )
        return a.model, a.choices[0].message.content or ""


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    tinygguf.write(tmp_path / "tiny.gguf")
    tinygguf.write_lora(tmp_path / "a.gguf", seed=1)
    tinygguf.write_lora(tmp_path / "b.gguf", seed=2)
    ctrl = ControllerRig(tmp_path)
    ctrl.start()
    agent = AgentRig(tmp_path, ctrl.url, token=TOKEN, gpus="2xCPU-16G")
    try:
        agent.start(env={"LLMGW_LLAMA_SERVER": LLAMA_SERVER})
        cfg = base_config(
            controller={"url": ctrl.url, "token": TOKEN, "poll_timeout_s": 2.0},
            hold_timeout_s=60.0,
        )
        with router(tmp_path, cfg) as r:
            rig = Rig(tmp_path, ctrl, r)
            try:
                yield rig
            finally:
                rig.client.close()
    finally:
        agent.cleanup()
        ctrl.stop()


def base(tmp: Path) -> dict[str, Any]:
    return {
        "name": "tiny",
        "engine": "llamacpp",
        "source": str(tmp / "tiny.gguf"),
        "gpu_classes": ["CPU-16G"],
        "min_replicas": 1,
        "max_replicas": 1,
        "args": ["--parallel", "2", "--ctx-size", "4096"],
    }


def lora(name: str, path: Path) -> dict[str, Any]:
    return {"name": name, "adapter_of": "tiny", "source": str(path)}


class TestLlamaServerAdapters:
    """Adapters on a real llama-server change the answer and are named."""

    def test_each_adapter_changes_the_answer_and_is_named(self, rig: Rig) -> None:
        """The engine loads both adapter files; a request for each is answered with that
        adapter applied (greedy text unlike the base's and the other's) and its name, in a
        whole answer and in every event of a stream; a third added later rolls the base
        over and is served too."""
        specs = [base(rig.tmp), lora("ad-a", rig.tmp / "a.gguf"), lora("ad-b", rig.tmp / "b.gguf")]
        status, body = rig.admin("POST", "/admin/models", specs)
        assert status == 200, body
        wait_for(lambda: rig.serving("ad-b"), timeout_s=90, what="the replica serves ad-b")
        (ep,) = rig.serving("ad-a")
        assert ep["lora_ids"] == ["ad-a", "ad-b"]
        wait_for(
            lambda: "ad-b" in {m["id"] for m in get_json(f"{rig.router.url}/v1/models")["data"]},
            what="the router knows the adapters",
        )
        _, plain = rig.text("tiny")
        name_a, with_a = rig.text("ad-a")
        name_b, with_b = rig.text("ad-b")
        assert (name_a, name_b) == ("ad-a", "ad-b")
        assert len({plain, with_a, with_b}) == 3, (plain, with_a, with_b)
        assert rig.text("ad-a") == (name_a, with_a)
        stream = rig.client.chat.completions.create(
            model="ad-b",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=12,
            temperature=0,
            stream=True,
        )
        chunks = list(stream)
        assert {c.model for c in chunks} == {"ad-b"}
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == with_b
        status, body = rig.admin("POST", "/admin/models", lora("ad-c", rig.tmp / "a.gguf"))
        assert status == 200, body
        wait_for(lambda: rig.serving("ad-c"), timeout_s=90, what="the rolled-over base serves ad-c")
        assert rig.text("ad-c") == ("ad-c", with_a)

    def test_path_llamacpp_cannot_take_is_refused(self, rig: Rig) -> None:
        """An adapter file whose path llama-server's list cannot carry is refused at apply."""
        status, _ = rig.admin("POST", "/admin/models", base(rig.tmp))
        assert status == 200
        status, body = rig.admin("POST", "/admin/models", lora("ad-x", Path("/a,b.gguf")))
        assert status == 422
        assert body["error"]["param"] == "[0].source"
