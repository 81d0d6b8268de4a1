"""The Responses and Anthropic Messages APIs through a real router, with the official SDKs.

Two sim-engines behind one router with an API key; the `openai` and
`anthropic` packages, sync and async, streaming and not, and their errors as
each SDK raises them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseFunctionToolCall, ResponseStreamEvent
from pydantic import BaseModel

from llmgw.router.request.auth import hash_key
from llmgw.testing import Program
from tests.promtool import samples

from .router_fixtures import MODEL, base_config, endpoint_entries, router, sim_engines
from .test_router_observability import scrape
from .test_router_stream_faults import set_faults

pytestmark = pytest.mark.timeout(120)

KEY = "sk-apis-123"
SYSTEM = "You are a terse assistant for the api tests."


class City(BaseModel):
    name: str
    people: int


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Program, list[Program]]]:
    """Two fast sim-engines behind one router with one key and a model with no replica."""
    log_dir = tmp_path_factory.mktemp("router-apis-sdk")
    with sim_engines(log_dir, [100.0, 100.0]) as engines:
        cfg = base_config(
            endpoints=endpoint_entries(engines),
            models=["cold"],
            api_keys=[{"name": "tests", "sha256": hash_key(KEY)}],
            hold_timeout_s=0.5,
            stream_idle_timeout_s=1.0,
        )
        with router(log_dir, cfg) as r:
            yield r, engines


@pytest.fixture
def url(fleet: tuple[Program, list[Program]]) -> str:
    return fleet[0].url


def tokens(url: str, kind: str) -> float:
    got = samples(scrape(url))
    return sum(v for k, v in got.items() if k.startswith(f"llmgw_router_{kind}_tokens_total{{"))


class TestResponsesSdk:
    """The Responses API through the router with the OpenAI SDK."""

    def test_sync_whole(self, url: str) -> None:
        """responses.create answers the text and Responses usage, counted by the router."""
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            before = tokens(url, "prompt")
            got = client.responses.create(
                model=MODEL, instructions=SYSTEM, input="hello there", max_output_tokens=4
            )
            assert got.object == "response"
            assert got.output_text
            assert got.usage is not None
            assert got.usage.output_tokens > 0
            assert tokens(url, "prompt") - before == got.usage.input_tokens

    def test_sync_stream(self, url: str) -> None:
        """A streamed Responses request yields deltas and ends with response.completed."""
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            stream = client.responses.create(
                model=MODEL, input="stream me", max_output_tokens=8, stream=True
            )
            events = list(stream)
            kinds = [e.type for e in events]
            assert kinds[0] == "response.created"
            assert "response.output_text.delta" in kinds
            assert kinds[-1] in ("response.completed", "response.incomplete")

    async def test_async_whole_and_stream(self, url: str) -> None:
        """The async client gets the same, whole and streamed."""
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        whole = await client.responses.create(model=MODEL, input="async", max_output_tokens=3)
        assert whole.output_text
        stream = await client.responses.create(
            model=MODEL, input="async stream", max_output_tokens=3, stream=True
        )
        kinds = [e.type async for e in stream]
        assert kinds[-1] in ("response.completed", "response.incomplete")
        await client.close()

    def test_stream_helper_final_response_of_a_cut_reply(self, url: str) -> None:
        """A stream cut by max_output_tokens ends with response.completed, as vLLM's, so
        the SDK's responses.stream() gives its final response, status "incomplete"."""
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            with client.responses.stream(model=MODEL, input="cut me", max_output_tokens=3) as s:
                kinds = [e.type for e in s]
                final = s.get_final_response()
            assert kinds[-1] == "response.completed"
            assert final.status == "incomplete"
            assert final.incomplete_details is not None
            assert final.incomplete_details.reason == "max_output_tokens"
            assert final.output_text

    def test_json_schema_text_format(self, url: str) -> None:
        """text.format json_schema answers JSON that fits the schema, as vLLM's structured
        output: responses.parse reads it into the model, and a stream writes it too."""
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            got = client.responses.parse(model=MODEL, input="a city", text_format=City)
            assert isinstance(got.output_parsed, City)
            schema = {
                "type": "object",
                "properties": {"name": {"type": "string"}, "people": {"type": "integer"}},
                "required": ["name", "people"],
                "additionalProperties": False,
            }
            fmt: Any = {"format": {"type": "json_schema", "name": "city", "schema": schema}}
            with client.responses.stream(model=MODEL, input="a city", text=fmt) as s:
                final = s.get_final_response()
            assert set(json.loads(final.output_text)) == {"name", "people"}

    def test_request_fields_echoed(self, url: str) -> None:
        """The response echoes the request's instructions, metadata, temperature, top_p and
        tools, as vLLM's, whole and in a stream's response.created."""
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            tool: Any = {"type": "function", "name": "f", "parameters": {"type": "object"}}
            asked: Any = {
                "model": MODEL,
                "input": "echo",
                "instructions": SYSTEM,
                "metadata": {"job": "42"},
                "temperature": 0.25,
                "top_p": 0.5,
                "tools": [tool],
                "max_output_tokens": 2,
            }
            whole = client.responses.create(**asked)
            with client.responses.stream(**asked) as s:
                created = next(e for e in s if e.type == "response.created").response
            for got in (whole, created):
                assert got.instructions == SYSTEM
                assert got.metadata == {"job": "42"}
                assert (got.temperature, got.top_p) == (0.25, 0.5)
                assert [t.name for t in got.tools if t.type == "function"] == ["f"]

    def test_previous_response_id_refused(self, url: str) -> None:
        """previous_response_id is refused with a 400 that names the parameter."""
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            with pytest.raises(openai.BadRequestError) as info:
                client.responses.create(model=MODEL, input="more", previous_response_id="resp_1")
            assert info.value.param == "previous_response_id"

    def test_unknown_model_and_bad_key(self, url: str) -> None:
        """An unknown model is OpenAI's 404, a wrong key its 401."""
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            with pytest.raises(openai.NotFoundError):
                client.responses.create(model="nope", input="x")
            with (
                openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0) as bad,
                pytest.raises(openai.AuthenticationError),
            ):
                bad.responses.create(model=MODEL, input="x")


class TestResponsesSdkContract:
    """Responses answers fit the openai package's own types, strictly validated, and its
    fields the gateway cannot honour are refused."""

    def test_usage_validates_whole_and_streamed(self, url: str) -> None:
        """A whole response and a stream's response.completed pass the package's
        model_validate: usage has input_tokens_details.cache_write_tokens, a required int."""
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            raw = client.responses.with_raw_response.create(
                model=MODEL, input="strict", max_output_tokens=3
            )
            whole = Response.model_validate(json.loads(raw.http_response.text))
            with client.responses.stream(model=MODEL, input="strict", max_output_tokens=3) as s:
                final = s.get_final_response()
        streamed = Response.model_validate(final.model_dump(mode="json", exclude_unset=True))
        for got in (whole, streamed):
            assert got.usage is not None
            assert got.usage.input_tokens_details.cache_write_tokens == 0

    def test_json_object_text_format(self, url: str) -> None:
        """text.format json_object answers a JSON object, as chat's response_format does."""
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            got = client.responses.create(
                model=MODEL, input="json please", text={"format": {"type": "json_object"}}
            )
        assert isinstance(json.loads(got.output_text), dict)

    def test_conversation_refused(self, url: str) -> None:
        """A `conversation` is refused with a 400 naming it, as previous_response_id is:
        an engine would answer without the conversation's turns."""
        with (
            openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client,
            pytest.raises(openai.BadRequestError) as info,
        ):
            client.responses.create(model=MODEL, input="more", conversation="conv_1")
        assert info.value.param == "conversation"


FUNCTION: Any = {
    "type": "function",
    "name": "lookup",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
    "strict": True,
}


class TestResponsesFunctionCalls:
    """Function tools on the Responses API answer function_call items, as OpenAI's do."""

    def test_required_answers_a_function_call(self, url: str) -> None:
        """tool_choice "required" answers one function_call whose arguments hold the
        required properties, not a message."""
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            got = client.responses.create(
                model=MODEL, input="weather", tools=[FUNCTION], tool_choice="required"
            )
        (call,) = got.output
        assert isinstance(call, ResponseFunctionToolCall)
        assert (call.name, call.status) == ("lookup", "completed")
        assert call.call_id
        assert set(json.loads(call.arguments)) == {"city", "days"}

    def test_named_streamed_with_the_helper(self, url: str) -> None:
        """A named function streams its arguments as function_call_arguments events, which
        each validate as the package's event types; the helper parses the final call."""
        events = pydantic.TypeAdapter(ResponseStreamEvent)
        choice: Any = {"type": "function", "name": "lookup"}
        with (
            openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client,
            client.responses.stream(
                model=MODEL, input="weather", tools=[FUNCTION], tool_choice=choice
            ) as s,
        ):
            seen = list(s)
            final = s.get_final_response()
        for e in seen:
            events.validate_python(e.model_dump(mode="json", exclude_unset=True))
        kinds = [e.type for e in seen]
        assert kinds[2] == "response.output_item.added"
        assert "response.function_call_arguments.delta" in kinds
        assert "response.content_part.added" not in kinds
        assert kinds[-3:] == [
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        (call,) = final.output
        assert call.type == "function_call"
        assert call.parsed_arguments == json.loads(call.arguments)
        assert set(json.loads(call.arguments)) == {"city", "days"}

    def test_auto_answers_words(self, url: str) -> None:
        """tools with the default tool_choice "auto" answer a message."""
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            got = client.responses.create(
                model=MODEL, input="chat", tools=[FUNCTION], max_output_tokens=3
            )
        assert [o.type for o in got.output] == ["message"]


class TestMessagesSdk:
    """The Messages API through the router with the Anthropic SDK."""

    def test_sync_whole_with_x_api_key(self, url: str) -> None:
        """messages.create (the key in x-api-key) answers Anthropic's message and usage."""
        with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as client:
            before = tokens(url, "completion")
            msg = client.messages.create(
                model=MODEL,
                max_tokens=5,
                system=SYSTEM,
                messages=[{"role": "user", "content": "hello"}],
            )
            assert msg.type == "message"
            assert msg.content[0].type == "text"
            assert msg.usage.output_tokens == 5
            assert msg.stop_reason == "max_tokens"
            assert tokens(url, "completion") - before == 5

    def test_sync_stream_with_bearer(self, url: str) -> None:
        """A stream (the key as a bearer token) relays message_start … message_stop."""
        with anthropic.Anthropic(base_url=url, auth_token=KEY, max_retries=0) as client:
            with client.messages.stream(
                model=MODEL, max_tokens=6, messages=[{"role": "user", "content": "stream"}]
            ) as stream:
                text = "".join(stream.text_stream)
                final = stream.get_final_message()
            assert text
            assert final.usage.output_tokens == 6

    async def test_async_whole_and_stream(self, url: str) -> None:
        """The async client gets the same, whole and as raw events."""
        client = anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0)
        msg = await client.messages.create(
            model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "async"}]
        )
        assert msg.usage.output_tokens == 3
        stream = await client.messages.create(
            model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "ev"}], stream=True
        )
        kinds = [e.type async for e in stream]
        assert kinds[0] == "message_start"
        assert kinds[-1] == "message_stop"
        await client.close()

    def test_stop_sequences_end_the_reply(self, url: str) -> None:
        """stop_sequences end the reply before the first one, whole and streamed, with
        stop_reason end_turn (vLLM's for a stop string)."""
        with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as client:
            user: list[anthropic.types.MessageParam] = [{"role": "user", "content": "stop early"}]
            msg = client.messages.create(
                model=MODEL, max_tokens=40, messages=user, stop_sequences=["e"]
            )
            assert msg.content[0].type == "text"
            assert "e" not in msg.content[0].text
            assert msg.stop_reason == "end_turn"
            assert msg.usage.output_tokens < 40
            with client.messages.stream(
                model=MODEL, max_tokens=40, messages=user, stop_sequences=["e"]
            ) as stream:
                text = "".join(stream.text_stream)
                final = stream.get_final_message()
            assert "e" not in text
            assert final.stop_reason == "end_turn"

    def test_count_tokens(self, url: str) -> None:
        """messages.count_tokens reaches the engine's /v1/messages/count_tokens."""
        with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as client:
            got = client.messages.count_tokens(
                model=MODEL, system=SYSTEM, messages=[{"role": "user", "content": "count me"}]
            )
            assert got.input_tokens > 0
            with pytest.raises(anthropic.NotFoundError):
                client.messages.count_tokens(
                    model="nope", messages=[{"role": "user", "content": "x"}]
                )

    def test_errors_in_anthropic_shape(self, url: str) -> None:
        """The router's own refusals and the engine's reach the SDK as Anthropic's errors."""
        with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as client:
            user = [{"role": "user", "content": "x"}]
            with pytest.raises(anthropic.NotFoundError) as nf:
                client.messages.create(model="nope", max_tokens=2, messages=user)  # type: ignore[arg-type]
            assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
            with anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0) as bad:
                with pytest.raises(anthropic.AuthenticationError) as au:
                    bad.messages.create(model=MODEL, max_tokens=2, messages=user)  # type: ignore[arg-type]
                assert au.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
                with pytest.raises(anthropic.InternalServerError) as cold:
                    client.messages.create(model="cold", max_tokens=2, messages=user)  # type: ignore[arg-type]
                assert cold.value.status_code == 503
                assert cold.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
                with pytest.raises(anthropic.BadRequestError) as br:
                    client.messages.create(model=MODEL, max_tokens=0, messages=user)  # type: ignore[arg-type]
                assert br.value.body["type"] == "error"  # type: ignore[index]


WEATHER: anthropic.types.ToolParam = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
ASK: list[anthropic.types.MessageParam] = [{"role": "user", "content": "weather in Oslo?"}]


class TestMessagesToolUse:
    """tools and tool_choice on the Messages API answer tool_use blocks, as vLLM's."""

    def test_any_answers_a_tool_use(self, url: str) -> None:
        """tool_choice "any" answers a tool_use block whose input has the required
        properties; stop_reason tool_use."""
        with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as client:
            msg = client.messages.create(
                model=MODEL,
                max_tokens=200,
                messages=ASK,
                tools=[WEATHER],
                tool_choice={"type": "any"},
            )
            (block,) = msg.content
            assert block.type == "tool_use"
            assert block.name == "get_weather"
            assert isinstance(block.input, dict)
            assert isinstance(block.input["city"], str)
            assert block.id
            assert msg.stop_reason == "tool_use"

    def test_named_tool_streamed(self, url: str) -> None:
        """A named tool is called in a stream: a tool_use block its input_json_delta
        events fill, which the SDK's final message parses; stop_reason end_turn (vLLM's
        for a named tool)."""
        with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as client:
            with client.messages.stream(
                model=MODEL,
                max_tokens=200,
                messages=ASK,
                tools=[WEATHER],
                tool_choice={"type": "tool", "name": "get_weather"},
            ) as stream:
                final = stream.get_final_message()
            (block,) = final.content
            assert block.type == "tool_use"
            assert block.name == "get_weather"
            assert isinstance(block.input, dict)
            assert "city" in block.input
            assert final.stop_reason == "end_turn"

    def test_auto_answers_words(self, url: str) -> None:
        """tools without tool_choice (auto) answer text: the model chose not to call."""
        with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as client:
            msg = client.messages.create(model=MODEL, max_tokens=3, messages=ASK, tools=[WEATHER])
            assert msg.content[0].type == "text"

    def test_refusals(self, url: str) -> None:
        """A tool_choice naming no tool, naming one not in tools, or without tools, and a
        tool without an input_schema, is vLLM's 400, in Anthropic's shape."""
        with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as client:
            bad: list[dict[str, Any]] = [
                {"tools": [WEATHER], "tool_choice": {"type": "tool"}},
                {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
                {"tool_choice": {"type": "any"}},
                {"tools": [{"name": "get_weather"}], "tool_choice": {"type": "any"}},
            ]
            for extra in bad:
                with pytest.raises(anthropic.BadRequestError) as info:
                    client.messages.create(model=MODEL, max_tokens=9, messages=ASK, **extra)
                assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


class TestResponsesBrokenStream:
    """A stalled Responses stream ends with an error event."""

    async def test_error_event_when_the_engine_stalls(
        self, url: str, fleet: tuple[Program, list[Program]]
    ) -> None:
        """An engine that goes silent mid-stream: the Responses client gets an
        `event: error` it raises, not a hang."""
        engines = fleet[1]
        for e in engines:
            await set_faults(e.url, stall_after_tokens=2)
        try:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
            stream = await client.responses.create(
                model=MODEL, input="s", max_output_tokens=20, stream=True
            )
            with pytest.raises(openai.APIError) as info:
                async for _ in stream:
                    pass
            assert "no data" in str(info.value)
            await client.close()
        finally:
            await asyncio.gather(*(set_faults(e.url, stall_after_tokens=None) for e in engines))


class TestMessagesBrokenStream:
    """A stalled Messages stream ends with an error event."""

    async def test_error_event_when_the_engine_stalls(
        self, url: str, fleet: tuple[Program, list[Program]]
    ) -> None:
        """An engine that goes silent mid-stream: the client gets Anthropic's `event: error`,
        which the SDK raises."""
        engines = fleet[1]
        for e in engines:
            await set_faults(e.url, stall_after_tokens=2)
        try:
            client = anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0)
            stream = await client.messages.create(
                model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "s"}], stream=True
            )
            with pytest.raises(anthropic.APIStatusError) as info:
                async for _ in stream:
                    pass
            assert "no data" in str(info.value)
            await client.close()
        finally:
            await asyncio.gather(*(set_faults(e.url, stall_after_tokens=None) for e in engines))
