"""A web page cannot write to the controller (controller/api/auth.py, refuse_web_writes).

A browser sends a cross-site POST of `text/plain` or without a body with no preflight,
and a controller on loopback without a token takes any write: without this check any
page the operator opens could apply a spec (engine, args, source) or drain a node.
"""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from llmgw.controller.api.auth import authorize
from llmgw.controller.errors import Forbidden

WRITES = [
    ("POST", "/admin/models"),
    ("POST", "/admin/nodes/n1/drain"),
    ("POST", "/admin/models/m/scale"),
    ("DELETE", "/admin/models/m"),
    ("POST", "/v1/agents/n1/heartbeat"),
]


class TestWebPagesCannotWrite:
    """Writes that a browser made are refused, whatever the token; other requests pass."""

    @pytest.mark.parametrize(("method", "path"), WRITES)
    @pytest.mark.parametrize(
        "headers",
        [
            {"Origin": "https://evil.example"},
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Origin": "http://127.0.0.1:8081", "Sec-Fetch-Site": "same-origin"},
        ],
    )
    def test_a_write_from_a_web_page_is_forbidden_without_a_token(
        self, method: str, path: str, headers: dict[str, str]
    ) -> None:
        """A write carrying a browser's Origin or Sec-Fetch-Site is 403 on an open controller."""
        request = make_mocked_request(method, path, headers=headers)
        with pytest.raises(Forbidden, match="web page"):
            authorize(request, None, None)

    def test_the_admin_token_does_not_make_it_a_program(self) -> None:
        """With the admin token too, a write from a web page is refused."""
        headers = {"Origin": "https://evil.example", "Authorization": "Bearer adm"}
        request = make_mocked_request("POST", "/admin/models", headers=headers)
        with pytest.raises(Forbidden):
            authorize(request, "adm", None)

    @pytest.mark.parametrize(("method", "path"), WRITES)
    def test_a_program_may_write(self, method: str, path: str) -> None:
        """ctl, agents and routers send neither header: their writes pass as before."""
        authorize(make_mocked_request(method, path, headers={}), None, None)

    @pytest.mark.parametrize("method", ["GET", "HEAD"])
    def test_a_web_page_may_read(self, method: str) -> None:
        """The status page reads with its token: a read with an Origin passes."""
        headers = {"Origin": "http://127.0.0.1:8081", "Sec-Fetch-Site": "same-origin"}
        authorize(make_mocked_request(method, "/admin/status", headers=headers), None, None)
