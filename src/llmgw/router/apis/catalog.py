"""The APIs passed through beside chat and completions: what the router reads of each.

Each route (`ROUTES`) names an `Api`: where its model is (the JSON body, or a
multipart form's field), whether the model may be left out, what routes it
(`key`: the conversation, rewritten to chat's shape so one conversation keeps
its replica whichever API carries it, `conversation.py`), which client headers
go on to the engine, how its usage reads (`apiusage.py`), and the shape of its
errors and of the frame that ends a broken stream (OpenAI's, or Anthropic's for
`/v1/messages`: `anthropic.py`). Chat, completions and embeddings are not here:
the proxy serves them itself, on its leanest path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from llmgw.router.apis import anthropic, conversation
from llmgw.router.apis import usage as apiusage
from llmgw.router.request import inband
from llmgw.router.routing.affinity import NO_KEY, RouteKey, route_key
from llmgw.wire.answerusage import Usage
from llmgw.wire.errors import error_body

KeyOf = Callable[[dict[str, Any], str | None], RouteKey]


def _no_key(doc: dict[str, Any], session: str | None) -> RouteKey:
    return NO_KEY


def _prompt_key(field: str) -> KeyOf:
    """The key of a request whose shared text is one field (rerank's query)."""

    def key(doc: dict[str, Any], session: str | None) -> RouteKey:
        text = doc.get(field)
        if not isinstance(text, str) or not text:
            return NO_KEY
        return route_key({"model": doc.get("model", ""), "prompt": text}, session)

    return key


def openai_stream_error(message: str, code: int) -> bytes:
    """A Responses stream's error event: `event: error`, OpenAI's error object in it
    (the openai package raises on a data object with `error`)."""
    body = error_body(message, type="upstream_error", code=code)
    return b"event: error\ndata: " + body + b"\n\n"


class Api:
    """One passed-through route's reading rules (see the module docstring)."""

    __slots__ = (
        "anthropic",
        "error_also",
        "error_mark",
        "form",
        "key",
        "metered",
        "model_optional",
        "name",
        "openers",
        "pass_headers",
        "priority",
        "stream_error",
        "stream_usage",
        "usage_of",
    )

    def __init__(
        self,
        name: str,
        *,
        key: KeyOf = _no_key,
        usage_of: Callable[[bytes], Usage | None] = apiusage.openai_usage,
        stream_usage: Callable[[], apiusage.EventUsage] | None = None,
        model_optional: bool = False,
        form: bool = False,
        is_anthropic: bool = False,
        priority: bool = False,
        error_also: tuple[bytes, ...] = (),
        openers: tuple[bytes, ...] = (),
        metered: bool = True,
    ) -> None:
        self.name = name
        self.key = key
        self.usage_of = usage_of
        self.stream_usage = stream_usage
        # vLLM lets tokenize, detokenize, rerank and score leave the model out (llama.cpp's
        # /tokenize has none): the router then routes to its one model, if it has one.
        self.model_optional = model_optional
        # multipart/form-data (audio uploads): the model is a form field.
        self.form = form
        self.anthropic = is_anthropic
        # vLLM's request for the route has a `priority` field: an engine with priority
        # scheduling gets the key's band there (router/request/enginepriority.py).
        self.priority = priority
        self.pass_headers: tuple[str, ...] = anthropic.PASSED_ON if is_anthropic else ()
        # What opens an engine's error frame in its streams (inband.py), and other
        # openings looked for too (the Responses API's own error event, either order).
        self.error_mark = inband.ANTHROPIC_MARK if is_anthropic else inband.MARK
        self.error_also = error_also
        # The event types its streams open with that carry no output (inband.py;
        # empty: chat's role opener): an engine's error right after them is retried.
        self.openers = openers
        # False: the engine only counts tokens (tokenize, count_tokens), so a request
        # costs its key one request but none of its tokens per minute or its budget.
        self.metered = metered
        self.stream_error: Callable[[str, int], bytes] = (
            anthropic.stream_error if is_anthropic else openai_stream_error
        )


RESPONSES: Final = Api(
    "responses",
    key=conversation.responses_key,
    usage_of=apiusage.responses_usage,
    stream_usage=apiusage.ResponsesStreamUsage,
    priority=True,
    error_also=(inband.RESPONSES_MARK, inband.RESPONSES_CODE_MARK),
    openers=inband.RESPONSES_OPENERS,
)
MESSAGES: Final = Api(
    "messages",
    key=conversation.messages_key,
    usage_of=apiusage.anthropic_usage,
    stream_usage=apiusage.AnthropicStreamUsage,
    is_anthropic=True,
    openers=inband.MESSAGES_OPENERS,
)
COUNT_TOKENS: Final = Api("count_tokens", is_anthropic=True, metered=False)
TOKENIZE: Final = Api("tokenize", key=route_key, model_optional=True, metered=False)
DETOKENIZE: Final = Api("detokenize", model_optional=True, metered=False)
RERANK: Final = Api("rerank", key=_prompt_key("query"), model_optional=True)
SCORE: Final = Api("score", key=_prompt_key("text_1"), model_optional=True)
TRANSCRIBE: Final = Api("audio", form=True)
SPEECH: Final = Api("speech")

# Path → its rules. Each is forwarded to the engine under the same path.
ROUTES: Final[dict[str, Api]] = {
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
    "/v1/messages/count_tokens": COUNT_TOKENS,
    "/tokenize": TOKENIZE,
    "/detokenize": DETOKENIZE,
    "/v1/rerank": RERANK,
    "/rerank": RERANK,
    # vLLM's Cohere-compatible path (the cohere package's v2 client calls it).
    "/v2/rerank": RERANK,
    "/v1/score": SCORE,
    "/score": SCORE,
    "/v1/audio/transcriptions": TRANSCRIBE,
    "/v1/audio/translations": TRANSCRIBE,
    "/v1/audio/speech": SPEECH,
}

# Anthropic's clients call every path under this one (Messages, token counting,
# batches ...): the router answers any of them it does not serve in Anthropic's error
# shape (`anthropic_path`), as the ones it serves.
MESSAGES_PATH: Final = "/v1/messages"


def anthropic_path(path: str) -> bool:
    """Whether `path` is /v1/messages or under it: Anthropic's errors there, even a
    404 for a path the router does not serve (a trailing slash, batches)."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


# The multipart upload routes: their bodies may be up to max_upload_bytes, not
# max_body_bytes (the server's `upload_paths`).
UPLOAD_PATHS: Final = frozenset(path for path, api in ROUTES.items() if api.form)

# Path → the error body of what the router's server answers there before any handler
# (a head it cannot take, 400; a late head, 408): Anthropic's on the Messages paths,
# OpenAI's (the edge's own) elsewhere.
EDGE_ERRORS: Final[dict[str, Callable[[int, str], bytes]]] = {
    path: anthropic.error_body for path, api in ROUTES.items() if api.anthropic
}
