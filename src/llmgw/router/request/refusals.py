"""The router's own error answers, in OpenAI's shape: 4xx and 503 before any routing.

Each is a `Whole` (http/answers.py) whose body is the one OpenAI error encoder's
(`wire.errors.error_body`). Apart from errors.py, the exception tree, because
that is imported before the compiled build is loaded and these are not.

A name the client sent (a model) is quoted through `quoted_name`: it can be as
long as the body limit allows, and quoted whole each refusal sent megabytes back,
into every client and log that keeps the message (the Messages API's errors are
these, reshaped).
"""

from __future__ import annotations

from llmgw.router.errors import FlowRefused, NoReplica
from llmgw.router.http.answers import JSON, Whole, whole
from llmgw.wire.errors import error_body

# How much of a client's name an error quotes: more than any model name (128), less
# than a line a person reads.
QUOTED_NAME_CHARS = 256
# The longest Retry-After left to the SDKs' own retries (`retry_after`): a minute,
# the longest a rate limit asks for. The openai package honours up to two minutes,
# the anthropic one any wait at all.
SDK_RETRY_MAX_S = 60


def quoted_name(name: str) -> str:
    """`name` as a refusal quotes it: whole up to QUOTED_NAME_CHARS characters, else
    its first ones and an ellipsis."""
    if len(name) <= QUOTED_NAME_CHARS:
        return name
    return name[:QUOTED_NAME_CHARS] + "…"


def error_response(
    status: int,
    message: str,
    *,
    type: str,
    code: str | int | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> Whole:
    """An OpenAI-shaped error answer."""
    body = error_body(message, type=type, code=code, param=param)
    return whole(status, body, headers, content_type=JSON)


def bad_request(message: str, *, param: str | None = None) -> Whole:
    return error_response(400, message, type="invalid_request_error", param=param)


def unauthorized(message: str = "Invalid or missing API key.") -> Whole:
    return error_response(
        401,
        message,
        type="invalid_request_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def model_not_found(model: str) -> Whole:
    return error_response(
        404,
        f"The model `{quoted_name(model)}` does not exist.",
        type="invalid_request_error",
        code="model_not_found",
        param="model",
    )


def too_large(limit: int) -> Whole:
    return error_response(
        413,
        f"Request body is larger than {limit} bytes.",
        type="invalid_request_error",
        code="request_too_large",
    )


def retry_after(seconds: int, *, again: bool = True) -> dict[str, str]:
    """Retry-After, and `x-should-retry`, which the openai and anthropic packages obey
    over their own rule (they retry every 408, 409, 429 and 5xx twice by default).

    `again`: whether a client's retry after the wait can help (a rate limit, a full
    queue, a moment's congestion). "false" where it cannot, the router having waited
    or retried for the client already (docs/router.md#retries-the-routers-and-the-sdks),
    and past SDK_RETRY_MAX_S: the anthropic package sleeps whatever Retry-After says
    first, so minutes there would hold a call for minutes before the application hears
    of it."""
    retry = "true" if again and seconds <= SDK_RETRY_MAX_S else "false"
    return {"Retry-After": str(seconds), "x-should-retry": retry}


def unavailable(exc: NoReplica) -> Whole:
    return error_response(
        503,
        f"No replica of `{quoted_name(exc.model)}` is available: {exc.why}.",
        type="service_unavailable",
        code=exc.code,
        headers=retry_after(exc.retry_after_s, again=exc.again),
    )


def flow_refused(exc: FlowRefused) -> Whole:
    return error_response(
        exc.status,
        f"Every replica of `{quoted_name(exc.model)}` is at capacity: {exc.why}.",
        type="rate_limit_exceeded" if exc.status == 429 else "service_unavailable",
        code=exc.code,
        # A full queue (429) frees as requests finish; a wait to the band's bound (503)
        # would be waited again.
        headers=retry_after(exc.retry_after_s, again=exc.status == 429),
    )


def model_not_allowed(name: str, model: str) -> Whole:
    """The refusal of `model` to the key `name`, whose `models` do not hold it."""
    return error_response(
        403,
        f"The API key {name!r} may not use the model {quoted_name(model)!r}.",
        type="invalid_request_error",
        code="model_not_allowed",
        param="model",
    )
