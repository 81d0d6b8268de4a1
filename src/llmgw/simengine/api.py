"""The OpenAI surface as vLLM (≥ 0.10.1) speaks it: request validation and response bodies.

Errors are `{"error": {"message", "type", "param", "code": <HTTP status>}}`
with vLLM's exception-like types. Validation order follows
vLLM: the JSON, then the model, then the sampling parameters, then the
prompt's length against --max-model-len.

Deviation, on purpose: a body without `model` is a 400 here (vLLM would use
its only model), so tests of the router's "missing model" path have an
engine that agrees with it (docs/router.md). `usage.prompt_tokens_details`
(cached tokens) is always present, as with vLLM's
`--enable-prompt-tokens-details`. Only `n = 1` is supported.

`priority` (an integer, default 0, lower served first) is vLLM's: under
`--scheduling-policy fcfs` anything but 0 is refused with vLLM's message, after
the prompt's length is checked, as vLLM's processor does. It is bounded to a
32-bit int, which vLLM does not do: past that a body is a 400, as any bad type.
"""

from __future__ import annotations

import base64
import dataclasses
import random
import struct
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol, TypeVar

import msgspec

from llmgw.simengine import logprobs, tokenizer
from llmgw.simengine.batcher import PRIORITY
from llmgw.simengine.config import SimConfig
from llmgw.wire.errors import error_body

ERROR_TYPES = {
    400: "BadRequestError",
    403: "ForbiddenError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    500: "InternalServerError",
}


class SimApiError(Exception):
    """A request the engine refuses; rendered as vLLM's error body with `status`."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        return error_body(
            self.message,
            type=ERROR_TYPES.get(self.status, "InternalServerError"),
            code=self.status,
            param=self.param,
        )


# A request's priority: vLLM takes any integer; a 32-bit bound keeps a hostile
# 10**30 a validation error.
MAX_PRIORITY = 2**31 - 1
Priority = Annotated[int, msgspec.Meta(ge=-MAX_PRIORITY, le=MAX_PRIORITY)]


class StreamOptions(msgspec.Struct, frozen=True):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


# Unknown fields are accepted and ignored (clients send temperature, top_p, …);
# the ones read here are type-checked.
class GenerationBody(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None = None
    max_tokens: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int | None = 1
    ignore_eos: bool | None = False
    min_tokens: int | None = 0
    priority: Priority = 0


class ChatBody(GenerationBody, frozen=True, kw_only=True):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0


class CompletionBody(GenerationBody, frozen=True, kw_only=True):
    prompt: Any = None
    logprobs: int | None = None
    echo: bool | None = False


class EmbeddingBody(msgspec.Struct, frozen=True, kw_only=True):
    input: Any = None
    model: str | None = None
    encoding_format: str | None = "float"
    dimensions: int | None = None
    priority: Priority = 0


@dataclass(frozen=True, slots=True)
class Job:
    """A validated generation request."""

    chat: bool
    model: str  # as the client named it; echoed in responses
    prompt_ids: list[int]
    max_tokens: int  # resolved: the request's, or what the context has left
    params_max_tokens: int | None  # as sent; None: not given
    stream: bool
    include_usage: bool
    continuous_usage: bool
    seed: int | None
    ignore_eos: bool
    min_tokens: int
    priority: int = 0  # lower is served first; nonzero only under the priority policy
    logprobs: int | None = None  # alternatives per token; None: no logprobs asked for
    echo: str | None = None  # the prompt's text, written before the reply; None: no echo
    echo_only: bool = False  # echo with max_tokens 0: the one token generated is not written


T = TypeVar("T")


def decode_as(raw: bytes, kind: type[T]) -> T:
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        raise SimApiError(400, f"Invalid request: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise SimApiError(400, f"Malformed JSON body: {exc}") from exc
    except RecursionError:
        raise SimApiError(400, "Malformed JSON body: nested too deeply") from None


def check_model(model: str | None, cfg: SimConfig, adapters: Container[str] = ()) -> str:
    """The request's model: a served name or a LoRA adapter's (`adapters`)."""
    if model is None:
        raise SimApiError(400, "The 'model' field is required.", param="model")
    if model not in cfg.served_model_names and model not in adapters:
        raise SimApiError(404, f"The model `{model}` does not exist.", param="model")
    return model


def _check_params(body: GenerationBody, max_tokens: int | None) -> None:
    if body.n is not None and body.n != 1:
        raise SimApiError(400, "The sim-engine supports n = 1 only.", param="n")
    if max_tokens is not None and max_tokens < 1:
        raise SimApiError(
            400, f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens"
        )
    if body.min_tokens is not None and body.min_tokens < 0:
        raise SimApiError(
            400, f"min_tokens must be greater than or equal to 0, got {body.min_tokens}."
        )


def check_priority(priority: int, cfg: SimConfig) -> None:
    """vLLM's refusal of a priority the fcfs policy cannot honour."""
    if priority != 0 and cfg.scheduling_policy != PRIORITY:
        raise SimApiError(400, f"Got priority {priority} but Priority scheduling is not enabled.")


def _check_vocab(ids: list[int], param: str) -> None:
    """Client-given token ids must be in the vocabulary (hashing them needs 4 unsigned bytes)."""
    for t in ids:
        if not 0 <= t < tokenizer.VOCAB_SIZE:
            raise SimApiError(400, f"Token id {t} is out of vocabulary", param=param)


def job_of(
    body: GenerationBody,
    cfg: SimConfig,
    ids: list[int],
    max_tokens: int | None,
    *,
    model: str,
    chat: bool,
    top_logprobs: int | None = None,
) -> Job:
    _check_params(body, max_tokens)
    n, limit = len(ids), cfg.max_model_len
    if n == 0:
        raise SimApiError(400, "The prompt is empty.", param="prompt")
    if n >= limit:
        raise too_long(n, cfg)
    if max_tokens is not None and n + max_tokens > limit:
        raise SimApiError(
            400,
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            f"maximum context length is {limit} tokens and your request has {n} input tokens "
            f"({max_tokens} > {limit} - {n}).",
            param="max_tokens",
        )
    check_priority(body.priority, cfg)
    opts = body.stream_options
    return Job(
        chat=chat,
        model=model,
        prompt_ids=ids,
        max_tokens=max_tokens if max_tokens is not None else limit - n,
        params_max_tokens=max_tokens,
        stream=bool(body.stream),
        include_usage=bool(opts and opts.include_usage),
        continuous_usage=bool(opts and opts.continuous_usage_stats),
        seed=body.seed,
        ignore_eos=bool(body.ignore_eos),
        min_tokens=body.min_tokens or 0,
        priority=body.priority,
        logprobs=top_logprobs,
    )


def _check_logprobs(n: int | None, param: str) -> None:
    """vLLM's bounds on the alternatives asked for per token."""
    if n is None:
        return
    if n < 0:
        raise SimApiError(400, f"`{param}` must be a positive value.", param=param)
    if n > logprobs.MAX_LOGPROBS:
        raise SimApiError(
            400,
            f"Requested sample logprobs of {n}, which is greater than max allowed: "
            f"{logprobs.MAX_LOGPROBS}",
            param=param,
        )


def _chat_logprobs(body: ChatBody) -> int | None:
    _check_logprobs(body.top_logprobs, "top_logprobs")
    if body.top_logprobs and not body.logprobs:
        raise SimApiError(
            400,
            "when using `top_logprobs`, `logprobs` must be set to true.",
            param="top_logprobs",
        )
    return (body.top_logprobs or 0) if body.logprobs else None


def too_long(n: int, cfg: SimConfig) -> SimApiError:
    """vLLM's refusal of a prompt of `n` tokens that leaves no room to generate."""
    return SimApiError(
        400,
        f"This model's maximum context length is {cfg.max_model_len} tokens. However, your "
        f"request has {n} input tokens. Please reduce the length of the input messages.",
    )


def chat_ids(
    messages: Iterable[Mapping[str, Any]], tools: Sequence[object] | None, cfg: SimConfig
) -> list[int]:
    """A chat prompt's ids, or vLLM's refusal when it leaves no room to generate.

    Counted before built (tokenization.sim's limit): a prompt past the context costs no
    list of its ids, which for a 7.9 MB body was millions of objects.
    """
    try:
        return tokenizer.chat_prompt_ids(messages, tools, limit=cfg.max_model_len - 1)
    except tokenizer.PromptTooLong as exc:
        raise too_long(exc.tokens, cfg) from None


def parse_chat(raw: bytes, cfg: SimConfig, adapters: Container[str] = ()) -> Job:
    body = decode_as(raw, ChatBody)
    model = check_model(body.model, cfg, adapters)
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    top = _chat_logprobs(body)
    ids = chat_ids(body.messages, body.tools, cfg)
    return job_of(body, cfg, ids, max_tokens, model=model, chat=True, top_logprobs=top)


def parse_completion(raw: bytes, cfg: SimConfig, adapters: Container[str] = ()) -> Job:
    """The job of a completions request of one prompt (a batch's first)."""
    return parse_completions(raw, cfg, adapters)[0]


def parse_completions(raw: bytes, cfg: SimConfig, adapters: Container[str] = ()) -> list[Job]:
    """One job per prompt: `prompt` may be a batch (strings or token-id lists), as vLLM's."""
    body = decode_as(raw, CompletionBody)
    model = check_model(body.model, cfg, adapters)
    _check_logprobs(body.logprobs, "logprobs")
    prompts = _batch(body.prompt)
    if len(prompts) > MAX_PROMPTS:
        raise SimApiError(
            400, f"prompt holds {len(prompts)} prompts; at most {MAX_PROMPTS}", param="prompt"
        )
    return [_completion_job(body, p, cfg, model) for p in prompts]


# A batch's bound: each prompt is a request in the engine, so a body of a million
# one-character prompts would cost a million of them (vLLM sets none).
MAX_PROMPTS = 2048


def _batch(prompt: object) -> list[Any]:
    """The prompts of a completions `prompt`: a list of strings or of token-id lists is a
    batch (a list of one is one prompt); anything else is one prompt, checked later."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return prompt
    return [prompt]


def _completion_job(body: CompletionBody, prompt: Any, cfg: SimConfig, model: str) -> Job:
    try:
        ids = tokenizer.prompt_ids_for_body({"prompt": prompt}, limit=cfg.max_model_len - 1)
    except tokenizer.PromptTooLong as exc:
        raise too_long(exc.tokens, cfg) from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise SimApiError(
            400, "prompt must be a string, token ids, or a list of either", param="prompt"
        ) from exc
    if not isinstance(prompt, str):
        _check_vocab(ids, "prompt")
    # OpenAI's (and vLLM's) completions default is 16 tokens.
    max_tokens = 16 if body.max_tokens is None else body.max_tokens
    # An echo without generation (how evaluation harnesses score a text): vLLM generates
    # one token and writes only the prompt.
    echo_only = bool(body.echo) and max_tokens == 0
    job = job_of(
        body,
        cfg,
        ids,
        1 if echo_only else max_tokens,
        model=model,
        chat=False,
        top_logprobs=body.logprobs,
    )
    if not body.echo:
        return job
    return dataclasses.replace(job, echo=_prompt_text(prompt, ids), echo_only=echo_only)


def _prompt_text(prompt: object, ids: list[int]) -> str:
    """The text of a completions prompt: as sent, or its token ids detokenized."""
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else tokenizer.output_text(ids)


# OpenAI's bound on an embeddings request's list of inputs: without one, a body of
# millions of one-character inputs costs a list of ids per input.
MAX_EMBEDDING_INPUTS = 2048


@dataclass(frozen=True, slots=True)
class EmbeddingJob:
    model: str
    inputs: list[list[int]]
    base64: bool
    dims: int


def parse_embeddings(raw: bytes, cfg: SimConfig) -> EmbeddingJob:
    body = decode_as(raw, EmbeddingBody)
    model = check_model(body.model, cfg)
    inp = body.input
    items: list[Any] = inp if isinstance(inp, list) and inp and not _is_ids(inp) else [inp]
    if len(items) > MAX_EMBEDDING_INPUTS:
        raise SimApiError(
            400,
            f"input holds {len(items)} items; at most {MAX_EMBEDDING_INPUTS} per request",
            param="input",
        )
    inputs: list[list[int]] = []
    for item in items:
        # Each input's length is checked before its ids are made or checked (as for prompts).
        if isinstance(item, str):
            n = 1 + tokenizer.text_tokens(item)
        elif isinstance(item, list) and _is_ids(item):
            n = len(item)
        else:
            raise SimApiError(
                400, "input must be a string, token ids, or a list of those", param="input"
            )
        if n > cfg.max_model_len:
            raise SimApiError(
                400, f"This model's maximum context length is {cfg.max_model_len} tokens."
            )
        if isinstance(item, str):
            inputs.append([tokenizer.BOS, *tokenizer.tokenize(item)])
        else:
            _check_vocab(item, "input")
            inputs.append(list(item))
    if body.encoding_format not in (None, "float", "base64"):
        raise SimApiError(
            400, "encoding_format must be 'float' or 'base64'", param="encoding_format"
        )
    dims = cfg.embedding_dim if body.dimensions is None else body.dimensions
    if not 1 <= dims <= cfg.embedding_dim:
        raise SimApiError(
            400, f"dimensions must be within [1, {cfg.embedding_dim}]", param="dimensions"
        )
    check_priority(body.priority, cfg)
    return EmbeddingJob(
        model=model, inputs=inputs, base64=body.encoding_format == "base64", dims=dims
    )


def _is_ids(v: list[Any]) -> bool:
    return bool(v) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def embedding(ids: list[int], dims: int) -> list[float]:
    """A deterministic unit vector for a token sequence."""
    rnd = random.Random(tokenizer.prompt_seed(ids))
    v = [rnd.uniform(-1.0, 1.0) for _ in range(dims)]
    norm = sum(x * x for x in v) ** 0.5 or 1.0
    return [x / norm for x in v]


def embedding_b64(v: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode("ascii")


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


_enc = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"


def sse(obj: object) -> bytes:
    return b"data: " + _enc.encode(obj) + b"\n\n"


def error_frame(message: str) -> bytes:
    """vLLM's mid-stream error event; `data: [DONE]` follows it."""
    return b"data: " + error_body(message, type="InternalServerError", code=500) + b"\n\n"


class AnyEncoder(Protocol):
    """What the engine writes a generation's answer with: this module's Encoder
    (chat, completions), responses.ResponsesEncoder, messages.MessagesEncoder."""

    def first(self) -> bytes: ...
    def delta(self, text: str, finish: str | None, usage_: dict[str, Any] | None) -> bytes: ...
    def tail(self, usage_: dict[str, Any]) -> bytes: ...
    def error(self, message: str) -> bytes: ...
    def full(self, text: str, finish: str, usage_: dict[str, Any]) -> bytes: ...


class Encoder:
    """Response bodies of one request (chat or completion), streaming and not; of one
    choice (`index`) when a completions batch has several."""

    def __init__(self, job: Job, rid: str, created: int, index: int = 0) -> None:
        self.job = job
        self.rid = rid
        self.created = created
        self.index = index
        self.object = "chat.completion.chunk" if job.chat else "text_completion"
        self._sent_tokens = 0  # generated tokens already written (logprobs' positions)
        self._sent_chars = 0  # characters of text already written (completions' offsets)
        self._echoed = False  # the prompt (echo) has been written

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
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return self._chunk([choice], None)

    def delta(self, text: str, finish: str | None, usage_: dict[str, Any] | None) -> bytes:
        choice: dict[str, Any]
        if self.job.chat:
            lp = self._logprobs(text)
            choice = {"index": self.index, "delta": {"content": text}, "logprobs": lp}
        else:
            text, lp = self._text(text)
            choice = {"index": self.index, "text": text, "logprobs": lp}
        choice["finish_reason"] = finish
        if finish is not None or not self.job.chat:
            choice["stop_reason"] = None
        return self._chunk([choice], usage_)

    def usage_chunk(self, usage_: dict[str, Any]) -> bytes:
        return self._chunk([], usage_)

    def tail(self, usage_: dict[str, Any]) -> bytes:
        """What follows the last token: the usage chunk when asked for, and [DONE]."""
        return (self.usage_chunk(usage_) if self.job.include_usage else b"") + DONE

    def error(self, message: str) -> bytes:
        """The in-stream error that ends a stream, and [DONE]."""
        return error_frame(message) + DONE

    def full(self, text: str, finish: str, usage_: dict[str, Any]) -> bytes:
        """The non-streaming response."""
        return self.body([self.full_choice(text, finish)], usage_)

    def full_choice(self, text: str, finish: str) -> dict[str, Any]:
        """This choice of the non-streaming response."""
        choice: dict[str, Any]
        if self.job.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": []}
            message["reasoning_content"] = None
            choice = {"index": self.index, "message": message}
            choice["logprobs"] = self._logprobs(text)
        else:
            text, lp = self._text(text)
            choice = {"index": self.index, "text": text, "logprobs": lp}
        choice["finish_reason"] = finish
        choice["stop_reason"] = None
        return choice

    def body(self, choices: list[dict[str, Any]], usage_: dict[str, Any]) -> bytes:
        """The non-streaming response of `choices`."""
        return _enc.encode(
            {
                "id": self.rid,
                "object": "chat.completion" if self.job.chat else "text_completion",
                "created": self.created,
                "model": self.job.model,
                "choices": choices,
                "usage": usage_,
            }
        )
