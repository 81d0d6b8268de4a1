"""The sim-engine's LoRA adapters in a real process: vLLM's flags, runtime routes, answers
and errors (simengine/lora.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from llmgw.agent.adapters import start_args
from llmgw.testing import Program, start_program
from llmgw.wire.agent import ShardSpec

KEY = "sim-key"


@pytest.fixture
def engine() -> Iterator[Program]:
    prog = start_program(
        [
            "sim-engine",
            "--port",
            "0",
            "--model",
            "base",
            "--speed",
            "50",
            "--api-key",
            KEY,
            "--enable-lora",
            "--lora-modules",
            "ad-a=/l/a",
            '{"name": "ad-b", "path": "/l/b"}',
        ]
    )
    try:
        yield prog
    finally:
        prog.stop()


def post(prog: Program, path: str, body: Any, *, key: str | None = KEY) -> tuple[int, Any]:
    req = urllib.request.Request(prog.url + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, raw.decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def models(prog: Program) -> dict[str, Any]:
    with openai.OpenAI(base_url=prog.url + "/v1", api_key=KEY, max_retries=0) as c:
        return {m.id: m for m in c.models.list().data}


class TestSimAdapters:
    """The sim-engine's LoRA adapters in a real process."""

    def test_adapters_served_by_name_and_listed_with_parent(self, engine: Program) -> None:
        """Both forms of --lora-modules are served; the answer names the adapter and
        /v1/models lists it with the base as parent and its path as root."""
        with openai.OpenAI(base_url=engine.url + "/v1", api_key=KEY, max_retries=0) as c:
            answer = c.chat.completions.create(
                model="ad-b", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
        assert answer.model == "ad-b"
        listed = models(engine)
        assert set(listed) == {"base", "ad-a", "ad-b"}
        extra = listed["ad-a"].model_extra or {}
        assert (extra["parent"], extra["root"]) == ("base", "/l/a")

    def test_runtime_load_and_unload(self, engine: Program) -> None:
        """An adapter loaded at run time is served; unloaded, it is a 404 model again."""
        status, text = post(
            engine, "/v1/load_lora_adapter", {"lora_name": "ad-c", "lora_path": "/c"}
        )
        assert (status, text) == (200, "Success: LoRA adapter 'ad-c' added successfully.")
        assert "ad-c" in models(engine)
        status, _ = post(engine, "/v1/unload_lora_adapter", {"lora_name": "ad-c"})
        assert status == 200
        status, body = post(
            engine, "/v1/completions", {"model": "ad-c", "prompt": "x", "max_tokens": 1}
        )
        assert (status, body["error"]["code"]) == (404, 404)

    @pytest.mark.parametrize(
        ("path", "body", "status", "says"),
        [
            (
                "/v1/load_lora_adapter",
                {"lora_name": "ad-a", "lora_path": "/x"},
                400,
                "already been loaded",
            ),
            (
                "/v1/load_lora_adapter",
                {"lora_name": "base", "lora_path": "/x"},
                400,
                "already been loaded",
            ),
            ("/v1/load_lora_adapter", {"lora_name": "ad-d"}, 400, "must be provided"),
            (
                "/v1/load_lora_adapter",
                {"lora_name": "", "lora_path": "/x"},
                400,
                "must be provided",
            ),
            ("/v1/unload_lora_adapter", {"lora_name": "nope"}, 404, "cannot be found"),
            ("/v1/unload_lora_adapter", {}, 400, "needs to be provided"),
        ],
    )
    def test_bad_requests_in_vllms_error_shape(
        self, engine: Program, path: str, body: Any, status: int, says: str
    ) -> None:
        """Refused loads and unloads answer vLLM's status and error body."""
        got, doc = post(engine, path, body)
        assert got == status
        assert says in doc["error"]["message"]
        assert doc["error"]["code"] == status

    def test_routes_need_the_engine_key(self, engine: Program) -> None:
        """Without the engine's key the runtime routes answer 401, as every /v1 route."""
        status, _ = post(
            engine, "/v1/load_lora_adapter", {"lora_name": "z", "lora_path": "/z"}, key=None
        )
        assert status == 401


class TestAgentFlagsStartTheEngine:
    """The agent's adapter flags, given to a real sim-engine that reads them as vLLM does."""

    def test_sources_with_separators_are_served_at_their_paths(self) -> None:
        """Sources with '=', ',', ':' and spaces start the engine and are listed with their
        exact paths as root (as `name=path` items the engine refused to start)."""
        adapters = {"ad-a": "/l/lr=1e-4", "ad-b": "/l/b,c", "ad-c": "/l/c d:e", "ad-d": "/l/d"}
        spec = ShardSpec(
            replica_id="r1",
            rank=0,
            model="base",
            served_names=("base",),
            engine="sim",
            gpu_indices=(0,),
            adapters=adapters,
        )
        flags = start_args(spec, {})
        argv = ["sim-engine", "--port", "0", "--model", "base", "--api-key", KEY, *flags]
        prog = start_program(argv)
        try:
            listed = models(prog)
        finally:
            prog.stop()
        roots = {n: (m.model_extra or {})["root"] for n, m in listed.items() if n != "base"}
        assert roots == adapters
