"""The OpenAI error shape, used by the router, the controller's admin API and the sim-engine.

`{"error": {"message", "type", "param", "code"}}` (OpenAI's and vLLM's).
"""

from __future__ import annotations

import msgspec


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    message: str
    type: str
    param: str | None = None
    # OpenAI sends a string id or null; vLLM sends the integer HTTP status. Clients
    # must map on the HTTP status, so either is accepted.
    code: str | int | None = None


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    error: ErrorDetail


def error_body(
    message: str,
    *,
    type: str,
    code: str | int | None = None,
    param: str | None = None,
) -> bytes:
    """Encode one error body; the single place the OpenAI error shape is written."""
    return msgspec.json.encode(
        ErrorBody(error=ErrorDetail(message=message, type=type, param=param, code=code))
    )
