"""The SDKs' own machinery against the router: what their retries retry, what a
retried request costs its key, and the request ids they read.

Both the `openai` and the `anthropic` package retry 408, 409, 429 and 5xx answers on
their own (twice by default) unless the answer says `x-should-retry: false`. A sim-engine
per test subject, one router with file keys and its access log, which counts each
attempt that reached it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import openai
import pytest

from llmgw.router.request.auth import hash_key
from llmgw.testing import Program

from .router_fixtures import base_config, router, sim_engines
from .test_router_stream_faults import set_faults

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SPENT = "sk-retries-spent"
BUDGETED = "sk-retries-budgeted"
OPEN = "sk-retries-open"
# Each attempt's body is about this many tokens by the router's estimate (bytes / 4).
ESTIMATE = 120
WORDS = "word " * (ESTIMATE * 4 // 5)


@dataclass
class Fleet:
    router: Program
    # Serves "m" and always answers well.
    good: Program
    # Serves "f": its faults are set by the test that uses it.
    faulty: Program


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two sim-engines behind a router with a key without limits, a key of a one-token
    budget and a key with room for two requests' estimates."""
    log_dir = tmp_path_factory.mktemp("router-sdk-machinery")
    with (
        sim_engines(log_dir, [200.0], model="m") as good,
        sim_engines(log_dir, [200.0], model="f") as faulty,
    ):
        cfg = base_config(
            endpoints=[
                {"id": "good", "url": good[0].url, "models": ["m"]},
                {"id": "faulty", "url": faulty[0].url, "models": ["f"]},
            ],
            api_keys=[
                {"name": "open", "sha256": hash_key(OPEN)},
                {"name": "spent", "sha256": hash_key(SPENT), "budget": {"tokens": 1, "per": "day"}},
                {
                    "name": "budgeted",
                    "sha256": hash_key(BUDGETED),
                    "budget": {"tokens": ESTIMATE * 5 // 2, "per": "day"},
                },
            ],
            access_log=True,
            # The router's own retries would hide the SDK's: one attempt per request.
            max_retries=0,
        )
        with router(log_dir, cfg) as r:
            yield Fleet(r, good[0], faulty[0])


def attempts(r: Program, key: str) -> list[int]:
    """The status of each request of the key `key` (its name) the router answered."""
    out = []
    for line in r.log_text().splitlines():
        if " llmgw.router.access " in line and line.endswith(f" key={key} team="):
            out.append(int(line.split(" status=", 1)[1].split(" ", 1)[0]))
    return out


def settled(r: Program, key: str, n: int) -> list[int]:
    """`attempts` once the router has logged `n` of them (the log line follows the answer)."""
    for _ in range(100):
        got = attempts(r, key)
        if len(got) >= n:
            return got
        asyncio.run(asyncio.sleep(0.02))
    return attempts(r, key)


class TestSpentBudget:
    """A key whose budget is spent is refused once, not three times: the SDKs do not retry it."""

    def test_openai_does_not_retry_insufficient_quota(self, fleet: Fleet) -> None:
        """The openai package (max_retries=2) raises insufficient_quota after one attempt."""
        with openai.OpenAI(base_url=fleet.router.url + "/v1", api_key=SPENT, max_retries=2) as c:
            msgs: list[openai.types.chat.ChatCompletionMessageParam] = [
                {"role": "user", "content": "hi"}
            ]
            before = len(settled(fleet.router, "spent", 0))
            if before == 0:
                # The first request spends the one-token budget.
                assert c.chat.completions.create(model="m", messages=msgs, max_tokens=2).choices
                before = 1
            with pytest.raises(openai.RateLimitError) as info:
                c.chat.completions.create(model="m", messages=msgs, max_tokens=2)
            assert info.value.code == "insufficient_quota"
            assert info.value.response.headers["x-should-retry"] == "false"
            assert settled(fleet.router, "spent", before + 1)[before:] == [429]

    def test_anthropic_does_not_retry_a_spent_budget(self, fleet: Fleet) -> None:
        """The anthropic package (max_retries=2) raises rate_limit_error after one attempt."""
        with anthropic.Anthropic(base_url=fleet.router.url, api_key=SPENT, max_retries=2) as c:
            before = len(settled(fleet.router, "spent", 0))
            if before == 0:
                assert c.messages.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                ).content
                before = 1
            with pytest.raises(anthropic.RateLimitError) as info:
                c.messages.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
            assert info.value.type == "rate_limit_error"
            assert info.value.response.headers["x-should-retry"] == "false"
            assert settled(fleet.router, "spent", before + 1)[before:] == [429]


class TestEngineErrorsCostNothing:
    """Attempts the engine answered with an error spend none of the key's budget."""

    def test_retried_500s_leave_the_budget_whole(self, fleet: Fleet) -> None:
        """Three attempts answered 500 (the SDK's two retries) would each have spent their
        estimate, 120 tokens of a 300-token budget, and refused the key's next request."""
        asyncio.run(set_faults(fleet.faulty.url, fail_rate=1.0))
        with openai.OpenAI(base_url=fleet.router.url + "/v1", api_key=BUDGETED, max_retries=2) as c:
            msgs: list[openai.types.chat.ChatCompletionMessageParam] = [
                {"role": "user", "content": WORDS}
            ]
            try:
                with pytest.raises(openai.InternalServerError):
                    c.chat.completions.create(model="f", messages=msgs, max_tokens=2)
                assert settled(fleet.router, "budgeted", 3) == [500, 500, 500]
            finally:
                asyncio.run(set_faults(fleet.faulty.url, fail_rate=0.0))
            got = c.chat.completions.create(model="f", messages=msgs, max_tokens=2)
            assert got.usage is not None
            assert got.usage.completion_tokens == 2


class TestAnthropicRequestId:
    """The anthropic package reads the request id from `request-id`, as Anthropic sends it."""

    def test_whole_stream_and_error_carry_it(self, fleet: Fleet) -> None:
        """A whole answer's, a stream's and an error's `request_id` is the router's
        x-request-id (the id of its access log line), not None."""
        with anthropic.Anthropic(base_url=fleet.router.url, api_key=OPEN, max_retries=0) as c:
            msgs: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]
            raw = c.messages.with_raw_response.create(model="m", messages=msgs, max_tokens=2)
            assert raw.request_id == raw.headers["x-request-id"]
            with c.messages.with_streaming_response.create(
                model="m", messages=msgs, max_tokens=2, stream=True
            ) as streamed:
                assert streamed.request_id == streamed.headers["x-request-id"]
            with pytest.raises(anthropic.NotFoundError) as info:
                c.messages.create(model="nobody", messages=msgs, max_tokens=2)
            assert info.value.request_id == info.value.response.headers["x-request-id"]
