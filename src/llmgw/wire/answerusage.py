"""What an engine's answer says it used: OpenAI's `usage` object, and one request's counts.

The router reads every answer's usage (router/request/tokens.py) for token limits,
usage reports and metrics. These types live in `wire`, not beside the compiled
router modules, because msgspec reads a Struct's field types from its module, and
in a mypyc-compiled module it cannot.
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
