"""A real sim-engine process: every bad input with its status and body, and injected faults."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from llmgw.simengine.app import ENGINE_DEAD_EXIT_CODE
from llmgw.simengine.faults import CRASH_EXIT_CODE
from llmgw.testing import Program, start_program


@pytest.fixture(scope="module")
def engine() -> Iterator[Program]:
    prog = start_program(
        ["sim-engine", "--port", "0", "--model", "m", "--max-model-len", "64", "--speed", "20"]
    )
    try:
        yield prog
    finally:
        prog.stop()


async def post(url: str, path: str, data: bytes | dict[str, Any]) -> tuple[int, Any]:
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + path, data=body, headers={"Content-Type": "application/json"}) as r,
    ):
        text = await r.text()
        return r.status, json.loads(text) if text else None


def fast_engine(*extra: str) -> list[str]:
    return ["sim-engine", "--port", "0", "--model", "m", "--speed", "20", *extra]


def err(status: int, type_: str, message: str, param: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": status}}


USER = [{"role": "user", "content": "hi"}]


class TestBadInput:
    """Every bad input with its status and body."""

    async def test_malformed_json(self, engine: Program) -> None:
        """Malformed JSON: 400 BadRequestError."""
        status, body = await post(engine.url, "/v1/chat/completions", b'{"model": ')
        assert (status, body["error"]["type"], body["error"]["code"]) == (
            400,
            "BadRequestError",
            400,
        )
        assert set(body["error"]) == {"message", "type", "param", "code"}

    async def test_missing_model(self, engine: Program) -> None:
        """No model field: 400 naming the parameter."""
        status, body = await post(engine.url, "/v1/chat/completions", {"messages": USER})
        assert (status, body) == (
            400,
            err(400, "BadRequestError", "The 'model' field is required.", "model"),
        )

    async def test_unknown_model(self, engine: Program) -> None:
        """Unknown model: 404 NotFoundError, as vLLM words it."""
        status, body = await post(engine.url, "/v1/completions", {"model": "gpt-9", "prompt": "hi"})
        assert (status, body) == (
            404,
            err(404, "NotFoundError", "The model `gpt-9` does not exist.", "model"),
        )

    async def test_prompt_too_long(self, engine: Program) -> None:
        """A prompt over --max-model-len: 400 with the limit in the message."""
        status, body = await post(
            engine.url,
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "y" * 1000}]},
        )
        assert (status, body["error"]["type"]) == (400, "BadRequestError")
        assert body["error"]["message"].startswith(
            "This model's maximum context length is 64 tokens. However, your request has 254"
        )

    async def test_negative_max_tokens(self, engine: Program) -> None:
        """Negative max_tokens: 400 naming max_tokens."""
        status, body = await post(
            engine.url, "/v1/chat/completions", {"model": "m", "messages": USER, "max_tokens": -5}
        )
        assert (status, body) == (
            400,
            err(400, "BadRequestError", "max_tokens must be at least 1, got -5.", "max_tokens"),
        )

    async def test_max_tokens_over_context(self, engine: Program) -> None:
        """max_tokens that cannot fit after the prompt: 400."""
        status, body = await post(
            engine.url, "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 100}
        )
        assert (status, body["error"]["param"]) == (400, "max_tokens")

    async def test_nothing_was_counted(self, engine: Program) -> None:
        """Refused requests never reach the engine: no request is counted as finished."""
        async with aiohttp.ClientSession() as s, s.get(engine.url + "/metrics") as r:
            text = await r.text()
        lines = [x for x in text.splitlines() if x.startswith("vllm:request_success_total")]
        assert lines
        assert all(x.endswith(" 0.0") for x in lines)


async def sse_events(url: str, body: dict[str, Any], *, timeout_s: float) -> list[str]:
    """The data payloads of a streaming chat, until the stream ends or timeout_s passes."""
    out: list[str] = []
    payload = {**body, "stream": True}
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json=payload) as r,
    ):
        assert r.status == 200
        try:
            async with asyncio.timeout(timeout_s):
                async for raw in r.content:
                    line = raw.decode().strip()
                    if line.startswith("data: "):
                        out.append(line[6:])
        except TimeoutError:
            out.append("<timeout>")
    return out


class TestFaults:
    """Injected faults in a real sim-engine."""

    async def test_fail_rate_one(self) -> None:
        """--fail-rate 1.0 answers 500 with vLLM's body, before any byte of a response."""
        with start_program(
            ["sim-engine", "--port", "0", "--model", "m", "--fail-rate", "1.0"]
        ) as prog:
            status, body = await post(
                prog.url, "/v1/chat/completions", {"model": "m", "messages": USER}
            )
        assert (status, body["error"]["type"], body["error"]["code"]) == (
            500,
            "InternalServerError",
            500,
        )

    async def test_crash_after_requests(self) -> None:
        """--crash-after-requests 2: two requests served, the third kills the process."""
        with start_program(fast_engine("--crash-after-requests", "2")) as prog:
            body = {"model": "m", "messages": USER, "max_tokens": 2}
            assert (await post(prog.url, "/v1/chat/completions", body))[0] == 200
            assert (await post(prog.url, "/v1/chat/completions", body))[0] == 200
            with pytest.raises(aiohttp.ClientError):
                await post(prog.url, "/v1/chat/completions", body)
            assert prog.proc.wait(timeout=10) == CRASH_EXIT_CODE

    async def test_faults_at_run_time(self, engine: Program) -> None:
        """POST /sim/faults from loopback turns failures on and off."""
        body = {"model": "m", "messages": USER, "max_tokens": 2}
        status, config = await post(engine.url, "/sim/faults", {"fail_rate": 1.0})
        assert (status, config["fail_rate"]) == (200, 1.0)
        failed = (await post(engine.url, "/v1/chat/completions", body))[0]
        await post(engine.url, "/sim/faults", {"fail_rate": 0.0})
        served = (await post(engine.url, "/v1/chat/completions", body))[0]
        assert (failed, served) == (500, 200)

    async def test_bad_fault_patch(self, engine: Program) -> None:
        """An invalid /sim/faults body is a 400 and changes nothing."""
        status, _ = await post(engine.url, "/sim/faults", {"fail_rate": 7})
        _, state = await post(engine.url, "/sim/faults", {})
        assert (status, state["fail_rate"]) == (400, 0.0)

    async def test_error_after_tokens(self) -> None:
        """error_after_tokens 3: three tokens, vLLM's error frame, then [DONE]."""
        with start_program(fast_engine("--error-after-tokens", "3")) as prog:
            events = await sse_events(
                prog.url, {"model": "m", "messages": USER, "max_tokens": 10}, timeout_s=10
            )
            async with aiohttp.ClientSession() as s, s.get(prog.url + "/metrics") as r:
                metrics = await r.text()
        chunks = [json.loads(e) for e in events[:-2]]
        contents = [c["choices"][0]["delta"].get("content") for c in chunks]
        assert (contents[0], len([c for c in contents if c])) == ("", 3)
        assert json.loads(events[-2])["error"]["code"] == 500
        assert events[-1] == "[DONE]"
        assert 'finished_reason="error",model_name="m"} 1.0' in metrics

    async def test_stall_after_tokens(self) -> None:
        """stall_after_tokens 2: two tokens, then silence; the engine drops the request."""
        with start_program(fast_engine("--stall-after-tokens", "2")) as prog:
            events = await sse_events(
                prog.url, {"model": "m", "messages": USER, "max_tokens": 10}, timeout_s=1.0
            )
            async with aiohttp.ClientSession() as s, s.get(prog.url + "/sim/state") as r:
                state = await r.json()
        tokens = [e for e in events[:-1] if json.loads(e)["choices"][0]["delta"].get("content")]
        assert (len(tokens), events[-1]) == (2, "<timeout>")
        assert (state["running"], state["waiting"]) == (0, 0)


class TestEngineLoopDies:
    """A dead engine loop ends requests, fails health and exits."""

    async def test_requests_end_health_503_and_exit(self) -> None:
        """When the engine loop raises, open requests get vLLM's 500 (an error frame
        on a stream) instead of hanging, /health answers 503, the traceback is
        logged, and the process exits non-zero."""
        with start_program(fast_engine()) as prog:
            status, _ = await post(prog.url, "/sim/faults", {"loop_error_after_steps": 5})
            assert status == 200
            body = {"model": "m", "messages": USER, "max_tokens": 40, "ignore_eos": True}
            events, (status, doc) = await asyncio.wait_for(
                asyncio.gather(
                    sse_events(prog.url, body, timeout_s=15),
                    post(prog.url, "/v1/chat/completions", body),
                ),
                timeout=20,
            )
            async with aiohttp.ClientSession() as s, s.get(prog.url + "/health") as r:
                health = r.status
            code = await asyncio.to_thread(prog.proc.wait, 15)
            log = prog.log_text()
        assert events[-1] == "[DONE]", events
        assert json.loads(events[-2])["error"]["code"] == 500, events
        assert status == 500
        assert doc["error"]["code"] == 500
        assert doc["error"]["message"]
        assert health == 503
        assert code == ENGINE_DEAD_EXIT_CODE
        assert "Traceback" in log
        assert "loop_error_after_steps" in log
