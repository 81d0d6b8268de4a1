"""Anthropic's Messages API as vLLM serves it (`POST /v1/messages`): request, answer, errors.

`max_tokens` is required, as Anthropic's API has it; `system` (a string or
text blocks) and the messages' text blocks are tokenized as the chat prompt
with the same turns. `stop_sequences` are chat's `stop` (vLLM passes them on
so): the reply ends before the first, with stop_reason `end_turn`, as vLLM
maps any "stop" finish, and `stop_sequence` null. `tools` (`name`,
`input_schema`) and `tool_choice` are chat's, as vLLM converts them: `any`
("required") or a named `tool` answers one `tool_use` block, its `input` the
JSON structured.py writes (streamed as `input_json_delta`), stop_reason
`tool_use` for `any` and the engine's for a named tool, as vLLM maps chat's
finish reasons; `auto` answers words. Errors are Anthropic's shape,
`{"type": "error", "error": {"type", "message"}}`. Usage follows Anthropic's meaning:
`input_tokens` are the prompt tokens not read from the cache,
`cache_read_input_tokens` those that were. Streamed: `message_start`,
`content_block_start`, `content_block_delta`…, `content_block_stop`,
`message_delta` (stop reason, usage), `message_stop`; no `[DONE]`. And
`/v1/messages/count_tokens`, the prompt's token count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from typing import Any

import msgspec

from llmgw.simengine import api, sampling, structured
from llmgw.simengine.config import SimConfig

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
_STOP = {"stop": "end_turn", "length": "max_tokens"}
_enc = msgspec.json.Encoder()


class MessagesBody(api.GenerationBody, frozen=True, kw_only=True):
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    tool_choice: dict[str, Any] | None = None


def error_body(status: int, message: str) -> bytes:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return _enc.encode({"type": "error", "error": {"type": kind, "message": message}})


def _content(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    return [
        {"type": "text", "text": b.get("text")}
        if isinstance(b, dict) and b.get("type") == "text"
        else b
        for b in content
    ]


def chat_messages(body: MessagesBody) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if body.system:
        out.append({"role": "system", "content": _content(body.system)})
    for m in body.messages:
        if m.get("role") not in ("user", "assistant"):
            raise api.SimApiError(400, "messages: roles must be 'user' or 'assistant'")
        out.append({"role": m["role"], "content": _content(m.get("content"))})
    return out


def parse_messages(raw: bytes, cfg: SimConfig) -> api.Job:
    body = api.decode_as(raw, MessagesBody)
    model = api.check_model(body.model, cfg)
    if body.max_tokens is None:
        raise api.SimApiError(400, "max_tokens: Field required", param="max_tokens")
    if not body.messages:
        raise api.SimApiError(400, "messages: at least one message is required")
    stops = sampling.stop_strings(body.stop_sequences)
    call = structured.tool_call(_functions(body.tools), _choice(body.tool_choice))
    ids = api.chat_ids(chat_messages(body), body.tools, cfg)
    job = api.job_of(body, cfg, ids, body.max_tokens, model=model, chat=True)
    if call is None:
        return dataclasses.replace(job, stops=stops)
    name, arguments, required = call
    return dataclasses.replace(
        job, stops=stops, script=arguments, tool=name, tool_required=required
    )


def _functions(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Anthropic's tools as chat's functions (vLLM's conversion), or its 400."""
    if tools is None:
        return None
    out = []
    for t in tools:
        name, schema = t.get("name"), t.get("input_schema")
        if not isinstance(name, str) or not isinstance(schema, dict):
            raise api.SimApiError(400, "tools: each tool needs a `name` and an `input_schema`")
        out.append({"type": "function", "function": {"name": name, "parameters": schema}})
    return out


def _choice(choice: dict[str, Any] | None) -> object:
    """Anthropic's tool_choice as chat's: `any` is "required", `tool` names a function."""
    if choice is None:
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind != "tool":
        raise api.SimApiError(400, "tool_choice.type must be 'auto', 'any', 'tool' or 'none'")
    name = choice.get("name")
    if not isinstance(name, str) or not name:
        raise api.SimApiError(400, "tool_choice.name is required when type is 'tool'")
    return {"type": "function", "function": {"name": name}}


class CountBody(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None = None
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None


def count_tokens(raw: bytes, cfg: SimConfig) -> bytes:
    """`/v1/messages/count_tokens`: the prompt's token count, `{"input_tokens"}`."""
    body = api.decode_as(raw, CountBody)
    api.check_model(body.model, cfg)
    as_request = MessagesBody(model=body.model, messages=body.messages, system=body.system)
    ids = api.chat_ids(chat_messages(as_request), body.tools, cfg)
    return _enc.encode({"input_tokens": len(ids)})


def usage(u: dict[str, Any]) -> dict[str, Any]:
    """An engine usage dict (api.usage) in Anthropic's fields and meaning."""
    cached = u["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": u["prompt_tokens"] - cached,
        "output_tokens": u["completion_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _enc.encode({"type": kind, **data}) + b"\n\n"


class MessagesEncoder:
    """One Messages request's answer, whole or as events (encoder.AnyEncoder)."""

    def __init__(self, job: api.Job, rid: str, created: int) -> None:
        self.job = job
        self.id = "msg_" + rid.rpartition("-")[2]
        self.finish: str | None = None
        self.call_id = f"chatcmpl-tool-{uuid.uuid4().hex}"  # vLLM's: its chat call's id

    def _stop_reason(self, finish: str) -> str:
        # vLLM's: a call chat ends with "tool_calls" (tool_choice any) is `tool_use`; a
        # named tool's call ends as the engine ended it.
        if finish == "stop" and self.job.tool_required:
            return "tool_use"
        return _STOP.get(finish, "end_turn")

    def _block(self, text: str | None) -> dict[str, Any]:
        """The reply's one content block: its text, or the tool call (`input` {} opening
        a stream, or when max_tokens cut the arguments short)."""
        if self.job.tool is None:
            return {"type": "text", "text": text or ""}
        args: object = {}
        if text is not None:
            with contextlib.suppress(msgspec.DecodeError):
                args = msgspec.json.decode(text)
        return {
            "type": "tool_use",
            "id": self.call_id,
            "name": self.job.tool,
            "input": args if isinstance(args, dict) else {},
        }

    def _message(self, content: list[dict[str, Any]], u: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self.job.model,
            "stop_reason": None if self.finish is None else self._stop_reason(self.finish),
            "stop_sequence": None,
            "usage": u,
        }

    def first(self) -> bytes:
        u = {"input_tokens": len(self.job.prompt_ids), "output_tokens": 0}
        block = self._block(None)
        return _event("message_start", {"message": self._message([], u)}) + _event(
            "content_block_start", {"index": 0, "content_block": block}
        )

    def delta(
        self,
        text: str,
        finish: str | None,
        usage_: dict[str, Any] | None,
        stop_reason: str | None = None,  # chat's and completions' alone
    ) -> bytes:
        self.finish = finish
        if not text:
            return b""
        delta = (
            {"type": "text_delta", "text": text}
            if self.job.tool is None
            else {"type": "input_json_delta", "partial_json": text}
        )
        return _event("content_block_delta", {"index": 0, "delta": delta})

    def tail(self, usage_: dict[str, Any]) -> bytes:
        stop = self._stop_reason(self.finish or "stop")
        return b"".join(
            (
                _event("content_block_stop", {"index": 0}),
                _event(
                    "message_delta",
                    {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage(usage_)},
                ),
                _event("message_stop", {}),
            )
        )

    def error(self, message: str) -> bytes:
        return b"event: error\ndata: " + error_body(500, message) + b"\n\n"

    def full(
        self, text: str, finish: str, usage_: dict[str, Any], stop_reason: str | None = None
    ) -> bytes:
        self.finish = finish
        return _enc.encode(self._message([self._block(text)], usage(usage_)))
