"""The msgspec types tokens.py decodes engine usage into.

A module of their own because tokens.py is compiled with mypyc
(llmgw.router.compiled) and msgspec cannot read the field types of a Struct
defined in a compiled module (it sees `type` where the annotation named a Struct):
decoding would fail on every answer.
"""

from __future__ import annotations

import msgspec


class Details(msgspec.Struct):
    cached_tokens: int | None = None


class UsageDoc(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: Details | None = None


class Doc(msgspec.Struct):
    usage: UsageDoc | None = None


class Usage(msgspec.Struct, frozen=True):
    """One request's token counts, as the engine reported them."""

    prompt: int
    completion: int
    cached: int
    # `cached` as the engine wrote it; None when it sent no prompt_tokens_details
    # (vLLM without --enable-prompt-tokens-details): unknown, not zero (feedback.py).
    cached_reported: int | None = None


decode_doc = msgspec.json.Decoder(Doc).decode
