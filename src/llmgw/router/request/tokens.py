"""Token counts from the usage the engines return (OpenAI's `usage` object).

A JSON answer carries it in its body; a stream carries it in one or more
events when the client asked for `stream_options.include_usage` (vLLM and
SGLang add `"usage": null` to the other events, and with
`continuous_usage_stats` every event carries the running totals). The last
usage seen is the request's. A stream without any is not counted: the router
never invents token counts, and never changes what the client asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgspec

from llmgw.wire.answerusage import Usage, UsageDoc, decode_doc
from llmgw.wire.usage import MAX_COUNT

__all__ = ["StreamUsage", "Usage", "count_of", "counted", "usage_of"]

# An unfinished last line is carried to the next chunk up to this size; longer
# ones (a huge event with no usage in reach) are dropped from scanning.
_MAX_TAIL: Final = 65536
_KEY: Final = b'"usage"'


def usage_of(body: bytes) -> Usage | None:
    """The usage of one JSON document (a whole answer or one event's data); None without."""
    at = body.rfind(_KEY)
    if at < 0:
        return None
    try:
        # Engines write `usage` last, at the top level of the answer: decoded from
        # there, as if the object began at it, the rest of the answer is not read
        # again (the search runs from the end too). Where this `"usage"` is not a
        # top-level key (a string value, or a key nested at some depth, whose
        # containers close after it), those bytes are not one JSON object, and the
        # whole answer is decoded instead.
        u = decode_doc(b"{" + body[at:]).usage
    except msgspec.DecodeError:
        try:
            u = decode_doc(body).usage
        except msgspec.DecodeError:
            return None
    return None if u is None else counted(u)


def count_of(n: int | None) -> int:
    """One of an engine's counts as the router counts it: 0 for none or a negative one,
    and at most MAX_COUNT (2**53, the usage reports' bound).

    JSON's integers have no bound, and one past a float's (10**400 tokens) made the
    key's TPM bucket and the token metrics raise OverflowError after the answer was in:
    the client got a 500 instead of it, or a stream cut at its end."""
    if n is None or n < 0:
        return 0
    return n if n < MAX_COUNT else MAX_COUNT


def counted(u: UsageDoc) -> Usage | None:
    """An engine's usage object as the router counts it (each count by `count_of`),
    `cached_reported` None when the engine sent no cached count; None when it has neither
    a prompt nor a completion count (`{}`, or `total_tokens` alone): read as zeros, such
    an answer cost its key nothing, where one without usage costs the estimate."""
    if u.prompt_tokens is None and u.completion_tokens is None:
        return None
    details = u.prompt_tokens_details
    cached = details.cached_tokens if details is not None else None
    return Usage(
        prompt=count_of(u.prompt_tokens),
        completion=count_of(u.completion_tokens),
        cached=count_of(cached),
        cached_reported=None if cached is None else count_of(cached),
    )


class StreamUsage:
    """Fed every relayed chunk of an event stream; `usage` is the last one seen.

    `read` reads one event's data for another API's usage (apiusage.py); None: OpenAI's.
    """

    __slots__ = ("_read", "_tail", "usage")

    def __init__(self, read: Callable[[bytes], Usage | None] | None = None) -> None:
        self._tail = b""
        self._read = read
        self.usage: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            self._tail = data if len(data) <= _MAX_TAIL else b""
            return
        rest = data[cut + 1 :]
        self._tail = rest if len(rest) <= _MAX_TAIL else b""
        if _KEY not in data:
            return
        for line in data[:cut].split(b"\n"):
            if line.startswith(b"data:") and _KEY in line:
                read = self._read
                u = usage_of(line[5:].strip()) if read is None else read(line[5:].strip())
                if u is not None:
                    self.usage = u
