"""OpenAI's Responses API as vLLM serves it (`POST /v1/responses`): request and response bodies.

Stateless only, as vLLM without its response store: `previous_response_id`
and `background` are refused (400). The input (`instructions`, then `input`
as a string or a list of messages with `input_text`/`output_text` parts) is
tokenized as the chat prompt with the same turns, so a conversation costs the
same tokens whichever API carries it. A `text.format` json_schema answers
JSON that fits its `schema` (structured.py), as vLLM's structured output
does; other formats answer words. A response repeats the request's
`instructions`, `metadata`, `temperature`, `top_p`, `tools`, `tool_choice`,
`text`, `parallel_tool_calls` and `user`, as vLLM's does. Streamed, the events are vLLM's:
`response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, `response.output_text.delta`…,
`response.output_text.done`, `response.content_part.done`,
`response.output_item.done`, then `response.completed`, each with a
`sequence_number`, and no `[DONE]`. A reply `max_output_tokens` cut ends with
`response.completed` too, its response's status "incomplete", as vLLM's does:
the SDK's `responses.stream()` takes its final response from that event alone.

Function tools are chat's (structured.py), flat as Responses writes them:
`tool_choice` "required" or `{"type": "function", "name"}` answers one
`function_call` item, its `arguments` JSON that fits the function's
`parameters`, streamed as `response.output_item.added`,
`response.function_call_arguments.delta`…, `…arguments.done` and
`response.output_item.done` (no content parts); "auto" answers words.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from llmgw.simengine import api, structured, tokenizer
from llmgw.simengine.config import SimConfig

_TEXT = frozenset({"input_text", "output_text", "text"})


class ResponsesBody(api.GenerationBody, frozen=True, kw_only=True):
    input: Any = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    previous_response_id: str | None = None
    background: bool | None = False
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    tool_choice: Any = "auto"
    parallel_tool_calls: bool | None = True
    user: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ResponsesJob(api.Job):
    """A Responses request's job and what its answer echoes of the request."""

    echoed: dict[str, Any] = dataclasses.field(default_factory=dict)


def _echoed(body: ResponsesBody) -> dict[str, Any]:
    """The request's fields a response repeats, as vLLM's (defaults where not given)."""
    return {
        "instructions": body.instructions,
        "metadata": body.metadata,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "tool_choice": body.tool_choice,
        "tools": body.tools or [],
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "text": body.text or {"format": {"type": "text"}},
        "user": body.user,
    }


def _content(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    # `type` is looked up only when a string: an array or object one raises in a set
    # lookup (unhashable), and such a part is opaque, as in chat's and Messages' prompts.
    return [
        {"type": "text", "text": p.get("text")}
        if isinstance(p, dict) and isinstance(p.get("type"), str) and p["type"] in _TEXT
        else p
        for p in content
    ]


def chat_messages(body: ResponsesBody) -> list[dict[str, Any]]:
    """The request's turns as chat messages (what the prompt is tokenized as)."""
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        out.append({"role": "user", "content": body.input})
    elif isinstance(body.input, list):
        for item in body.input:
            if isinstance(item, dict) and "role" in item:
                out.append({"role": item["role"], "content": _content(item.get("content"))})
            else:
                out.append({"role": "user", "content": tokenizer.canon(item)})
    else:
        raise api.SimApiError(400, "input must be a string or a list of items", param="input")
    return out


def parse_responses(raw: bytes, cfg: SimConfig) -> api.Job:
    body = api.decode_as(raw, ResponsesBody)
    model = api.check_model(body.model, cfg)
    if body.previous_response_id is not None:
        raise api.SimApiError(
            400,
            "previous_response_id needs the response store, which this engine does not keep",
            param="previous_response_id",
        )
    if body.background:
        raise api.SimApiError(400, "background responses need the response store")
    call = _tool_call(body.tools, body.tool_choice)
    script = call[1] if call else _format_text(body.text)
    ids = api.chat_ids(chat_messages(body), body.tools, cfg)
    job = api.job_of(body, cfg, ids, body.max_output_tokens, model=model, chat=True)
    fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
    fields.update(
        script=script, tool=call[0] if call else None, tool_required=bool(call and call[2])
    )
    return ResponsesJob(**fields, echoed=_echoed(body))


def _tool_call(tools: list[dict[str, Any]] | None, choice: Any) -> tuple[str, str, bool] | None:
    """The function a reply must call (structured.tool_call: name, arguments, required) for
    tool_choice "required" or a named function; None: words. Responses' tools and choice are
    flat (`{"type": "function", "name", "parameters"}`), chat's nest them in `function`."""
    functions = [
        {"type": "function", "function": t}
        for t in tools or ()
        if isinstance(t, dict) and t.get("type") == "function"
    ]
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            return None  # a hosted tool's choice: the sim has none, and answers words
        choice = {"function": {"name": choice.get("name")}}
    if choice == "auto" and not functions:
        return None  # the default, with or without tools: not chat's 400 for it
    return structured.tool_call(functions or None, choice)


def _format_text(text: dict[str, Any] | None) -> str | None:
    """The JSON a `text.format` json_schema or json_object asks for (structured.py); None:
    words, for "text"."""
    fmt = None if text is None else text.get("format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        # A JSON object, as chat's json_object: words here would be what the openai
        # package's users json.loads and fail on.
        return structured.format_text(fmt)
    if fmt.get("type") != "json_schema":
        return None
    if not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict):
        raise api.SimApiError(
            400, "text.format json_schema needs a `name` and a `schema`", param="text"
        )
    return structured.json_text(fmt["schema"])


def usage(u: dict[str, Any]) -> dict[str, Any]:
    """An engine usage dict (api.usage) in the Responses API's fields."""
    return {
        "input_tokens": u["prompt_tokens"],
        # `cache_write_tokens` is required in the openai package's InputTokensDetails: a
        # client that validates the usage (pydantic's model_validate) fails without it.
        "input_tokens_details": {
            "cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": u["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u["total_tokens"],
    }


_enc = msgspec.json.Encoder()
_ECHO_DEFAULTS = _echoed(ResponsesBody())


class ResponsesEncoder:
    """One Responses request's answer, whole or as events (encoder.AnyEncoder)."""

    def __init__(self, job: api.Job, rid: str, created: int) -> None:
        self.job = job
        tail = rid.rpartition("-")[2]
        self.id = "resp_" + tail
        # A reply that calls a function is one `function_call` item, not a message.
        self.tool = job.tool
        self.item_id = ("fc_" if self.tool else "msg_") + tail
        self.call_id = "call_" + tail
        self.created = created
        self.seq = 0
        self.text: list[str] = []
        self.finish: str | None = None  # the last delta's finish reason
        self.echoed = job.echoed if isinstance(job, ResponsesJob) else {}

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        data = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + _enc.encode(data) + b"\n\n"

    def _item(self, status: str) -> dict[str, Any]:
        text = "".join(self.text)
        if self.tool is not None:
            return {
                "id": self.item_id,
                "type": "function_call",
                "call_id": self.call_id,
                "name": self.tool,
                "arguments": text if status == "completed" else "",
                "status": status,
            }
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {
            "id": self.item_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content if status == "completed" else [],
        }

    def _response(
        self, status: str, finish: str | None, u: dict[str, Any] | None
    ) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if finish == "length" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": self.job.model,
            "status": "incomplete" if incomplete else status,
            "incomplete_details": incomplete,
            **_ECHO_DEFAULTS,
            **self.echoed,
            "output": [] if u is None else [self._item("completed")],
            "background": False,
            "max_output_tokens": self.job.params_max_tokens,
            "previous_response_id": None,
            "reasoning": None,
            "service_tier": "auto",
            "truncation": "disabled",
            "usage": None if u is None else usage(u),
        }

    def first(self) -> bytes:
        opening = self._response("in_progress", None, None)
        head = b"".join(
            (
                self._event("response.created", {"response": opening}),
                self._event("response.in_progress", {"response": opening}),
                self._event(
                    "response.output_item.added",
                    {"output_index": 0, "item": self._item("in_progress")},
                ),
            )
        )
        if self.tool is not None:
            return head  # a function call has no content parts
        return head + self._event(
            "response.content_part.added",
            {
                "item_id": self.item_id,
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
            },
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
        self.text.append(text)
        if self.tool is not None:
            at = {"item_id": self.item_id, "output_index": 0, "delta": text}
            return self._event("response.function_call_arguments.delta", at)
        fields = {
            "item_id": self.item_id,
            "output_index": 0,
            "content_index": 0,
            "delta": text,
            "logprobs": [],
        }
        return self._event("response.output_text.delta", fields)

    def tail(self, usage_: dict[str, Any]) -> bytes:
        text = "".join(self.text)
        at = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        part = {"type": "output_text", "text": text, "annotations": []}
        final = self._response("completed", self.finish, usage_)
        if self.tool is not None:
            done = {"item_id": self.item_id, "output_index": 0, "arguments": text}
            return b"".join(
                (
                    self._event("response.function_call_arguments.done", done),
                    self._event(
                        "response.output_item.done",
                        {"output_index": 0, "item": self._item("completed")},
                    ),
                    self._event("response.completed", {"response": final}),
                )
            )
        return b"".join(
            (
                self._event("response.output_text.done", {**at, "text": text, "logprobs": []}),
                self._event("response.content_part.done", {**at, "part": part}),
                self._event(
                    "response.output_item.done",
                    {"output_index": 0, "item": self._item("completed")},
                ),
                self._event("response.completed", {"response": final}),
            )
        )

    def error(self, message: str) -> bytes:
        fields = {"code": "server_error", "message": message, "param": None}
        return self._event("error", fields)

    def full(
        self, text: str, finish: str, usage_: dict[str, Any], stop_reason: str | None = None
    ) -> bytes:
        self.text = [text]
        return _enc.encode(self._response("completed", finish, usage_))
