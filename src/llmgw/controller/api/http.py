"""Controller refusals as HTTP answers: the one place a status code is chosen.

Each class of controller/errors.py maps to (status, OpenAI error `type`); a
subclass not listed takes its nearest listed ancestor's. 503s carry
`Retry-After: 1`: the condition (a standby, a full long-poll table, the
database) is expected to pass, and the caller should come back.
"""

from __future__ import annotations

from llmgw.controller.errors import (
    AgentSilent,
    Busy,
    Conflict,
    ControllerRefusal,
    DoesNotExist,
    Forbidden,
    InvalidRequest,
    InvalidSpec,
    NotLeading,
    StoreUnavailable,
    TokenRejected,
)

STATUS: dict[type[ControllerRefusal], tuple[int, str]] = {
    ControllerRefusal: (500, "server_error"),
    InvalidRequest: (400, "invalid_request_error"),
    InvalidSpec: (422, "invalid_request_error"),
    TokenRejected: (401, "authentication_error"),
    Forbidden: (403, "permission_error"),
    DoesNotExist: (404, "not_found_error"),
    Conflict: (409, "conflict_error"),
    NotLeading: (503, "not_leader"),
    Busy: (503, "server_error"),
    AgentSilent: (504, "server_error"),
    StoreUnavailable: (503, "server_error"),
}


def http_status(exc: ControllerRefusal) -> tuple[int, str]:
    """(status, error type) for a refusal: its class's entry, else its nearest ancestor's."""
    for cls in type(exc).__mro__:
        found = STATUS.get(cls)
        if found is not None:
            return found
    return STATUS[ControllerRefusal]


def retry_after(status: int) -> dict[str, str] | None:
    """Headers a refusal's answer carries: a 503 asks the caller to retry in a second."""
    return {"Retry-After": "1"} if status == 503 else None
