"""What a web page may not ask of a server of ours (runtime/webpages.py).

Without these checks a page the operator opens could make the browser write to a
tokenless server on loopback (a simple cross-site POST needs no preflight), or point its
own host name at 127.0.0.1 and read what such a server answers (DNS rebinding).
"""

from __future__ import annotations

import msgspec
import pytest
from multidict import CIMultiDict

from llmgw.agent import config as agent_config
from llmgw.agent.config import AgentConfigError
from llmgw.controller import config as controller_config
from llmgw.router.config import RouterConfig
from llmgw.runtime.webpages import SAFE_METHODS, OwnNames, host_name, host_problem, write_refusal


class TestWrites:
    """A write that carries a browser's marks is refused; reads and programs pass."""

    @pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
    @pytest.mark.parametrize(
        "headers",
        [
            {"Origin": "https://evil.example"},
            {"origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
            {"sec-fetch-site": "same-origin", "Origin": "http://127.0.0.1:8081"},
        ],
    )
    def test_a_browsers_write_is_refused(self, method: str, headers: dict[str, str]) -> None:
        """Any value of Origin or Sec-Fetch-Site, same-origin included, marks a web page."""
        assert write_refusal(method, CIMultiDict(headers)) is not None

    @pytest.mark.parametrize("method", sorted(SAFE_METHODS))
    def test_a_browsers_read_passes(self, method: str) -> None:
        """GET, HEAD and OPTIONS change nothing, so the status page may read."""
        headers = CIMultiDict({"Origin": "http://127.0.0.1:8081", "Sec-Fetch-Site": "same-origin"})
        assert write_refusal(method, headers) is None

    def test_a_programs_write_passes(self) -> None:
        """ctl, agents and routers send neither header."""
        assert write_refusal("POST", CIMultiDict({"Host": "127.0.0.1:8081"})) is None

    def test_the_refusal_says_what_to_use(self) -> None:
        """The message names the headers and what to use instead."""
        why = write_refusal("POST", CIMultiDict({"Origin": "null"}))
        assert why is not None
        assert "Origin" in why
        assert "llmgw ctl" in why


class TestHostName:
    """The name in a Host header, as compared."""

    @pytest.mark.parametrize(
        ("expected", "header"),
        [
            ("127.0.0.1", "127.0.0.1:8081"),
            ("localhost", "LocalHost:80"),
            ("localhost", "localhost."),
            ("::1", "[::1]:8081"),
            ("::1", "[::1]"),
            ("evil.example", "Evil.Example:8081"),
            ("evil.example", " evil.example "),
        ],
    )
    def test_port_brackets_case_and_trailing_dot_go(self, expected: str, header: str) -> None:
        """The port, IPv6 brackets, case, spaces and one trailing dot are not part of the name."""
        assert expected == host_name(header)


class TestOwnNames:
    """Which Host a server without a token answers: IPs, localhost, its bind name, allowed."""

    @pytest.mark.parametrize(
        "host",
        [
            "127.0.0.1:8081",
            "127.0.0.1",
            "localhost:8081",
            "LOCALHOST",
            "localhost.:8081",
            "[::1]:8081",
            "[::ffff:127.0.0.1]:8081",
            "10.1.2.3:8081",
            "[fe80::1%25eth0]:8081",
        ],
    )
    def test_ip_literals_and_localhost_pass(self, host: str) -> None:
        """A rebinding page is reached by its name, never by an IP literal or localhost."""
        assert OwnNames().allows(host)

    @pytest.mark.parametrize(
        "host",
        [
            "evil.example:8081",
            "evil.example",
            "127.0.0.1.nip.io:8081",
            "localhost.evil.example",
            "x",
            "[::1",
            "evil.example:8081\x00",
        ],
    )
    def test_other_names_are_refused(self, host: str) -> None:
        """Any other name may be one a hostile page pointed at 127.0.0.1."""
        names = OwnNames()
        assert not names.allows(host)
        why = names.refusal(host)
        assert why is not None
        assert "allowed_hosts" in why

    @pytest.mark.parametrize("host", [None, ""])
    def test_no_host_passes(self, host: str | None) -> None:
        """Browsers always send Host; an HTTP/1.0 program may not."""
        assert OwnNames().allows(host)
        assert OwnNames().refusal(host) is None

    def test_the_bind_name_passes(self) -> None:
        """A server bound by name answers that name."""
        names = OwnNames(bind="gw.internal")
        assert names.allows("GW.internal:8081")
        assert not names.allows("other.internal:8081")

    def test_allowed_names_pass(self) -> None:
        """Names the operator allowed pass, compared as Host names are."""
        names = OwnNames(allowed=("Status.Example.",))
        assert names.allows("status.example:443")
        assert not names.allows("evil.example")

    def test_a_star_allows_every_name(self) -> None:
        """`*` turns the check off (a tokenless server behind a proxy that keeps Host)."""
        assert OwnNames(allowed=("*",)).allows("anything.example")


class TestHostProblem:
    """An allowed_hosts entry must be a bare name."""

    @pytest.mark.parametrize("name", ["status.example", "gw", "*", "my-host.lan."])
    def test_names_are_taken(self, name: str) -> None:
        """A host name, or `*`."""
        assert host_problem(name) is None

    @pytest.mark.parametrize(
        "name", ["", "gw:8081", "http://gw", "gw/x", "g w", "*.example", "gw\x00"]
    )
    def test_anything_else_is_refused(self, name: str) -> None:
        """A port, a URL, a space, a wildcard pattern or a control character says why."""
        assert host_problem(name) is not None


class TestAllowedHostsSetting:
    """Each program takes allowed_hosts as names and refuses anything else at start."""

    def test_the_controller_takes_names_and_refuses_a_port(self) -> None:
        """--allowed-host gw.internal is kept; gw:8081 stops the controller (exit 2)."""
        cfg = controller_config.parse_args(["--allowed-host", "gw.internal"], environ={})
        assert cfg.allowed_hosts == ("gw.internal",)
        assert cfg.own_names.allows("gw.internal:8081")
        with pytest.raises(SystemExit) as exited:
            controller_config.parse_args(["--allowed-host", "gw:8081"], environ={})
        assert exited.value.code == 2

    def test_the_router_refuses_a_url(self) -> None:
        """A URL in the router's allowed_hosts is a config error naming the field."""
        assert msgspec.convert({"allowed_hosts": ["gw"]}, RouterConfig).allowed_hosts == ("gw",)
        with pytest.raises(msgspec.ValidationError, match="allowed_hosts"):
            msgspec.convert({"allowed_hosts": ["http://gw"]}, RouterConfig)

    def test_the_agent_refuses_a_wildcard_pattern(self) -> None:
        """`*.example` is not a name (only `*` alone is); the agent says so."""
        argv = ["--print-inventory", "--gpus", "1xH100-80G", "--allowed-host", "*.example"]
        with pytest.raises(AgentConfigError, match="allowed-host"):
            agent_config.parse_config(argv)


class TestOpenController:
    """A controller served beyond loopback without a token answers every name it is reached by."""

    def test_insecure_beyond_loopback_answers_any_name(self) -> None:
        """--insecure on 0.0.0.0: agents and routers reach it by their own name for it."""
        cfg = controller_config.parse_args(["--host", "0.0.0.0", "--insecure"], environ={})
        assert cfg.own_names.allows("controller.internal:8081")

    def test_loopback_still_refuses_a_foreign_name(self) -> None:
        """On loopback the check stands: only a rebound page reaches it by a foreign name."""
        cfg = controller_config.parse_args([], environ={})
        assert not cfg.own_names.allows("evil.example:8081")
