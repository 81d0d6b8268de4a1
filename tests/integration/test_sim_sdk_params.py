"""Sampling parameters vLLM honours, asked of a sim-engine through a real router by the SDK.

Each test sends what an evaluation client or agent framework sends (logprobs,
echo, stop strings, batches of prompts, n) and reads the answer the way the
`openai` package parses vLLM's.
"""

from __future__ import annotations

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
        yield r.url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


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
