"""Sampling parameters out of vLLM's bounds, sent to a sim-engine through a real router.

vLLM's SamplingParams refuses each with a 400 (its message, and the parameter where
vLLM names one) on chat, completions and Responses, and in Anthropic's error shape on
Messages; each API refuses only the parameters its request carries.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from .router_fixtures import MODEL, base_config, endpoint_entries, router, sim_engines

pytestmark = pytest.mark.timeout(120)

HELLO = [{"role": "user", "content": "hello there"}]

# (parameter, value, vLLM's message, the param vLLM names)
BOUNDS: list[tuple[str, float, str, str | None]] = [
    ("temperature", -0.5, "temperature must be non-negative, got -0.5.", "temperature"),
    ("top_p", 0.0, "top_p must be in (0, 1], got 0.0.", "top_p"),
    ("top_p", 1.5, "top_p must be in (0, 1], got 1.5.", "top_p"),
    ("top_k", -2, "top_k must be 0 (disable), or at least 1, got -2.", None),
]
PENALTIES: list[tuple[str, float, str, str | None]] = [
    ("presence_penalty", 2.5, "presence_penalty must be in [-2, 2], got 2.5.", None),
    ("frequency_penalty", -3.0, "frequency_penalty must be in [-2, 2], got -3.0.", None),
    ("repetition_penalty", 0.0, "repetition_penalty must be greater than zero, got 0.0.", None),
    ("min_p", 1.5, "min_p must be in [0, 1], got 1.5.", None),
]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One fast sim-engine behind one router."""
    log_dir = tmp_path_factory.mktemp("sim-sdk-bounds")
    with (
        sim_engines(log_dir, [200.0]) as engines,
        router(log_dir, base_config(endpoints=endpoint_entries(engines))) as r,
    ):
        yield r.url


@pytest.fixture(scope="module")
def oai(url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def _refused(info: pytest.ExceptionInfo[openai.BadRequestError]) -> tuple[Any, ...]:
    body = info.value.body
    assert isinstance(body, dict)
    return (info.value.status_code, body["type"], body["message"], body["param"])


class TestChatAndCompletions:
    """Chat and completions refuse every bound vLLM's SamplingParams checks."""

    @pytest.mark.parametrize(("name", "value", "message", "param"), BOUNDS + PENALTIES)
    def test_chat(
        self, oai: openai.OpenAI, name: str, value: float, message: str, param: str | None
    ) -> None:
        """Chat answers vLLM's 400, its message and param."""
        with pytest.raises(openai.BadRequestError) as info:
            oai.chat.completions.create(
                model=MODEL, messages=HELLO, max_tokens=3, extra_body={name: value}
            )
        assert (400, "BadRequestError", message, param) == _refused(info)

    @pytest.mark.parametrize(("name", "value", "message", "param"), BOUNDS + PENALTIES)
    def test_completions(
        self, oai: openai.OpenAI, name: str, value: float, message: str, param: str | None
    ) -> None:
        """Completions answer vLLM's 400, its message and param."""
        with pytest.raises(openai.BadRequestError) as info:
            oai.completions.create(model=MODEL, prompt="x", max_tokens=3, extra_body={name: value})
        assert (400, "BadRequestError", message, param) == _refused(info)

    def test_bounds_themselves_pass(self, oai: openai.OpenAI) -> None:
        """The edges vLLM accepts are answered."""
        got = oai.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=3,
            temperature=0.0,
            top_p=1.0,
            presence_penalty=-2.0,
            frequency_penalty=2.0,
            extra_body={"top_k": -1, "repetition_penalty": 0.01, "min_p": 1.0},
        )
        assert got.choices[0].finish_reason == "length"


class TestResponses:
    """Responses refuses vLLM's bounds on the parameters its request carries."""

    @pytest.mark.parametrize(("name", "value", "message", "param"), BOUNDS)
    def test_refused(
        self, oai: openai.OpenAI, name: str, value: float, message: str, param: str | None
    ) -> None:
        """Responses answers vLLM's 400, its message and param."""
        with pytest.raises(openai.BadRequestError) as info:
            oai.responses.create(
                model=MODEL, input="hi", max_output_tokens=3, extra_body={name: value}
            )
        assert (400, "BadRequestError", message, param) == _refused(info)

    def test_penalties_not_read(self, oai: openai.OpenAI) -> None:
        """A penalty Responses does not carry is ignored, as by vLLM."""
        got = oai.responses.create(
            model=MODEL, input="hi", max_output_tokens=3, extra_body={"presence_penalty": 9.0}
        )
        assert got.status == "incomplete"


class TestMessages:
    """Messages refuses vLLM's bounds in Anthropic's error shape."""

    @pytest.mark.parametrize(("name", "value", "message", "param"), BOUNDS)
    def test_refused(
        self, url: str, name: str, value: float, message: str, param: str | None
    ) -> None:
        """Messages answers a 400 invalid_request_error with vLLM's message."""
        with (
            anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0) as c,
            pytest.raises(anthropic.BadRequestError) as info,
        ):
            c.messages.create(model=MODEL, max_tokens=3, messages=HELLO, extra_body={name: value})  # type: ignore[list-item]
        body = info.value.body
        assert isinstance(body, dict)
        assert ("invalid_request_error", message) == (
            body["error"]["type"],
            body["error"]["message"],
        )
