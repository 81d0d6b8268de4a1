"""What one answer's usage may count: the engine's figures, bounded by its request.

The router takes an engine's usage at its word for a key's TPM bucket, its budget,
the usage reports and the token metrics. One answer claiming 10**15 tokens (an
engine's bug, a proxy in front of it that makes figures up) overdrew its key's TPM
bucket for longer than anyone would wait and spent its budget for the period: each
count is held to what the request could have used.

- Prompt: one token per byte of the request's body (a tokenizer's token spells at
  least one byte of its text), or PROMPT_FLOOR_TOKENS where that is more: an image
  or a sound named by its URL is a few bytes and up to thousands of tokens, and a
  chat template adds its own.
- Completion: the request's `max_completion_tokens`, `max_tokens` or
  `max_output_tokens` (at most LIMIT_CEILING_TOKENS), else DEFAULT_COMPLETION_TOKENS;
  times its `n` choices (at most MAX_CHOICES), and times its prompts (a legacy
  completion's `prompt` may be a list of them, each answered).

The router does not know a model's context length (engines refuse a request
asking for more than theirs: LIMIT_CEILING_TOKENS stands in for the longest).
What is over a bound is neither counted nor charged; it is counted in
`llmgw_router_usage_clipped_tokens_total` and logged (proxy.py).
"""

from __future__ import annotations

from typing import Any, Final

from llmgw.wire.answerusage import Usage

# 128 Ki tokens: the prompt of a short request with media in it, a long context's window.
PROMPT_FLOOR_TOKENS: Final = 131_072
# 128 Ki tokens: an answer of a request that set no limit (engines then stop at what
# the context leaves).
DEFAULT_COMPLETION_TOKENS: Final = 131_072
# 1 Mi tokens: the most a request's own limit counts for, the longest contexts served.
LIMIT_CEILING_TOKENS: Final = 1_048_576
# OpenAI's bound on `n`.
MAX_CHOICES: Final = 128


def completion_bound(limit: object, n: object, prompt: object = None) -> int:
    """The most completion tokens an answer may count, from the request's limit (its
    `max_completion_tokens`, `max_tokens` or `max_output_tokens`; anything but a
    positive int: none given), `n` (anything but an int from 1: one choice) and, for
    the legacy completions, its `prompt` (a list of prompts: `n` choices each)."""
    if type(limit) is int and limit > 0:
        each = min(limit, LIMIT_CEILING_TOKENS)
    else:
        each = DEFAULT_COMPLETION_TOKENS
    if type(prompt) is list and len(prompt) > 1 and type(prompt[0]) in (str, list):
        # A batch (strings, or lists of token ids): the engine answers each prompt, its
        # usage the sum. Held to one prompt's bound, an honest batch was cut and
        # under-charged (a key's TPM and budget dodged by batching).
        each *= len(prompt)
    if type(n) is int and n > 1:
        return each * min(n, MAX_CHOICES)
    return each


def completion_bound_of(doc: dict[str, Any]) -> int:
    """`completion_bound` of a request's JSON body, whichever API's limit it names."""
    limit = doc.get("max_completion_tokens")
    if type(limit) is not int:
        limit = doc.get("max_tokens")
    if type(limit) is not int:
        limit = doc.get("max_output_tokens")
    return completion_bound(limit, doc.get("n"), doc.get("prompt"))


def prompt_bound(body_bytes: int) -> int:
    """The most prompt tokens an answer to a body of `body_bytes` may count."""
    return body_bytes if body_bytes > PROMPT_FLOOR_TOKENS else PROMPT_FLOOR_TOKENS


def bounded(usage: Usage, *, body_bytes: int, completion_most: int) -> tuple[Usage, int]:
    """`usage` with each count held to its bound (cached tokens to the prompt's), and
    the tokens cut off; `usage` itself when nothing was."""
    prompt_most = prompt_bound(body_bytes)
    prompt = min(usage.prompt, prompt_most)
    completion = min(usage.completion, completion_most)
    cut = usage.prompt - prompt + usage.completion - completion
    if not cut:
        return usage, 0
    reported = usage.cached_reported
    return (
        Usage(
            prompt=prompt,
            completion=completion,
            cached=min(usage.cached, prompt),
            cached_reported=None if reported is None else min(reported, prompt),
        ),
        cut,
    )
