"""A real sim-engine process driven by the official `openai` package, sync and async."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from llmgw.testing import Program, start_program


@pytest.fixture(scope="module")
def engine() -> Iterator[Program]:
    prog = start_program(
        [
            "sim-engine",
            "--port",
            "0",
            "--model",
            "meta-llama/Llama-3-8B",
            "--served-model-name",
            "llama",
            "llama-alias",
            "--speed",
            "20",
        ]
    )
    try:
        yield prog
    finally:
        prog.stop()


def client(prog: Program) -> openai.OpenAI:
    return openai.OpenAI(base_url=prog.url + "/v1", api_key="unused", max_retries=0)


def aclient(prog: Program) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=prog.url + "/v1", api_key="unused", max_retries=0)


MESSAGES: list[dict[str, str]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say something."},
]


class TestSync:
    """The sim-engine with the synchronous openai client."""

    def test_chat(self, engine: Program) -> None:
        """A non-streaming chat completion has text, a finish reason and usage."""
        with client(engine) as c:
            r = c.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=8)
        assert r.object == "chat.completion"
        assert r.choices[0].finish_reason == "length"
        assert len(r.choices[0].message.content or "") == 32  # 8 tokens of 4 characters
        assert r.usage is not None
        assert (r.usage.completion_tokens, r.usage.total_tokens) == (
            8,
            r.usage.prompt_tokens + 8,
        )

    def test_chat_stream_with_usage(self, engine: Program) -> None:
        """A stream opens with the role, carries the tokens, then a usage chunk."""
        with client(engine) as c:
            chunks = list(
                c.chat.completions.create(
                    model="llama-alias",
                    messages=MESSAGES,
                    max_tokens=6,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
        last = chunks[-1]
        assert (len(text), finishes[-1], last.choices) == (24, "length", [])
        assert last.usage is not None
        assert last.usage.completion_tokens == 6

    def test_completion(self, engine: Program) -> None:
        """The completions endpoint defaults to 16 tokens, like OpenAI's."""
        with client(engine) as c:
            r = c.completions.create(model="llama", prompt="Once upon a time")
        assert (r.object, r.usage and r.usage.completion_tokens) == ("text_completion", 16)

    def test_completion_stream(self, engine: Program) -> None:
        """Streaming completions carry text deltas and a final finish reason."""
        with client(engine) as c:
            chunks = list(
                c.completions.create(model="llama", prompt="abc", max_tokens=4, stream=True)
            )
        text = "".join(ch.choices[0].text for ch in chunks)
        assert (len(text), chunks[-1].choices[0].finish_reason) == (16, "length")

    def test_models(self, engine: Program) -> None:
        """/v1/models lists every served name, owned by vllm, rooted at the model."""
        with client(engine) as c:
            models = c.models.list().data
        assert sorted(m.id for m in models) == ["llama", "llama-alias"]
        assert {m.owned_by for m in models} == {"vllm"}

    def test_embeddings(self, engine: Program) -> None:
        """Embeddings are deterministic unit vectors, one per input."""
        with client(engine) as c:
            a = c.embeddings.create(model="llama", input=["hello", "world"])
            b = c.embeddings.create(model="llama", input="hello")
        v = a.data[0].embedding
        assert (len(a.data), len(v), v) == (2, 1024, b.data[0].embedding)
        assert abs(sum(x * x for x in v) - 1.0) < 1e-3

    def test_same_seed_same_text(self, engine: Program) -> None:
        """Output text is deterministic for a given seed and differs across seeds."""
        with client(engine) as c:

            def text(seed: int) -> str:
                r = c.chat.completions.create(
                    model="llama",
                    messages=MESSAGES,
                    max_tokens=10,
                    seed=seed,
                )
                return r.choices[0].message.content or ""

            first, again, other = text(1), text(1), text(2)
        assert (first == again, first == other) == (True, False)

    def test_unknown_model_raises_not_found(self, engine: Program) -> None:
        """The client maps the 404 to NotFoundError."""
        with client(engine) as c, pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="nope", messages=MESSAGES)


class TestAsync:
    """The sim-engine with the asynchronous openai client."""

    async def test_chat(self, engine: Program) -> None:
        """The async client gets a complete chat completion."""
        async with aclient(engine) as c:
            r = await c.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=5)
        assert r.usage is not None
        assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", 5)

    async def test_chat_stream(self, engine: Program) -> None:
        """The async client streams tokens and ends with a finish reason."""
        async with aclient(engine) as c:
            stream = await c.chat.completions.create(
                model="llama",
                messages=MESSAGES,
                max_tokens=7,
                stream=True,
            )
            chunks = [ch async for ch in stream]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        assert (len(text), chunks[-1].choices[0].finish_reason) == (28, "length")

    async def test_natural_stop(self, engine: Program) -> None:
        """Without a token limit a reply ends by itself with finish_reason 'stop'."""
        async with aclient(engine) as c:
            r = await c.chat.completions.create(model="llama", messages=MESSAGES)
        assert r.usage is not None
        assert r.choices[0].finish_reason == "stop"
        assert 32 <= r.usage.completion_tokens <= 512
