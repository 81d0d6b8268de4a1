"""The controller's exception tree, translated to HTTP in exactly one place (api/routes.py).

    ApiError                   an answer for the client, in the OpenAI error shape
    ├── InvalidRequest    400  malformed body or query; message names the field
    │   └── InvalidSpec   422  well-formed JSON that breaks a rule of the type
    ├── Unauthorized      401  missing or wrong bearer token
    ├── NotFound          404  unknown node, model or replica
    ├── Conflict          409  valid alone, contradicts what exists (a name taken)
    ├── NotLeading        503  a write reached a standby; the caller retries elsewhere/later
    ├── Busy              503  too many long-polls held; retry shortly
    └── StoreUnavailable  503  the database refused the write; nothing was applied

Everything else escaping a handler is a bug and answers 500 server_error.
"""

from __future__ import annotations


class ApiError(Exception):
    status = 500
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequest(ApiError):
    status = 400
    type = "invalid_request_error"


class InvalidSpec(InvalidRequest):
    status = 422


class Unauthorized(ApiError):
    status = 401
    type = "authentication_error"


class NotFound(ApiError):
    status = 404
    type = "not_found_error"


class Conflict(ApiError):
    status = 409
    type = "conflict_error"


class NotLeading(ApiError):
    """Writes and heartbeats go to the leader; a standby says so instead of acting."""

    status = 503
    type = "not_leader"


class Busy(ApiError):
    status = 503
    type = "server_error"


class StoreUnavailable(ApiError):
    """The store refused the transaction: nothing was applied, in memory or on disk."""

    status = 503
    type = "server_error"
