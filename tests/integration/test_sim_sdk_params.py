"""Sampling parameters vLLM honours, asked of a sim-engine through a real router by the SDK.

Each test sends what an evaluation client or agent framework sends (logprobs,
echo, stop strings, batches of prompts, n) and reads the answer the way the
`openai` package parses vLLM's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from .router_fixtures import MODEL, base_config, endpoint_entries, router, sim_engines

pytestmark = pytest.mark.timeout(120)

HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One fast sim-engine behind one router."""
    log_dir = tmp_path_factory.mktemp("sim-sdk-params")
    with (
        sim_engines(log_dir, [200.0]) as engines,
        router(log_dir, base_config(endpoints=endpoint_entries(engines))) as r,
    ):
        try:
            yield r.url
        finally:
            while _clients:
                _clients.popitem()[1].close()


# One client per router for the module: a client per call left its sockets to the
# garbage collector, whose ResourceWarning failed whichever test it landed in.
_clients: dict[str, openai.OpenAI] = {}


def client(url: str) -> openai.OpenAI:
    if url not in _clients:
        _clients[url] = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    return _clients[url]


class TestLogprobs:
    """`logprobs` asked for are answered in vLLM's shapes, one entry per generated token."""

    def test_chat_whole(self, url: str) -> None:
        """A chat reply carries one logprob per token, each with top_logprobs alternatives."""
        got = client(url).chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=5, logprobs=True, top_logprobs=3
        )
        choice = got.choices[0]
        assert choice.logprobs is not None
        assert choice.logprobs.content is not None
        content = choice.logprobs.content
        assert got.usage is not None
        assert got.usage.completion_tokens == len(content)
        assert choice.message.content == "".join(t.token for t in content)
        for t in content:
            assert t.logprob <= 0.0
            assert t.bytes == list(t.token.encode())
            assert len(t.top_logprobs) == 3
            assert t.top_logprobs[0].token == t.token

    def test_chat_stream(self, url: str) -> None:
        """Each streamed content delta carries the logprobs of its own tokens."""
        stream = client(url).chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=4, logprobs=True, stream=True
        )
        text, tokens = "", ""
        for chunk in stream:
            for c in chunk.choices:
                if c.delta.content:
                    assert c.logprobs is not None
                    assert c.logprobs.content is not None
                    text += c.delta.content
                    tokens += "".join(t.token for t in c.logprobs.content)
        assert text
        assert text == tokens

    def test_completion(self, url: str) -> None:
        """A completion's logprobs list tokens, their logprobs, offsets and top alternatives."""
        got = client(url).completions.create(model=MODEL, prompt="once", max_tokens=4, logprobs=2)
        lp = got.choices[0].logprobs
        assert lp is not None
        assert lp.tokens is not None
        assert lp.token_logprobs is not None
        assert lp.text_offset is not None
        assert lp.top_logprobs is not None
        assert got.choices[0].text == "".join(lp.tokens)
        assert len(lp.token_logprobs) == len(lp.tokens) == 4
        assert lp.text_offset == [0, 4, 8, 12]
        assert all(len(top) == 2 for top in lp.top_logprobs)

    def test_not_asked_is_null(self, url: str) -> None:
        """Without logprobs the field stays null, as with vLLM."""
        got = client(url).chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        assert got.choices[0].logprobs is None

    def test_bad_values_are_400(self, url: str) -> None:
        """Negative logprobs, top_logprobs without logprobs, or past 20 are vLLM's 400s."""
        c = client(url)
        with pytest.raises(openai.BadRequestError):
            c.completions.create(model=MODEL, prompt="x", max_tokens=1, logprobs=-1)
        with pytest.raises(openai.BadRequestError):
            c.completions.create(model=MODEL, prompt="x", max_tokens=1, logprobs=21)
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1, top_logprobs=2)


class TestEcho:
    """Completions' `echo` writes the prompt before the reply, as vLLM does."""

    def test_echo_without_generation(self, url: str) -> None:
        """echo with max_tokens 0 (how harnesses score a text) answers the prompt and its
        logprobs, the first None."""
        prompt = "The capital of France is Paris"
        got = client(url).completions.create(
            model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1
        )
        choice = got.choices[0]
        assert choice.text == prompt
        lp = choice.logprobs
        assert lp is not None
        assert lp.tokens is not None
        assert lp.token_logprobs is not None
        assert "".join(lp.tokens) == prompt
        assert lp.token_logprobs[0] is None
        assert all(x is not None for x in lp.token_logprobs[1:])

    def test_echo_then_reply(self, url: str) -> None:
        """With tokens to generate, the text is the prompt followed by the reply."""
        got = client(url).completions.create(
            model=MODEL, prompt="count: ", max_tokens=3, echo=True, logprobs=0
        )
        text = got.choices[0].text
        assert text.startswith("count: ")
        assert len(text) == len("count: ") + 3 * 4
        lp = got.choices[0].logprobs
        assert lp is not None
        assert lp.text_offset is not None
        assert lp.text_offset[-1] == len(text) - 4

    def test_echo_streamed(self, url: str) -> None:
        """A stream's first text is the prompt."""
        with client(url).completions.create(
            model=MODEL, prompt="stream: ", max_tokens=2, echo=True, stream=True
        ) as stream:
            text = "".join(c.choices[0].text for c in stream if c.choices)
        assert text.startswith("stream: ")
        assert len(text) == len("stream: ") + 2 * 4

    def test_max_tokens_zero_without_echo_is_400(self, url: str) -> None:
        """Without echo, max_tokens 0 stays vLLM's 400."""
        with pytest.raises(openai.BadRequestError):
            client(url).completions.create(model=MODEL, prompt="x", max_tokens=0)


class TestBatchPrompts:
    """A completions `prompt` that is a batch answers one choice per prompt, as vLLM does."""

    def test_list_of_strings(self, url: str) -> None:
        """Three prompts give choices 0..2, usage summed over them."""
        prompts = ["one", "two two", "three three three"]
        got = client(url).completions.create(model=MODEL, prompt=prompts, max_tokens=3)
        assert [c.index for c in got.choices] == [0, 1, 2]
        assert all(len(c.text) == 3 * 4 for c in got.choices)
        assert got.usage is not None
        assert got.usage.completion_tokens == 9
        singles = [
            client(url).completions.create(model=MODEL, prompt=p, max_tokens=3) for p in prompts
        ]
        assert got.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles if s.usage)
        assert [c.text for c in got.choices] == [s.choices[0].text for s in singles]

    def test_list_of_token_id_lists_streamed(self, url: str) -> None:
        """Token-id prompts stream each choice's text under its own index, then usage."""
        with client(url).completions.create(
            model=MODEL,
            prompt=[[300, 301, 302], [400, 401]],
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
        ) as stream:
            chunks = list(stream)
        texts: dict[int, str] = {}
        finished: set[int] = set()
        for chunk in chunks:
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
                if c.finish_reason is not None:
                    finished.add(c.index)
        assert {i: len(t) for i, t in texts.items()} == {0: 8, 1: 8}
        assert finished == {0, 1}
        usage = chunks[-1].usage
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens) == (5, 4)


class TestStreamOptions:
    """`stream_options` as vLLM reads it: only with a stream, usage included once given."""

    def test_without_stream_is_400(self, url: str) -> None:
        """stream_options on a request that does not stream is vLLM's 400."""
        with pytest.raises(openai.BadRequestError) as exc:
            client(url).chat.completions.create(
                model=MODEL,
                messages=HELLO,
                max_tokens=2,
                stream_options={"include_usage": True},
            )
        assert "Stream options" in exc.value.message

    def test_given_empty_includes_usage(self, url: str) -> None:
        """include_usage defaults to true once stream_options is given, as vLLM's does."""
        with client(url).completions.create(
            model=MODEL, prompt="x", max_tokens=3, stream=True, stream_options={}
        ) as stream:
            chunks = list(stream)
        usage = chunks[-1].usage
        assert usage is not None
        assert usage.completion_tokens == 3

    def test_continuous_usage_alone(self, url: str) -> None:
        """continuous_usage_stats alone puts running usage on every chunk, then the total."""
        with client(url).chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=3,
            stream=True,
            stream_options={"continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        ) as stream:
            chunks = list(stream)
        assert all(c.usage is not None for c in chunks[1:])
        last = chunks[-1]
        assert (last.choices, last.usage and last.usage.completion_tokens) == ([], 3)


class TestN:
    """`n` > 1 answers n choices, the prompt counted once in usage, as vLLM does."""

    def test_chat_choices(self, url: str) -> None:
        """Three chat choices, indexed 0..2, their tokens summed; the prompt counted once."""
        c = client(url)
        one = c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, seed=7)
        got = c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, seed=7, n=3)
        assert [ch.index for ch in got.choices] == [0, 1, 2]
        assert got.choices[0].message.content == one.choices[0].message.content
        assert len({ch.message.content for ch in got.choices}) > 1
        assert (got.usage and one.usage) is not None
        assert got.usage.prompt_tokens == one.usage.prompt_tokens
        assert got.usage.completion_tokens == 12

    def test_chat_stream(self, url: str) -> None:
        """Each streamed choice opens with its own role chunk and ends with its finish reason."""
        with client(url).chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=3,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        ) as stream:
            chunks = list(stream)
        roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role]
        assert sorted(roles) == [0, 1]
        texts: dict[int, str] = {}
        finished = set()
        for chunk in chunks:
            for ch in chunk.choices:
                texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
                if ch.finish_reason:
                    finished.add(ch.index)
        assert ({i: len(t) for i, t in texts.items()}, finished) == ({0: 12, 1: 12}, {0, 1})
        usage = chunks[-1].usage
        assert usage is not None
        assert usage.completion_tokens == 6

    def test_completions_batch_times_n(self, url: str) -> None:
        """Two prompts with n=2 give choices 0..3, each prompt's tokens counted once."""
        c = client(url)
        got = c.completions.create(model=MODEL, prompt=["a", "bbbb cccc"], max_tokens=2, n=2)
        assert [ch.index for ch in got.choices] == [0, 1, 2, 3]
        singles = [
            c.completions.create(model=MODEL, prompt=p, max_tokens=2) for p in ["a", "bbbb cccc"]
        ]
        assert got.usage is not None
        assert got.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles if s.usage)
        assert got.usage.completion_tokens == 8

    def test_completions_stream(self, url: str) -> None:
        """A streamed completion with n=2 writes both choices' text under their indexes."""
        with client(url).completions.create(
            model=MODEL, prompt="go", max_tokens=2, n=2, stream=True
        ) as stream:
            texts: dict[int, str] = {}
            for chunk in stream:
                for ch in chunk.choices:
                    texts[ch.index] = texts.get(ch.index, "") + ch.text
        assert {i: len(t) for i, t in texts.items()} == {0: 8, 1: 8}

    def test_bad_n_is_400(self, url: str) -> None:
        """n below 1, or above 1 with greedy sampling, is vLLM's 400."""
        c = client(url)
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1, n=0)
        with pytest.raises(openai.BadRequestError) as exc:
            c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1, n=2, temperature=0)
        assert "greedy" in exc.value.message


class TestStop:
    """Stop strings end the reply before them, streamed and not, as vLLM's do."""

    def test_reply_ends_before_the_stop_string(self, url: str) -> None:
        """A stop string the reply would contain cuts it there, finish_reason stop."""
        c = client(url)
        full = c.completions.create(model=MODEL, prompt="words", max_tokens=40, seed=3)
        text = full.choices[0].text
        word = text.split()[5]
        at = text.index(word)
        got = c.completions.create(
            model=MODEL, prompt="words", max_tokens=40, seed=3, stop=["zzzz", word]
        )
        assert (got.choices[0].text, got.choices[0].finish_reason) == (text[:at], "stop")
        assert got.usage is not None
        assert got.usage.completion_tokens == len(text[: at + len(word)]) // 4 + 1

    def test_include_stop_str_in_output(self, url: str) -> None:
        """include_stop_str_in_output keeps the stop string and nothing after it."""
        c = client(url)
        full = c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=40, seed=4)
        text = full.choices[0].message.content or ""
        stop = text.split()[3][:2]
        at = text.index(stop)
        got = c.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=40,
            seed=4,
            stop=stop,
            extra_body={"include_stop_str_in_output": True},
        )
        assert got.choices[0].message.content == text[: at + len(stop)]

    def test_stream_never_writes_the_stop_string(self, url: str) -> None:
        """A stream holds back what may begin a stop string: no part of it is written."""
        c = client(url)
        full = c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=40, seed=5)
        text = full.choices[0].message.content or ""
        stop = text[9:14]  # spans two words: its start comes a token before its end
        with c.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=40, seed=5, stop=[stop], stream=True
        ) as stream:
            chunks = list(stream)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert streamed == text[: text.index(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"

    def test_stop_reason_names_the_stop_string(self, url: str) -> None:
        """vLLM's `stop_reason` is the stop string that ended a choice, whole and streamed."""
        c = client(url)
        text = c.completions.create(model=MODEL, prompt="w", max_tokens=40, seed=6).choices[0].text
        stop = text.split()[4]
        got = c.completions.create(model=MODEL, prompt="w", max_tokens=40, seed=6, stop=stop)
        assert got.choices[0].to_dict()["stop_reason"] == stop
        reply = c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=40, seed=6)
        stop = (reply.choices[0].message.content or "").split()[4]
        with c.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=40, seed=6, stop=["zz", stop], stream=True
        ) as stream:
            last = [ch.choices[0] for ch in stream if ch.choices][-1]
        assert (last.finish_reason, last.to_dict()["stop_reason"]) == ("stop", stop)
        both = c.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=40, seed=6, stop=stop, n=2
        )
        assert {ch.to_dict()["stop_reason"] for ch in both.choices} <= {stop, None}
        assert stop in {ch.to_dict()["stop_reason"] for ch in both.choices}

    def test_no_stop_string_no_stop_reason(self, url: str) -> None:
        """A reply cut by max_tokens has stop_reason null."""
        got = client(url).completions.create(model=MODEL, prompt="w", max_tokens=2, stop="qqqq")
        assert (got.choices[0].finish_reason, got.choices[0].to_dict()["stop_reason"]) == (
            "length",
            None,
        )

    def test_empty_stop_string_is_400(self, url: str) -> None:
        """An empty stop string is vLLM's 400."""
        with pytest.raises(openai.BadRequestError):
            client(url).completions.create(model=MODEL, prompt="x", max_tokens=2, stop=[""])


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
        },
    },
}
NOTE = {"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}}


class TestToolChoice:
    """`tool_choice` "required" or named answers a tool call, as vLLM's structured output."""

    def test_required(self, url: str) -> None:
        """ "required" answers a call of a tool, its arguments a JSON object with the
        required properties; finish_reason tool_calls."""
        got = client(url).chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=200, tools=[WEATHER], tool_choice="required"
        )
        choice = got.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls or []
        assert call.type == "function"
        assert call.function.name == "get_weather"
        args = json.loads(call.function.arguments)
        assert {"city", "unit"} <= set(args)
        assert args["unit"] in ("c", "f")

    def test_named_streamed(self, url: str) -> None:
        """A named function is called (finish_reason stop, as vLLM's), its arguments
        streamed after the call's id and name."""
        with client(url).chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=200,
            tools=[WEATHER, NOTE],
            tool_choice={"type": "function", "function": {"name": "note"}},
            stream=True,
        ) as stream:
            chunks = list(stream)
        calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assert calls[0].id
        assert calls[0].function is not None
        assert calls[0].function.name == "note"
        args = "".join(tc.function.arguments or "" for tc in calls if tc.function)
        assert json.loads(args) == {}
        assert chunks[-1].choices[0].finish_reason == "stop"

    def test_refusals(self, url: str) -> None:
        """tool_choice without tools, or naming a tool not in them, is vLLM's 400."""
        c = client(url)
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(
                model=MODEL, messages=HELLO, max_tokens=5, tool_choice="required"
            )
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(
                model=MODEL,
                messages=HELLO,
                max_tokens=5,
                tools=[WEATHER],
                tool_choice={"type": "function", "function": {"name": "nope"}},
            )


class TestResponseFormat:
    """`response_format` json_object and json_schema answer JSON, as vLLM's do."""

    def test_json_object(self, url: str) -> None:
        """json_object answers a JSON object."""
        got = client(url).chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=100, response_format={"type": "json_object"}
        )
        assert got.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(got.choices[0].message.content or ""), dict)

    def test_json_schema(self, url: str) -> None:
        """json_schema answers an object with the schema's required properties."""
        schema = {
            "type": "object",
            "properties": {"name": {"type": "string"}, "tags": {"type": "array"}},
            "required": ["name", "tags"],
        }
        got = client(url).completions.create(
            model=MODEL,
            prompt="describe",
            max_tokens=100,
            extra_body={
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "thing", "schema": schema},
                }
            },
        )
        value = json.loads(got.choices[0].text)
        assert isinstance(value["name"], str)
        assert isinstance(value["tags"], list)
