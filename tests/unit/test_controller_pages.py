"""The cursor of the controller's paged lists (`GET /admin/keys`, `/admin/models`)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from llmgw.controller.api import pages
from llmgw.controller.errors import InvalidRequest


class TestCursorOfStoredNames:
    """Every name a page can end with is a cursor the next request may give."""

    @pytest.mark.parametrize(
        ("route", "names", "after"),
        [
            ("/admin/keys", pages.KEY_NAMES, "alice%0A"),
            ("/admin/models", pages.MODEL_NAMES, "qwen2%3A7b%0A"),
        ],
    )
    def test_a_name_stored_before_line_ends_were_refused(
        self, route: str, names: pages.NameSet, after: str
    ) -> None:
        """A key or model stored with a final line end (taken before 931e425) is a cursor."""
        req = make_mocked_request("GET", f"{route}?after={after}&limit=2")
        got = pages.cursor(req, names)
        assert got.after is not None
        assert got.after.endswith("\n")

    @pytest.mark.parametrize("after", ["alice%0A%0A", "ali%0Ace", "%0A"])
    def test_other_line_ends_are_refused(self, after: str) -> None:
        """Only one final line end, as a name stored then could have: no other."""
        req = make_mocked_request("GET", f"/admin/keys?after={after}")
        with pytest.raises(InvalidRequest):
            pages.cursor(req, pages.KEY_NAMES)
