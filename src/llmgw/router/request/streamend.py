"""Whether a relayed stream's final event has gone out: then the answer is complete.

A client may stop reading at a stream's last event and close at once (guidellm
does at `data: [DONE]`). The engine's end of body, or the router's own end of
the answer, can come a moment later; a disconnect, or an engine that drops the
connection, landing in that moment used to count a complete answer as a 499
`disconnected` (or a broken stream) and skip the prefix bookkeeping of a
request that did reach the engine's cache.

The final events: `data: [DONE]` (OpenAI's chat and completions, vLLM's audio
streams), Anthropic's `message_stop`, and the Responses API's
`response.completed` and `response.incomplete`. Each must have gone out whole,
its blank line included: an SSE client dispatches an event only then.

Looked at only when a stream ends early, so one that ends as usual pays
nothing: the proxy keeps the last two chunks it wrote (two references, no
copies) and asks here. A final event longer than those two chunks whose name
is not in them (a Responses API `response.completed` carrying a long answer,
split by the transport, in a client that puts `type` first) is not recognised,
and the request counts as before: the one case left to the old rule.
"""

from __future__ import annotations

from typing import Final

# `event:` names that end a stream.
_FINAL_NAMES: Final = frozenset({b"message_stop", b"response.completed", b"response.incomplete"})
# The same as the `type` of the event's JSON (unescaped quotes occur only in JSON's own
# syntax, never inside a string), for engines that write no `event:` line.
_FINAL_TYPES: Final = tuple(b'"type":"' + name + b'"' for name in _FINAL_NAMES)


def final_event_sent(before: bytes, last: bytes) -> bool:
    """Whether the bytes written so far, ending `before + last`, end with a final event."""
    data = (before + last).replace(b"\r\n", b"\n")
    if not data.endswith(b"\n\n"):
        return False
    event = data[:-2]
    start = event.rfind(b"\n\n")
    if start >= 0:
        event = event[start + 2 :]
    for line in event.split(b"\n"):
        field, _, value = line.partition(b":")
        value = value.strip()
        if field == b"data" and value == b"[DONE]":
            return True
        if field == b"event":
            return value in _FINAL_NAMES
    compact = event.replace(b'": "', b'":"')
    return any(t in compact for t in _FINAL_TYPES)
