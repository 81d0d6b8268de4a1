"""What one engine answer's usage may count: each figure held to what its request allows."""

from __future__ import annotations

from typing import Any

import msgspec

from llmgw.router.request.usagebound import (
    DEFAULT_COMPLETION_TOKENS,
    LIMIT_CEILING_TOKENS,
    MAX_CHOICES,
    PROMPT_FLOOR_TOKENS,
    bounded,
    completion_bound,
    completion_bound_of,
)
from llmgw.testing.forwarder import reply
from llmgw.wire.answerusage import Usage
from tests.unit.router_world import World


class TestBounds:
    """The bounds come from the request: its body's size, its limit and its choices."""

    def test_a_given_limit_times_its_choices(self) -> None:
        """max_tokens 100 with n 3: 300 completion tokens at most."""
        assert completion_bound(100, 3) == 300

    def test_no_limit_is_the_default(self) -> None:
        """No limit, or one that is no positive int, counts as the documented default."""
        for limit in (None, 0, -5, "100", 1.5, True):
            assert completion_bound(limit, None) == DEFAULT_COMPLETION_TOKENS

    def test_limits_and_choices_have_ceilings(self) -> None:
        """A client's own 10**15 limit or 10**6 choices do not lift the bound for ever."""
        assert completion_bound(10**15, 10**6) == LIMIT_CEILING_TOKENS * MAX_CHOICES

    def test_each_api_names_its_limit(self) -> None:
        """Chat's max_completion_tokens first, then max_tokens, then Responses' own."""
        assert completion_bound_of({"max_completion_tokens": 7, "max_tokens": 9}) == 7
        assert completion_bound_of({"max_tokens": 9}) == 9
        assert completion_bound_of({"max_output_tokens": 11, "n": 2}) == 22

    def test_within_bounds_is_the_same_usage(self) -> None:
        """An honest answer is counted as the engine wrote it, no copy made."""
        usage = Usage(prompt=PROMPT_FLOOR_TOKENS, completion=50, cached=10, cached_reported=10)
        assert bounded(usage, body_bytes=100, completion_most=50) == (usage, 0)

    def test_each_count_is_cut_to_its_bound(self) -> None:
        """10**15 of each: the prompt to the body's bytes (past the floor), the
        completion to the limit, the cached tokens to the prompt; the rest is the cut."""
        big = 10**15
        usage = Usage(prompt=big, completion=big, cached=big, cached_reported=big)
        body = PROMPT_FLOOR_TOKENS + 5
        got, cut = bounded(usage, body_bytes=body, completion_most=64)
        assert got == Usage(prompt=body, completion=64, cached=body, cached_reported=body)
        assert cut == 2 * big - body - 64


class TestProxyCountsTheBound:
    """The proxy counts a lying engine's answer at its bound and says what it cut."""

    def test_a_claim_of_10_to_the_15_is_clipped_and_counted(self) -> None:
        """The model's token series get the bound; the clipped series gets the rest."""
        w = World('endpoints:\n  - {id: a, url: "http://10.0.0.1:8000", models: [m]}\n')
        usage = {"prompt_tokens": 10**15, "completion_tokens": 10**15}
        w.fake.script("a", reply(200, msgspec.json.encode({"usage": usage})))

        async def main() -> Any:
            return await w.send({"model": "m", "messages": [], "max_tokens": 16})

        assert w.run(main).status == 200
        lines = w.router.metrics.render().decode().splitlines()
        got = {
            line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if "{" in line
        }
        assert got["llmgw_router_prompt_tokens_total"] == PROMPT_FLOOR_TOKENS
        assert got["llmgw_router_completion_tokens_total"] == 16
        cut = 2 * 10**15 - PROMPT_FLOOR_TOKENS - 16
        assert got["llmgw_router_usage_clipped_tokens_total"] == cut


class TestBatchedPrompts:
    """A legacy completion's list of prompts is answered prompt by prompt, each counted."""

    def test_each_prompt_of_a_batch_has_its_limit(self) -> None:
        """Four prompts, max_tokens 100, n 2: 800 tokens; a token-id list is one prompt."""
        assert (
            completion_bound_of({"prompt": ["a", "b", "c", "d"], "max_tokens": 100, "n": 2}) == 800
        )
        assert completion_bound_of({"prompt": [[1, 2], [3]], "max_tokens": 100}) == 200
        assert completion_bound_of({"prompt": [1, 2, 3], "max_tokens": 100}) == 100
        assert completion_bound_of({"prompt": "a", "max_tokens": 100}) == 100

    def test_an_honest_batch_is_counted_whole(self) -> None:
        """Four prompts of max_tokens 16 answered with 64 tokens: 64 counted, none clipped."""
        w = World('endpoints:\n  - {id: a, url: "http://10.0.0.1:8000", models: [m]}\n')
        usage = {"prompt_tokens": 8, "completion_tokens": 64}
        w.fake.script("a", reply(200, msgspec.json.encode({"usage": usage})))
        body = {"model": "m", "prompt": ["a", "b", "c", "d"], "max_tokens": 16}

        async def main() -> Any:
            return await w.send(body, path="/v1/completions")

        assert w.run(main).status == 200
        text = w.router.metrics.render().decode()
        got = {
            line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if "{" in line
        }
        assert got["llmgw_router_completion_tokens_total"] == 64
        assert "llmgw_router_usage_clipped_tokens_total{" not in text
