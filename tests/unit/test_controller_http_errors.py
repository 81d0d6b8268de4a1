"""Controller refusals become HTTP answers in one table (controller/api/http.py)."""

from __future__ import annotations

import inspect

import pytest

from llmgw.controller import errors
from llmgw.controller.api.http import STATUS, http_status, retry_after
from llmgw.controller.errors import (
    Busy,
    Conflict,
    ControllerRefusal,
    DoesNotExist,
    InvalidRequest,
    InvalidSpec,
    NotLeading,
    StoreUnavailable,
    TokenRejected,
)


class TestHttpStatus:
    """Each controller refusal maps to one HTTP status in one table."""

    @pytest.mark.parametrize(
        ("exc", "status", "kind"),
        [
            (InvalidRequest("x"), 400, "invalid_request_error"),
            (InvalidSpec("x"), 422, "invalid_request_error"),
            (TokenRejected("x"), 401, "authentication_error"),
            (DoesNotExist("x"), 404, "not_found_error"),
            (Conflict("x"), 409, "conflict_error"),
            (NotLeading("x"), 503, "not_leader"),
            (Busy("x"), 503, "server_error"),
            (StoreUnavailable("x"), 503, "server_error"),
            (ControllerRefusal("x"), 500, "server_error"),
        ],
    )
    def test_each_refusal_has_its_status(
        self, exc: ControllerRefusal, status: int, kind: str
    ) -> None:
        """Each refusal has its status."""
        assert http_status(exc) == (status, kind)

    def test_every_refusal_class_is_in_the_table(self) -> None:
        """A new refusal must be given its status, not fall back to an ancestor's unnoticed."""
        defined = {
            cls
            for _, cls in inspect.getmembers(errors, inspect.isclass)
            if issubclass(cls, ControllerRefusal)
        }
        assert defined == set(STATUS)

    def test_an_unlisted_subclass_takes_its_nearest_ancestors_entry(self) -> None:
        """An unlisted subclass takes its nearest ancestor's entry."""

        class Narrower(InvalidSpec):
            pass

        assert http_status(Narrower("x")) == (422, "invalid_request_error")

    def test_only_503_asks_for_a_retry(self) -> None:
        """Only 503 asks for a retry."""
        assert retry_after(503) == {"Retry-After": "1"}
        assert retry_after(404) is None

    def test_refusals_carry_no_status(self) -> None:
        """Decision code says why, never how HTTP answers it."""
        exc = DoesNotExist("no model named 'm'", param="name")
        assert not hasattr(exc, "status")
        assert (exc.message, exc.param) == ("no model named 'm'", "name")
