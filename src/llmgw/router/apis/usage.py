"""Token counts from the Responses API's and Anthropic's usage objects, as the router counts them.

- Responses: `usage: {input_tokens, output_tokens, input_tokens_details:
  {cached_tokens}}`, in a whole answer and, streamed, in the
  `response.completed` (or `response.incomplete`) event's `response`.
- Anthropic Messages: `usage: {input_tokens, output_tokens,
  cache_read_input_tokens, cache_creation_input_tokens}`. Anthropic counts
  `input_tokens` apart from the tokens read from or written to the cache, so the
  prompt is their sum and `cached` the cache reads. Streamed, `message_start`
  carries the input side (in `message.usage`) and each `message_delta` the
  running output count: a stream's usage is both, merged.

Like tokens.py: never invented. An answer without usage is not counted in tokens.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from llmgw.router.request.tokens import count_of, usage_of
from llmgw.wire.answerusage import Usage

openai_usage = usage_of


class _Cached(msgspec.Struct):
    cached_tokens: int | None = None


class _ResponsesUsage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    input_tokens_details: _Cached | None = None


class _Response(msgspec.Struct):
    usage: _ResponsesUsage | None = None


class _ResponsesDoc(msgspec.Struct):
    # A whole answer has `usage` at the top; a stream's final event has it in `response`.
    usage: _ResponsesUsage | None = None
    response: _Response | None = None


class _AnthropicUsage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _Message(msgspec.Struct):
    usage: _AnthropicUsage | None = None


class _AnthropicDoc(msgspec.Struct):
    usage: _AnthropicUsage | None = None
    message: _Message | None = None


_responses = msgspec.json.Decoder(_ResponsesDoc).decode
_anthropic = msgspec.json.Decoder(_AnthropicDoc).decode


def _from_responses(u: _ResponsesUsage) -> Usage | None:
    """None without an input or an output count: no usage (tokens.counted says why)."""
    if u.input_tokens is None and u.output_tokens is None:
        return None
    cached = None if u.input_tokens_details is None else u.input_tokens_details.cached_tokens
    return Usage(
        prompt=count_of(u.input_tokens),
        completion=count_of(u.output_tokens),
        cached=count_of(cached),
        cached_reported=None if cached is None else count_of(cached),
    )


def responses_usage(body: bytes) -> Usage | None:
    """The usage of a Responses answer, or of one event of its stream; None without."""
    try:
        doc = _responses(body)
    except msgspec.DecodeError:
        return None
    u = doc.usage
    if u is None and doc.response is not None:
        u = doc.response.usage
    return None if u is None else _from_responses(u)


def _anthropic_doc(body: bytes) -> _AnthropicUsage | None:
    try:
        doc = _anthropic(body)
    except msgspec.DecodeError:
        return None
    if doc.usage is not None:
        return doc.usage
    return None if doc.message is None else doc.message.usage


def _from_anthropic(u: _AnthropicUsage) -> Usage | None:
    """None without any count: no usage (tokens.counted says why)."""
    read = u.cache_read_input_tokens
    counts = (u.input_tokens, u.output_tokens, read, u.cache_creation_input_tokens)
    if all(n is None for n in counts):
        return None
    prompt = count_of(u.input_tokens) + count_of(read) + count_of(u.cache_creation_input_tokens)
    return Usage(
        prompt=count_of(prompt),
        completion=count_of(u.output_tokens),
        cached=count_of(read),
        cached_reported=None if read is None else count_of(read),
    )


def anthropic_usage(body: bytes) -> Usage | None:
    """The usage of a whole Messages answer; None without."""
    u = _anthropic_doc(body)
    return None if u is None else _from_anthropic(u)


class EventUsage(Protocol):
    """Reads the `data:` of each stream event that mentions usage; the stream's usage so far."""

    def read(self, data: bytes) -> Usage | None: ...


class ResponsesStreamUsage:
    """A Responses stream: its final event's usage (earlier ones carry `usage: null`)."""

    def read(self, data: bytes) -> Usage | None:
        return responses_usage(data)


class AnthropicStreamUsage:
    """A Messages stream: the input side of `message_start`, the last `message_delta`'s output."""

    def __init__(self) -> None:
        self._merged = _AnthropicUsage()

    def read(self, data: bytes) -> Usage | None:
        u = _anthropic_doc(data)
        if u is None:
            return None
        m = self._merged
        for field in _AnthropicUsage.__struct_fields__:
            value = getattr(u, field)
            if value is not None:
                setattr(m, field, value)
        return _from_anthropic(m)
