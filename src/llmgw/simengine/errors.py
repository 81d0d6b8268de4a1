"""The error every sim-engine handler refuses a request with, in vLLM's body."""

from __future__ import annotations

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
