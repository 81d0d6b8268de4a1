"""The chat and completions answers, whole and streamed, in vLLM's shapes (api.Job's)."""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from llmgw.simengine import logprobs
from llmgw.simengine.api import DONE, Job, encode, error_frame, sse


class AnyEncoder(Protocol):
    """What the engine writes a generation's answer with: this module's Encoder
    (chat, completions), responses.ResponsesEncoder, messages.MessagesEncoder."""

    def first(self) -> bytes: ...
    def delta(
        self,
        text: str,
        finish: str | None,
        usage_: dict[str, Any] | None,
        stop_reason: str | None = None,
    ) -> bytes: ...
    def tail(self, usage_: dict[str, Any]) -> bytes: ...
    def error(self, message: str) -> bytes: ...
    def full(
        self, text: str, finish: str, usage_: dict[str, Any], stop_reason: str | None = None
    ) -> bytes: ...


class Encoder:
    """Response bodies of one request (chat or completion), streaming and not; of one
    choice (`index`) when the request has several (batch.py)."""

    def __init__(self, job: Job, rid: str, created: int, index: int = 0) -> None:
        self.job = job
        self.rid = rid
        self.created = created
        self.index = index
        self.object = "chat.completion.chunk" if job.chat else "text_completion"
        self._sent_tokens = 0  # generated tokens already written (logprobs' positions)
        self._sent_chars = 0  # characters of text already written (completions' offsets)
        self._echoed = False  # the prompt (echo) has been written
        self._call_id = f"chatcmpl-tool-{uuid.uuid4().hex}"  # vLLM's form of a call's id
        self._call_named = False  # a streamed tool call's id and name have been written

    def _logprobs(self, text: str) -> dict[str, Any] | None:
        """`choice.logprobs` of the next `text`; None when the request asked for none."""
        top = self.job.logprobs
        if top is None:
            return None
        start, offset = self._sent_tokens, self._sent_chars
        self._sent_tokens += len(logprobs.pieces(text))
        self._sent_chars += len(text)
        if self.job.chat:
            return logprobs.chat(text, top, start)
        return logprobs.completion(text, top, start, offset)

    def _text(self, text: str) -> tuple[str, dict[str, Any] | None]:
        """The choice's next text and its logprobs; for an echo, the prompt comes first."""
        job = self.job
        if job.echo_only:
            text = ""
        if job.echo is None or self._echoed:
            return text, self._logprobs(text)
        self._echoed = True
        prompt = job.echo
        self._sent_chars = len(prompt)
        lp = self._logprobs(text)
        if lp is not None:
            lp = logprobs.joined(logprobs.echoed(prompt, self.job.logprobs or 0), lp)
        return prompt + text, lp

    def _chunk(self, choices: list[dict[str, Any]], usage_: dict[str, Any] | None) -> bytes:
        obj: dict[str, Any] = {
            "id": self.rid,
            "object": self.object,
            "created": self.created,
            "model": self.job.model,
            "choices": choices,
        }
        if usage_ is not None:
            obj["usage"] = usage_
        return sse(obj)

    def first(self) -> bytes:
        """The opening chunk: the assistant role (chat only)."""
        if not self.job.chat:
            return b""
        delta = {"role": "assistant", "content": ""}
        choice = {"index": self.index, "delta": delta, "logprobs": None, "finish_reason": None}
        return self._chunk([choice], None)

    def delta(
        self,
        text: str,
        finish: str | None,
        usage_: dict[str, Any] | None,
        stop_reason: str | None = None,
    ) -> bytes:
        """The chunk of the next `text`; the last (`finish` given) names vLLM's `stop_reason`,
        the stop string that ended the choice (None: none did)."""
        choice: dict[str, Any]
        if self.job.tool is not None:
            if not text and finish is None:
                return b""  # vLLM writes no chunk until the call has text
            lp = self._logprobs(text)
            choice = {"index": self.index, "delta": self._call_delta(text), "logprobs": lp}
            finish = self._finish(finish)
        elif self.job.chat:
            lp = self._logprobs(text)
            choice = {"index": self.index, "delta": {"content": text}, "logprobs": lp}
        else:
            text, lp = self._text(text)
            choice = {"index": self.index, "text": text, "logprobs": lp}
        choice["finish_reason"] = finish
        if finish is not None or not self.job.chat:
            choice["stop_reason"] = stop_reason if finish is not None else None
        return self._chunk([choice], usage_)

    def usage_chunk(self, usage_: dict[str, Any]) -> bytes:
        return self._chunk([], usage_)

    def tail(self, usage_: dict[str, Any]) -> bytes:
        """What follows the last token: the usage chunk when asked for, and [DONE]."""
        return (self.usage_chunk(usage_) if self.job.include_usage else b"") + DONE

    def error(self, message: str) -> bytes:
        """The in-stream error that ends a stream, and [DONE]."""
        return error_frame(message) + DONE

    def full(
        self, text: str, finish: str, usage_: dict[str, Any], stop_reason: str | None = None
    ) -> bytes:
        """The non-streaming response."""
        return self.body([self.full_choice(text, finish, stop_reason)], usage_)

    def full_choice(self, text: str, finish: str, stop_reason: str | None = None) -> dict[str, Any]:
        """This choice of the non-streaming response; `stop_reason` as for `delta`."""
        choice: dict[str, Any]
        if self.job.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": []}
            if self.job.tool is not None:
                call = {"name": self.job.tool, "arguments": text}
                message["content"] = ""
                message["tool_calls"] = [
                    {"id": self._call_id, "type": "function", "function": call}
                ]
                finish = self._finish(finish) or finish
            message["reasoning_content"] = None
            choice = {"index": self.index, "message": message}
            choice["logprobs"] = self._logprobs(text)
        else:
            text, lp = self._text(text)
            choice = {"index": self.index, "text": text, "logprobs": lp}
        choice["finish_reason"] = finish
        choice["stop_reason"] = stop_reason
        return choice

    def _finish(self, finish: str | None) -> str | None:
        """A tool call's finish reason: "tool_calls" for "required", the engine's for a named
        function (vLLM's, after OpenAI's)."""
        return "tool_calls" if finish == "stop" and self.job.tool_required else finish

    def _call_delta(self, text: str) -> dict[str, Any]:
        """A streamed tool call's next arguments; the first delta names the call."""
        if self._call_named:
            return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
        self._call_named = True
        call = {"name": self.job.tool, "arguments": text}
        return {
            "tool_calls": [{"id": self._call_id, "type": "function", "index": 0, "function": call}]
        }

    def body(self, choices: list[dict[str, Any]], usage_: dict[str, Any]) -> bytes:
        """The non-streaming response of `choices`."""
        return encode(
            {
                "id": self.rid,
                "object": "chat.completion" if self.job.chat else "text_completion",
                "created": self.created,
                "model": self.job.model,
                "choices": choices,
                "usage": usage_,
            }
        )
