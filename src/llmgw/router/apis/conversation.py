"""The Responses API's and Anthropic's conversations in chat's shape, for routing only.

A conversation keeps its home replica (the one whose KV cache holds it,
routing.md) whichever API carries a turn of it: a client may send the first
turns as chat completions and the next through `/v1/responses` or
`/v1/messages`. The prefix chain is computed over chat's canonical prompt
(prefix.py), so each API's request is rewritten here to the chat request
with the same turns — `instructions` and `system` become the system message,
text parts (`input_text`, `output_text`, Anthropic's `text` blocks) become
chat's text parts, other parts and items (images, tool calls and their
results) stay as they are, encoded — and keyed exactly as chat's. The body
the engine gets is never touched.

Only as many turns and parts are rewritten as routing reads (`MAX_ROUTED_ITEMS`):
an `input` of millions of one-byte items made millions of dicts, a second and
hundreds of MB per million, to key a request whose chain stops long before.

Tool definitions are left out of the rewritten request: each API writes them
differently, so keeping them would keep a conversation with tools apart from
its chat turns anyway.
"""

from __future__ import annotations

from typing import Any

from llmgw.router.routing.affinity import RouteKey, route_key
from llmgw.router.routing.blockhash import MAX_ROUTED_ITEMS

# Text parts of each API, as chat's.
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def _content(content: Any) -> Any:
    """Message content with every text part as chat's `{"type": "text", "text"}`."""
    if not isinstance(content, list):
        return content
    out: list[Any] = []
    for part in content[:MAX_ROUTED_ITEMS]:
        kind = part.get("type") if isinstance(part, dict) else None
        # A set lookup of an array or object `type` raises (unhashable): such a part is
        # the engine's to refuse, and here an opaque part like any other.
        if isinstance(kind, str) and kind in _TEXT_PARTS:
            out.append({"type": "text", "text": part.get("text")})
        else:
            out.append(part)
    return out


def _message(item: Any) -> dict[str, Any]:
    if isinstance(item, dict) and "role" in item and item.get("type", "message") == "message":
        return {"role": item.get("role"), "content": _content(item.get("content"))}
    # A tool call, its output, a reasoning item: opaque, but still part of the prefix.
    return {"role": "", "content": [item]}


def responses_messages(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses request's turns as chat messages."""
    out: list[dict[str, Any]] = []
    instructions = doc.get("instructions")
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    given = doc.get("input")
    if isinstance(given, str):
        out.append({"role": "user", "content": given})
    elif isinstance(given, list):
        out.extend(_message(item) for item in given[:MAX_ROUTED_ITEMS])
    return out


def messages_messages(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """An Anthropic Messages request's turns as chat messages."""
    out: list[dict[str, Any]] = []
    system = doc.get("system")
    if isinstance(system, str) and system:
        out.append({"role": "system", "content": system})
    elif isinstance(system, list) and system:
        out.append({"role": "system", "content": _content(system)})
    given = doc.get("messages")
    if isinstance(given, list):
        out.extend(_message(item) for item in given[:MAX_ROUTED_ITEMS])
    return out


def responses_key(doc: dict[str, Any], session: str | None) -> RouteKey:
    chat: dict[str, Any] = {"model": doc.get("model", ""), "messages": responses_messages(doc)}
    if isinstance(doc.get("user"), str):
        chat["user"] = doc["user"]
    return route_key(chat, session)


def messages_key(doc: dict[str, Any], session: str | None) -> RouteKey:
    chat: dict[str, Any] = {"model": doc.get("model", ""), "messages": messages_messages(doc)}
    meta = doc.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("user_id"), str):
        chat["user"] = meta["user_id"]
    return route_key(chat, session)
