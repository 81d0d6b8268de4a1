"""Counting tokens costs a key no tokens: /tokenize, /detokenize and Anthropic's
count_tokens count against its requests per minute, never its tokens per minute or its
budget (the engine generates nothing for them).

One sim-engine behind a router with file keys; the key's `x-ratelimit-remaining-tokens`
and its budget's refusal say what each request cost.
"""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from llmgw.router.request.auth import hash_key
from llmgw.testing import Program

from .router_fixtures import base_config, post, router, sim_engines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LIMITED = "sk-free-limited"
BUDGETED = "sk-free-budgeted"
# A body of about 2,000 tokens by the router's estimate (bytes / 4).
WORDS = "word " * 1600


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Program]:
    """A router with a key of 10,000 tokens a minute and a key of a 3,000-token budget."""
    log_dir = tmp_path_factory.mktemp("router-free-apis")
    with sim_engines(log_dir, [200.0], model="m") as engines:
        cfg = base_config(
            endpoints=[{"id": "e", "url": engines[0].url, "models": ["m"]}],
            api_keys=[
                {"name": "limited", "sha256": hash_key(LIMITED), "tpm": 10_000, "rpm": 1000},
                {
                    "name": "budgeted",
                    "sha256": hash_key(BUDGETED),
                    "budget": {"tokens": 3000, "per": "day"},
                },
            ],
        )
        with router(log_dir, cfg) as r:
            yield r


BODIES = {
    "/tokenize": {"model": "m", "prompt": WORDS},
    "/v1/messages/count_tokens": {
        "model": "m",
        "messages": [{"role": "user", "content": WORDS}],
    },
}


class TestCountingIsFree:
    """A request that only counts tokens leaves the key's tokens and budget whole."""

    @pytest.mark.parametrize("path", sorted(BODIES))
    async def test_tokens_per_minute_are_not_spent(self, fleet: Program, path: str) -> None:
        """Ten counts of a 2,000-token body leave a 10,000-token minute as it was."""
        auth = {"Authorization": f"Bearer {LIMITED}", "x-api-key": LIMITED}
        async with aiohttp.ClientSession() as session:
            left = []
            for _ in range(10):
                got = await post(session, fleet.url, BODIES[path], path=path, headers=auth)
                assert got.status == 200, got.body[:300]
                left.append(int(got.headers["x-ratelimit-remaining-tokens"]))
        assert min(left) >= 9_900, left

    async def test_a_budget_is_not_spent(self, fleet: Program) -> None:
        """Counting a 2,000-token body five times leaves a 3,000-token budget for a chat."""
        auth = {"Authorization": f"Bearer {BUDGETED}"}
        async with aiohttp.ClientSession() as session:
            for _ in range(5):
                got = await post(
                    session, fleet.url, BODIES["/tokenize"], path="/tokenize", headers=auth
                )
                assert got.status == 200, got.body[:300]
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            got = await post(session, fleet.url, chat, headers=auth)
        assert got.status == 200, got.body[:300]
