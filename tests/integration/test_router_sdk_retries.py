"""The SDKs' own retries against the router's: `x-should-retry` says which of its error
answers a client's retry can help.

The `openai` and `anthropic` packages retry 408, 409, 429 and 5xx twice by default
unless the answer says `x-should-retry: false`. Two always-failing sim-engines serve
"f" behind a router that retries once itself; a healthy one serves "m"; "ghost" is
known with no replica. The router's access log counts each attempt that reached it.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import httpx2
import openai
import pytest

from llmgw.router.request.auth import hash_key
from llmgw.testing import Program

from .router_fixtures import base_config, router, sim_engines
from .test_router_sdk_machinery import attempts, settled
from .test_router_stream_faults import set_faults

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

OPEN = "sk-sdk-retries-open"
PACED = "sk-sdk-retries-paced"
# The paced key's requests a minute: its bucket refills one a second, so a 429 asks
# for `Retry-After: 1` and the retry after it is admitted.
RPM = 60


@dataclass
class Fleet:
    router: Program


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two failing engines for "f", a good one for "m", "ghost" with none; a key without
    limits and one of RPM requests a minute."""
    log_dir = tmp_path_factory.mktemp("router-sdk-retries")
    with (
        sim_engines(log_dir, [200.0, 200.0], model="f") as faulty,
        sim_engines(log_dir, [200.0], model="m") as good,
    ):
        for engine in faulty:
            asyncio.run(set_faults(engine.url, fail_rate=1.0))
        cfg = base_config(
            endpoints=[
                {"id": "f0", "url": faulty[0].url, "models": ["f"]},
                {"id": "f1", "url": faulty[1].url, "models": ["f"]},
                {"id": "good", "url": good[0].url, "models": ["m"]},
            ],
            models=["ghost"],
            hold_timeout_s=1.0,
            max_retries=1,
            # Breakers that stay closed: each request meets both failing replicas.
            breaker={"failure_threshold": 1000},
            api_keys=[
                {"name": "open", "sha256": hash_key(OPEN)},
                {"name": "paced", "sha256": hash_key(PACED), "rpm": RPM},
            ],
            access_log=True,
        )
        with router(log_dir, cfg) as r:
            yield Fleet(r)


def retries_total(r: Program) -> float:
    """llmgw_router_retries_total over every series: the router's own retries."""
    with urllib.request.urlopen(r.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    prefix = "llmgw_router_retries_total{"
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(prefix))


MSGS: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


class TestFalse:
    """Where the router retried or waited for the client, the SDKs make one attempt."""

    def test_openai_raises_after_the_router_s_own_retry(self, fleet: Fleet) -> None:
        """Both replicas answered 500 (the router tried each): the openai package
        (max_retries=2) raises after its one request, not three."""
        r = fleet.router
        before, retried = len(settled(r, "open", 0)), retries_total(r)
        with (
            openai.OpenAI(base_url=r.url + "/v1", api_key=OPEN, max_retries=2) as c,
            pytest.raises(openai.InternalServerError) as info,
        ):
            c.chat.completions.create(model="f", messages=MSGS, max_tokens=2)
        assert info.value.response.headers["x-should-retry"] == "false"
        assert settled(r, "open", before + 1)[before:] == [500]
        assert retries_total(r) == retried + 1

    def test_anthropic_raises_after_the_router_s_own_retry(self, fleet: Fleet) -> None:
        """The same on /v1/messages with the anthropic package."""
        r = fleet.router
        before = len(settled(r, "open", 0))
        with (
            anthropic.Anthropic(base_url=r.url, api_key=OPEN, max_retries=2) as c,
            pytest.raises(anthropic.InternalServerError) as info,
        ):
            c.messages.create(model="f", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert info.value.response.headers["x-should-retry"] == "false"
        assert settled(r, "open", before + 1)[before:] == [500]

    def test_a_request_held_to_its_deadline_is_not_held_again(self, fleet: Fleet) -> None:
        """ "ghost" has no replica: held hold_timeout_s (1 s), then 503 no_replica, once;
        the SDK's two retries would have held the call three times as long."""
        r = fleet.router
        before = len(settled(r, "open", 0))
        start = time.monotonic()
        with (
            openai.OpenAI(base_url=r.url + "/v1", api_key=OPEN, max_retries=2) as c,
            pytest.raises(openai.InternalServerError) as info,
        ):
            c.chat.completions.create(model="ghost", messages=MSGS, max_tokens=2)
        assert info.value.code == "no_replica"
        assert settled(r, "open", before + 1)[before:] == [503]
        assert time.monotonic() - start < 2.5


def spend_until_refused(c: openai.OpenAI) -> httpx2.Response:
    """Requests of the paced key (`c` without retries) until one is refused: its answer."""
    for _ in range(2 * RPM):
        try:
            c.chat.completions.create(model="m", messages=MSGS, max_tokens=1)
        except openai.RateLimitError as exc:
            return exc.response
    raise AssertionError(f"{2 * RPM} requests of a key of {RPM} a minute were all served")


class TestTrue:
    """A rate limit's short Retry-After is worth waiting: the SDKs retry it."""

    def test_openai_retries_a_rate_limit_after_retry_after(self, fleet: Fleet) -> None:
        """The paced key spent: 429 with `Retry-After: 1` and `x-should-retry: true`; the
        openai package waits and its retry is served."""
        r = fleet.router
        seen: list[int] = []
        with (
            openai.OpenAI(base_url=r.url + "/v1", api_key=PACED, max_retries=0) as spend,
            openai.OpenAI(base_url=r.url + "/v1", api_key=PACED, max_retries=2) as c,
        ):
            for _ in range(3):
                # Spend the bucket until it refuses, then ask at once with retries on: the
                # bucket may refill a request in between (once a second); then again.
                refused = spend_until_refused(spend)
                assert refused.headers["x-should-retry"] == "true"
                assert refused.headers["Retry-After"] == "1"
                before = len(attempts(r, "paced"))
                assert c.chat.completions.create(model="m", messages=MSGS, max_tokens=1).choices
                seen = settled(r, "paced", before + 2)[before:]
                if seen[0] == 429:
                    break
        assert seen == [429, 200]


class TestHeaderOnlyOnErrors:
    """A served answer carries no `x-should-retry`: the header costs only error answers."""

    def test_a_served_answer_has_none(self, fleet: Fleet) -> None:
        """200 from the good engine: no header."""
        with openai.OpenAI(base_url=fleet.router.url + "/v1", api_key=OPEN, max_retries=0) as c:
            raw = c.chat.completions.with_raw_response.create(
                model="m", messages=MSGS, max_tokens=1
            )
        assert (raw.status_code, raw.headers.get("x-should-retry")) == (200, None)
