"""sim-engine response bodies: vLLM's SSE framing, chunk shapes, usage and error frames."""

from __future__ import annotations

import json

import pytest

from llmgw.simengine import api, encoder, modelcards, responses, tokenizer
from llmgw.simengine.config import SimConfig

CFG = SimConfig(model="org/m", served_model_names=("m", "alias"), num_gpu_blocks=1000)


def job(*, chat: bool = True) -> api.Job:
    return api.Job(
        chat=chat,
        model="m",
        prompt_ids=[1, 2],
        max_tokens=4,
        params_max_tokens=4,
        stream=True,
        include_usage=True,
        continuous_usage=False,
        seed=None,
        ignore_eos=False,
        min_tokens=0,
    )


def event(raw: bytes) -> dict[str, object]:
    assert raw.startswith(b"data: ")
    assert raw.endswith(b"\n\n")
    return json.loads(raw[6:-2])


class TestChatChunks:
    """The sim-engine's chat stream chunks."""

    def test_first_chunk_opens_with_the_role(self) -> None:
        """The first event carries delta.role = assistant and empty content, like vLLM."""
        e = event(encoder.Encoder(job(), "chatcmpl-1", 5).first())
        assert e == {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 5,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }

    def test_content_chunks_have_no_usage_key(self) -> None:
        """vLLM leaves usage out of content chunks (exclude_unset)."""
        e = event(encoder.Encoder(job(), "c", 5).delta("abc ", None, None))
        assert "usage" not in e
        assert e["choices"] == [
            {"index": 0, "delta": {"content": "abc "}, "logprobs": None, "finish_reason": None}
        ]

    def test_last_chunk_carries_finish_reason(self) -> None:
        """The chunk with the last token names the finish reason."""
        e = event(encoder.Encoder(job(), "c", 5).delta("", "stop", None))
        choice = e["choices"][0]
        assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)

    def test_usage_chunk_has_no_choices(self) -> None:
        """include_usage ends the stream with choices [] and the usage, cached tokens included."""
        e = event(encoder.Encoder(job(), "c", 5).usage_chunk(api.usage(10, 4, 8)))
        assert (e["choices"], e["usage"]) == (
            [],
            {
                "prompt_tokens": 10,
                "total_tokens": 14,
                "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        )


class TestCompletionChunks:
    """The sim-engine's completion stream chunks."""

    def test_text_completion_chunk(self) -> None:
        """Completions stream text_completion objects with text and stop_reason."""
        e = event(encoder.Encoder(job(chat=False), "cmpl-1", 5).delta("abcd", None, None))
        assert (e["object"], e["choices"]) == (
            "text_completion",
            [
                {
                    "index": 0,
                    "text": "abcd",
                    "logprobs": None,
                    "finish_reason": None,
                    "stop_reason": None,
                }
            ],
        )

    def test_no_role_chunk(self) -> None:
        """Completions have no role chunk."""
        assert encoder.Encoder(job(chat=False), "c", 5).first() == b""


class TestFraming:
    """SSE framing of errors and whole answers."""

    def test_error_frame_then_done(self) -> None:
        """A mid-stream error is one data event with vLLM's error object; [DONE] follows."""
        e = event(api.error_frame("boom"))
        assert e == {
            "error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}
        }
        assert api.DONE == b"data: [DONE]\n\n"

    def test_full_chat_response(self) -> None:
        """A non-streaming chat response has the message, finish reason and usage."""
        body = json.loads(encoder.Encoder(job(), "c", 5).full("hi", "length", api.usage(2, 1, 0)))
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == "hi"
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["total_tokens"] == 3


class TestModels:
    """The sim-engine's model list."""

    def test_every_served_name_listed(self) -> None:
        """/v1/models lists each served name with vLLM's fields, rooted at --model."""
        data = json.loads(modelcards.models_body(CFG, 7))["data"]
        assert [(m["id"], m["root"], m["owned_by"], m["max_model_len"]) for m in data] == [
            ("m", "org/m", "vllm", 8192),
            ("alias", "org/m", "vllm", 8192),
        ]
        assert data[0]["permission"][0]["object"] == "model_permission"


class TestEmbeddings:
    """The sim-engine's embeddings."""

    def test_deterministic_unit_vector(self) -> None:
        """The same tokens give the same unit vector."""
        a, b = api.embedding([1, 2, 3], 64), api.embedding([1, 2, 3], 64)
        assert (a == b, round(sum(x * x for x in a), 6)) == (True, 1.0)

    def test_batch_and_dimensions(self) -> None:
        """A list input gives one vector per item, of the requested size."""
        j = api.parse_embeddings(b'{"model": "m", "input": ["a", "b"], "dimensions": 8}', CFG)
        assert (len(j.inputs), j.dims) == (2, 8)


class TestTokenIds:
    """Token ids outside the vocabulary are refused with 400."""

    @pytest.mark.parametrize("ids", [[-1], [1, tokenizer.VOCAB_SIZE], [2**40]])
    def test_completion_ids_outside_the_vocabulary_are_400(self, ids: list[int]) -> None:
        """A prompt of token ids outside the vocabulary is vLLM's 400, not a 500 later."""
        raw = json.dumps({"model": "m", "prompt": ids}).encode()
        with pytest.raises(api.SimApiError) as exc:
            api.parse_completion(raw, CFG)
        assert (exc.value.status, exc.value.param) == (400, "prompt")

    def test_embedding_ids_outside_the_vocabulary_are_400(self) -> None:
        """Embedding input given as token ids is checked against the vocabulary too."""
        with pytest.raises(api.SimApiError) as exc:
            api.parse_embeddings(b'{"model": "m", "input": [[5, -3]]}', CFG)
        assert (exc.value.status, exc.value.param) == (400, "input")

    def test_ids_inside_the_vocabulary_are_kept(self) -> None:
        """Token ids within the vocabulary are used as given."""
        raw = json.dumps({"model": "m", "prompt": [0, tokenizer.VOCAB_SIZE - 1]}).encode()
        assert api.parse_completion(raw, CFG).prompt_ids == [0, tokenizer.VOCAB_SIZE - 1]


class TestCompletionPrompts:
    """A completions prompt is a string, token ids, or a list of either, as vLLM's."""

    @pytest.mark.parametrize("prompt", [[[[1]]], [["a"]], [[1, [2]]], [["a", 1]]])
    def test_deeper_lists_are_400(self, prompt: object) -> None:
        """A list nested deeper than vLLM's types is its 400 on `prompt`, not unwrapped."""
        raw = json.dumps({"model": "m", "prompt": prompt}).encode()
        with pytest.raises(api.SimApiError) as exc:
            api.parse_completions(raw, CFG)
        assert (exc.value.status, exc.value.param) == (400, "prompt")

    def test_batches_are_kept(self) -> None:
        """Strings and token-id lists, mixed in one batch, are a job each."""
        raw = json.dumps({"model": "m", "prompt": ["a", [1, 2], [3]]}).encode()
        assert [j.prompt_ids[-2:] for j in api.parse_completions(raw, CFG)][1:] == [[1, 2], [3]]


class TestResponsesInput:
    """A Responses request's input read as the chat prompt it stands for."""

    @pytest.mark.parametrize("kind", [[], {}, ["input_text"]])
    def test_a_part_typed_by_a_container_is_no_crash(self, kind: object) -> None:
        """A content part whose `type` is an array or object (unhashable) is an opaque
        part of the prompt, as the sim's chat and Messages routes read one, never a 500."""
        part = {"type": kind, "text": "hi"}
        raw = json.dumps({"model": "m", "input": [{"role": "user", "content": [part]}]})
        got = responses.parse_responses(raw.encode(), CFG)
        assert got.prompt_ids
