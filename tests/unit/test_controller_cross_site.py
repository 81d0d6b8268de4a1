"""A web page cannot write to the controller, nor read one without a token by rebinding
a name of its own to it (controller/api/auth.py, runtime/webpages.py).

A browser sends a cross-site POST of `text/plain` or without a body with no preflight,
and a controller on loopback without a token takes any write: without this check any
page the operator opens could apply a spec (engine, args, source) or drain a node.
"""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from llmgw.controller.api.auth import authorize
from llmgw.controller.errors import Forbidden
from llmgw.runtime.webpages import OwnNames

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


class TestRebindingPages:
    """Without a token the controller answers its own names only; a token opens any."""

    NAMES = OwnNames(bind="127.0.0.1", allowed=("gw.internal",))

    @pytest.mark.parametrize("path", ["/admin/keys", "/admin/events", "/healthz", "/status"])
    def test_a_foreign_host_is_forbidden_without_a_token(self, path: str) -> None:
        """A read whose Host is a name the controller does not have is 403."""
        request = make_mocked_request("GET", path, headers={"Host": "evil.example:8081"})
        with pytest.raises(Forbidden, match="allowed_hosts"):
            authorize(request, None, None, names=self.NAMES)

    @pytest.mark.parametrize("host", ["127.0.0.1:8081", "localhost:8081", "gw.internal"])
    def test_its_own_names_are_answered(self, host: str) -> None:
        """An IP literal, localhost and an allowed name pass."""
        request = make_mocked_request("GET", "/admin/keys", headers={"Host": host})
        authorize(request, None, None, names=self.NAMES)

    def test_a_token_opens_any_name(self) -> None:
        """A page cannot know the token: with one, Host is not asked."""
        headers = {"Host": "evil.example", "Authorization": "Bearer adm"}
        authorize(
            make_mocked_request("GET", "/admin/keys", headers=headers),
            "adm",
            None,
            names=self.NAMES,
        )

    def test_the_metrics_token_opens_any_name(self) -> None:
        """/metrics with the metrics token on a controller without --token is answered."""
        headers = {"Host": "evil.example", "Authorization": "Bearer met"}
        request = make_mocked_request("GET", "/metrics", headers=headers)
        authorize(request, None, None, "met", names=self.NAMES)

    def test_open_routes_of_a_guarded_controller_take_any_name(self) -> None:
        """With a token, /healthz carries no fleet data and probes reach it by name."""
        request = make_mocked_request("GET", "/healthz", headers={"Host": "ctl.example"})
        authorize(request, "adm", None, names=self.NAMES)
