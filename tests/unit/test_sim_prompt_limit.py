"""Prompts counted before they are built: the limit changes no prompt that fits, and a
prompt past it is refused with its exact count (issue 34, item 8)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.simengine import api, tokenizer
from llmgw.simengine.config import SimConfig

CFG = SimConfig(model="m", served_model_names=("m",), num_gpu_blocks=1000)
texts = st.text(max_size=60)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "critic"]), "content": texts},
        optional={"name": texts, "tool_call_id": texts},
    ),
    max_size=5,
)


class TestLimit:
    """The prompt limit counts tokens without changing a prompt that fits."""

    @given(messages, st.integers(min_value=0, max_value=80))
    def test_same_ids_or_exact_count(self, msgs: list[dict[str, Any]], limit: int) -> None:
        """Within the limit the ids are those built without one; past it, the exact count."""
        whole = tokenizer.chat_prompt_ids(msgs)
        if len(whole) <= limit:
            assert tokenizer.chat_prompt_ids(msgs, limit=limit) == whole
        else:
            with pytest.raises(tokenizer.PromptTooLong) as info:
                tokenizer.chat_prompt_ids(msgs, limit=limit)
            assert info.value.tokens == len(whole)

    @given(texts)
    def test_text_tokens_is_the_count(self, text: str) -> None:
        """A text's token count is known without tokenizing it."""
        assert tokenizer.text_tokens(text) == len(tokenizer.tokenize(text))

    def test_completion_ids_and_text(self) -> None:
        """Token ids and text prompts past the limit are refused with their count."""
        with pytest.raises(tokenizer.PromptTooLong) as info:
            tokenizer.completion_prompt_ids([5] * 11, limit=10)
        assert info.value.tokens == 11
        with pytest.raises(tokenizer.PromptTooLong) as info:
            tokenizer.prompt_ids_for_body({"prompt": "x" * 40}, limit=10)
        assert info.value.tokens == 11


class TestEngineRefusals:
    """Over-long prompts are refused as the engines do."""

    def test_long_chat_is_vllms_message_with_the_count(self) -> None:
        """A chat prompt past the context is a 400 naming its exact token count."""
        cfg = SimConfig(model="m", served_model_names=("m",), num_gpu_blocks=1000, max_model_len=64)
        raw = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"a" * 4000 + b'"}]}'
        with pytest.raises(api.SimApiError) as info:
            api.parse_chat(raw, cfg)
        assert info.value.status == 400
        assert "your request has 1004 input tokens" in info.value.message

    def test_embedding_inputs_bounded(self) -> None:
        """More than 2,048 embedding inputs is a 400 before any is tokenized."""
        raw = b'{"model": "m", "input": [' + b",".join([b'"a"'] * 2049) + b"]}"
        with pytest.raises(api.SimApiError, match="at most 2048"):
            api.parse_embeddings(raw, CFG)
