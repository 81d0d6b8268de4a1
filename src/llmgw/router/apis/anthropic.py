"""Anthropic's Messages API at the router's edge: its key header, its error shape, its stream error.

Anthropic's clients send the key as `x-api-key` (or `Authorization: Bearer`),
and expect every error as `{"type": "error", "error": {"type", "message"}}`,
its `type` named after the HTTP status (400 invalid_request_error, 401
authentication_error, 403 permission_error, 404 not_found_error, 413
request_too_large, 429 rate_limit_error, 500 api_error, 503 and 529
overloaded_error, 504 timeout_error). The router writes its own errors in
OpenAI's shape, as for every route; for `/v1/messages` they are reshaped
here on the way out, and so is an engine's error answer that is not in
Anthropic's shape already (llama.cpp's server answers errors in OpenAI's). A
stream that breaks after its head gets Anthropic's `event: error` frame, which
the anthropic package raises as an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

# Client headers that go on to the engine with a Messages request.
PASSED_ON: Final = ("anthropic-version", "anthropic-beta")

_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class _Detail(msgspec.Struct):
    type: str
    message: str


class _Error(msgspec.Struct):
    error: _Detail
    type: str = "error"


_encode: Final = msgspec.json.Encoder().encode
_decode: Final = msgspec.json.Decoder().decode


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    got = _TYPES.get(status)
    if got is not None:
        return got
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str) -> bytes:
    return _encode(_Error(error=_Detail(type=error_type(status), message=message)))


def reshape(status: int, body: bytes) -> bytes:
    """An error answer's body in Anthropic's shape (one already in it is kept as is)."""
    try:
        doc: Any = _decode(body)
    except msgspec.DecodeError:
        doc = None
    if isinstance(doc, dict):
        if doc.get("type") == "error" and isinstance(doc.get("error"), dict):
            return body
        err = doc.get("error")
        message = err.get("message") if isinstance(err, dict) else err
        if not isinstance(message, str):
            message = doc.get("message") if isinstance(doc.get("message"), str) else None
        if isinstance(message, str):
            return error_body(status, message)
    text = body.decode("utf-8", "replace").strip()[:500]
    return error_body(status, text or f"The engine answered {status}.")


def stream_error(message: str, code: int) -> bytes:
    """The frame that ends a Messages stream that broke after its head."""
    return b"event: error\ndata: " + error_body(code, message) + b"\n\n"


def authorization(headers: Mapping[str, str]) -> str | None:
    """The client's key as an Authorization value: `x-api-key`, else `Authorization`.

    The one rule for every route Anthropic's clients call: the Messages routes
    (apis/passthrough.py) and the model list and model (request/listing.py)."""
    key = headers.get("x-api-key")
    if key:
        return "Bearer " + key
    return headers.get("Authorization")
