"""The sim-engine's tokenizer, which lives in `llmgw.tokenization.sim`.

It moved there so the router can tokenize prompts the same way in precise mode
(docs/routing.md) without importing the sim-engine; this module keeps the old
import path for the engine, benchmarks and tests.
"""

from __future__ import annotations

from llmgw.tokenization.sim import (
    BOS,
    END,
    FIRST_TEXT_ID,
    OUTPUT_IDS,
    OUTPUT_PIECES,
    PIECE_CHARS,
    ROLE_IDS,
    ROLE_OTHER,
    SEP,
    TEXT_ID_RANGE,
    TOOLS,
    VOCAB_SIZE,
    PromptTooLong,
    canon,
    chat_prompt_ids,
    completion_prompt_ids,
    content_text,
    message_ids,
    output_text,
    piece_id,
    prompt_ids_for_body,
    prompt_seed,
    text_tokens,
    tokenize,
)

__all__ = [
    "BOS",
    "END",
    "FIRST_TEXT_ID",
    "OUTPUT_IDS",
    "OUTPUT_PIECES",
    "PIECE_CHARS",
    "ROLE_IDS",
    "ROLE_OTHER",
    "SEP",
    "TEXT_ID_RANGE",
    "TOOLS",
    "VOCAB_SIZE",
    "PromptTooLong",
    "canon",
    "chat_prompt_ids",
    "completion_prompt_ids",
    "content_text",
    "message_ids",
    "output_text",
    "piece_id",
    "prompt_ids_for_body",
    "prompt_seed",
    "text_tokens",
    "tokenize",
]
