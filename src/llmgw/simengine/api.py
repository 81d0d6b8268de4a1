"""The OpenAI surface as vLLM (≥ 0.10.1) speaks it: request validation and response bodies.

Errors are `{"error": {"message", "type", "param", "code": <HTTP status>}}`
with vLLM's exception-like types. Validation order follows
vLLM: the JSON, then the model, then the sampling parameters, then the
prompt's length against --max-model-len.

Deviation, on purpose: a body without `model` is a 400 here (vLLM would use
its only model), so tests of the router's "missing model" path have an
engine that agrees with it (docs/router.md). `usage.prompt_tokens_details`
(cached tokens) is always present, as with vLLM's
`--enable-prompt-tokens-details`. `n` and the other sampling parameters: sampling.py.

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
from typing import Annotated, Any, TypeVar

import msgspec

from llmgw.simengine import logprobs, sampling, structured, tokenizer
from llmgw.simengine.batcher import PRIORITY
from llmgw.simengine.config import SimConfig
from llmgw.simengine.errors import ERROR_TYPES as ERROR_TYPES  # re-exported for handlers
from llmgw.simengine.errors import SimApiError as SimApiError  # re-exported for handlers
from llmgw.wire.errors import error_body

# A request's priority: vLLM takes any integer; a 32-bit bound keeps a hostile
# 10**30 a validation error.
MAX_PRIORITY = 2**31 - 1
Priority = Annotated[int, msgspec.Meta(ge=-MAX_PRIORITY, le=MAX_PRIORITY)]


class StreamOptions(msgspec.Struct, frozen=True):
    # vLLM's defaults: once `stream_options` is given, usage is included unless refused.
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


# Unknown fields are accepted and ignored (clients send logit_bias, user, …);
# the ones read here are type-checked, the sampling ones against vLLM's bounds.
class GenerationBody(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None = None
    max_tokens: int | None = None
    stream: bool | None = False
    # As sent: vLLM tells `{}` (allowed without a stream) from a non-empty object.
    stream_options: dict[str, Any] | None = None
    seed: int | None = None
    n: int | None = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    ignore_eos: bool | None = False
    min_tokens: int | None = 0
    priority: Priority = 0


class PenaltiesBody(GenerationBody, frozen=True, kw_only=True):
    """Chat's and completions' sampling parameters beyond those every API reads."""

    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None


class ChatBody(PenaltiesBody, frozen=True, kw_only=True):
    messages: list[dict[str, Any]]
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool | None = False
    tool_choice: Any = None
    response_format: Any = None
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0


class CompletionBody(PenaltiesBody, frozen=True, kw_only=True):
    prompt: Any = None
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool | None = False
    response_format: Any = None
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
    n: int = 1  # choices (sequences in the engine) for this prompt
    stops: tuple[str, ...] = ()  # stop strings, in the request's order
    include_stop: bool = False  # include_stop_str_in_output
    script: str | None = None  # the reply's text when fixed (structured output); None: words
    tool: str | None = None  # the function the reply calls, `script` its arguments; None: none
    tool_required: bool = False  # tool_choice "required" (finish_reason tool_calls), not named


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
    """vLLM's SamplingParams checks, in its order, of the parameters this API's body has."""
    if isinstance(body, PenaltiesBody):
        sampling.check_penalties(
            presence=body.presence_penalty,
            frequency=body.frequency_penalty,
            repetition=body.repetition_penalty,
        )
    sampling.check_bounds(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k)
    if isinstance(body, PenaltiesBody) and body.min_p is not None and not 0 <= body.min_p <= 1:
        raise SimApiError(400, f"min_p must be in [0, 1], got {body.min_p}.")
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
    include_usage, continuous_usage = _usage_options(body.stream_options)
    return Job(
        chat=chat,
        model=model,
        prompt_ids=ids,
        max_tokens=max_tokens if max_tokens is not None else limit - n,
        params_max_tokens=max_tokens,
        stream=bool(body.stream),
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        seed=body.seed,
        ignore_eos=bool(body.ignore_eos),
        min_tokens=body.min_tokens or 0,
        priority=body.priority,
        logprobs=top_logprobs,
    )


def _usage_options(raw: dict[str, Any] | None) -> tuple[bool, bool]:
    """(include_usage, continuous_usage) of a stream, as vLLM's should_include_usage reads
    `stream_options`: continuous usage only with the final usage."""
    if raw is None:
        return False, False
    try:
        opts = msgspec.convert(raw, StreamOptions)
    except msgspec.ValidationError as exc:
        raise SimApiError(400, f"Invalid request: {exc}", param="stream_options") from exc
    include = bool(opts.include_usage)
    return include, include and bool(opts.continuous_usage_stats)


def check_stream_options(body: GenerationBody) -> None:
    """vLLM's refusal of stream options on a request that does not stream (chat and
    completions); an empty object passes, as in vLLM."""
    if body.stream_options and not body.stream:
        raise SimApiError(
            400,
            "Stream options can only be defined when `stream=True`.",
            param="stream_options",
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
    check_stream_options(body)
    call = structured.tool_call(body.tools, body.tool_choice)
    script = call[1] if call else structured.format_text(body.response_format)
    model = check_model(body.model, cfg, adapters)
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    top = _chat_logprobs(body)
    ids = chat_ids(body.messages, body.tools, cfg)
    job = job_of(body, cfg, ids, max_tokens, model=model, chat=True, top_logprobs=top)
    n = sampling.choices_n(body.n, body.temperature)
    stops = sampling.stop_strings(body.stop)
    return dataclasses.replace(
        job,
        n=n,
        stops=stops,
        include_stop=bool(body.include_stop_str_in_output),
        script=script,
        tool=call[0] if call else None,
        tool_required=bool(call and call[2]),
    )


def parse_completion(raw: bytes, cfg: SimConfig, adapters: Container[str] = ()) -> Job:
    """The job of a completions request of one prompt (a batch's first)."""
    return parse_completions(raw, cfg, adapters)[0]


def parse_completions(raw: bytes, cfg: SimConfig, adapters: Container[str] = ()) -> list[Job]:
    """One job per prompt: `prompt` may be a batch (strings or token-id lists), as vLLM's."""
    body = decode_as(raw, CompletionBody)
    check_stream_options(body)
    script = structured.format_text(body.response_format)
    model = check_model(body.model, cfg, adapters)
    _check_logprobs(body.logprobs, "logprobs")
    prompts = _batch(body.prompt)
    if len(prompts) > MAX_PROMPTS:
        raise SimApiError(
            400, f"prompt holds {len(prompts)} prompts; at most {MAX_PROMPTS}", param="prompt"
        )
    n = sampling.choices_n(body.n, body.temperature, len(prompts))
    stops = sampling.stop_strings(body.stop)
    include = bool(body.include_stop_str_in_output)
    return [
        dataclasses.replace(
            _completion_job(body, p, cfg, model),
            n=n,
            stops=stops,
            include_stop=include,
            script=script,
        )
        for p in prompts
    ]


# A batch's bound: each prompt is a request in the engine, so a body of a million
# one-character prompts would cost a million of them (vLLM sets none).
MAX_PROMPTS = 2048


_PROMPT_TYPES = "prompt must be a string, token ids, or a list of either"


def _batch(prompt: object) -> list[Any]:
    """The prompts of a completions `prompt`: a list of strings or of token-id lists is a
    batch (a list of one is one prompt); anything else is one prompt, checked later."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        # vLLM's prompt is a string, token ids, or a list of either: a list nested
        # deeper (`[[[1]]]`, `[["a"]]`) is its 400, not a prompt unwrapped to fit.
        if any(isinstance(p, list) and not all(isinstance(t, int) for t in p) for p in prompt):
            raise SimApiError(400, _PROMPT_TYPES, param="prompt")
        return prompt
    return [prompt]


def _completion_job(body: CompletionBody, prompt: Any, cfg: SimConfig, model: str) -> Job:
    try:
        ids = tokenizer.prompt_ids_for_body({"prompt": prompt}, limit=cfg.max_model_len - 1)
    except tokenizer.PromptTooLong as exc:
        raise too_long(exc.tokens, cfg) from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise SimApiError(400, _PROMPT_TYPES, param="prompt") from exc
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
encode = _enc.encode
DONE = b"data: [DONE]\n\n"


def sse(obj: object) -> bytes:
    return b"data: " + _enc.encode(obj) + b"\n\n"


def error_frame(message: str) -> bytes:
    """vLLM's mid-stream error event; `data: [DONE]` follows it."""
    return b"data: " + error_body(message, type="InternalServerError", code=500) + b"\n\n"
