"""The router's refusals quote a name the client sent only in part: a model name may be
as long as the body limit allows, and an error must not echo megabytes of it."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from llmgw.router.apis import anthropic
from llmgw.router.errors import FlowRefused, NoReplica
from llmgw.router.http.answers import Whole
from llmgw.router.request.refusals import (
    QUOTED_NAME_CHARS,
    flow_refused,
    model_not_found,
    quoted_name,
    unavailable,
)
from llmgw.router.request.tenants import Tenant, Tenants
from llmgw.runtime.clock import ManualClock
from llmgw.wire.keys import ClientKey

LONG = "m" * 300 + "x" * (1 << 20)


def message(resp: object) -> str:
    assert isinstance(resp, Whole)
    text = json.loads(resp.body)["error"]["message"]
    assert isinstance(text, str)
    return text


class TestQuotedName:
    """A name is quoted whole up to the cap, cut with an ellipsis past it."""

    def test_a_short_name_is_quoted_whole(self) -> None:
        """A name at the cap is kept as it is."""
        name = "n" * QUOTED_NAME_CHARS
        assert quoted_name(name) == name

    def test_a_long_name_is_cut(self) -> None:
        """A name past the cap keeps its first 256 characters and ends in an ellipsis."""
        assert QUOTED_NAME_CHARS == 256
        assert quoted_name(LONG) == "m" * 256 + "…"


class TestRefusals:
    """Every refusal that names a model quotes it through the one cap."""

    @pytest.mark.parametrize(
        "resp",
        [
            model_not_found(LONG),
            unavailable(NoReplica(LONG, "no endpoint list yet", retry_after_s=5)),
            flow_refused(
                FlowRefused(LONG, "queue full", status=429, code="flow_queue_full", retry_after_s=1)
            ),
        ],
        ids=["model_not_found", "unavailable", "flow_refused"],
    )
    def test_the_message_quotes_a_capped_name(self, resp: Whole) -> None:
        """The message holds the name's first 256 characters and an ellipsis, no more."""
        text = message(resp)
        assert "m" * 256 + "…" in text
        assert len(text) < 512

    def test_the_model_not_found_message_is_unchanged_for_a_real_name(self) -> None:
        """A name a client really uses is quoted whole, as OpenAI words it."""
        assert message(model_not_found("llama-8b")) == "The model `llama-8b` does not exist."

    def test_a_key_refused_a_model_quotes_it_capped(self) -> None:
        """403 model_not_allowed quotes the model through the same cap."""
        key = msgspec.convert({"name": "alice", "sha256": "0" * 64, "models": ["a"]}, ClientKey)
        text = message(Tenants(clock=ManualClock()).admit(Tenant(key), LONG, 100))
        assert "m" * 256 + "…" in text
        assert len(text) < 512


class TestAnthropicShape:
    """The Messages API's errors are the same refusals reshaped: they are capped too."""

    def test_model_not_found_on_messages_is_capped(self) -> None:
        """/v1/messages' 404 not_found_error carries the capped name."""
        got: Any = msgspec.json.decode(anthropic.reshape(404, model_not_found(LONG).body))
        assert got["error"]["type"] == "not_found_error"
        assert "m" * 256 + "…" in got["error"]["message"]
        assert len(got["error"]["message"]) < 512


class TestLongRetryAfter:
    """A refusal that asks for minutes tells the SDKs not to sleep through them on their own."""

    def test_a_wait_of_minutes_is_not_retried_by_the_sdks(self) -> None:
        """The anthropic package sleeps whatever Retry-After says before each of its two
        retries: 300 s of an unplaceable model would hold a call for ten minutes."""
        resp = unavailable(NoReplica("m", "it cannot be placed", retry_after_s=300))
        assert resp.header("Retry-After") == "300"
        assert resp.header("x-should-retry") == "false"

    def test_a_wait_of_seconds_is_left_to_the_sdks(self) -> None:
        """Up to a minute, the SDKs' own retry after Retry-After is what the client wants."""
        for seconds in (1, 5, 60):
            resp = unavailable(NoReplica("m", "busy", retry_after_s=seconds))
            assert resp.header("x-should-retry") == "true"
        refused = flow_refused(
            FlowRefused("m", "full", status=429, code="flow_queue_full", retry_after_s=60)
        )
        assert refused.header("x-should-retry") == "true"
