"""The URL a leading controller records for standbys to relay usage reports to."""

from __future__ import annotations

import pytest

from llmgw.controller.config import derive_advertise_url, parse_args


class TestDerived:
    """--advertise-url's default, from --host and the bound port."""

    @pytest.mark.parametrize(
        ("host", "want"),
        [
            ("127.0.0.1", "http://127.0.0.1:8081"),
            ("10.0.0.7", "http://10.0.0.7:8081"),
            ("ctl-a.internal", "http://ctl-a.internal:8081"),
            ("::1", "http://[::1]:8081"),
            ("[fd00::7]", "http://[fd00::7]:8081"),
        ],
    )
    def test_one_address_is_the_url(self, host: str, want: str) -> None:
        """A host that is one address or name gives http://host:port (IPv6 bracketed)."""
        assert want == derive_advertise_url(None, host, 8081)

    @pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", ""])
    def test_every_interface_gives_none(self, host: str) -> None:
        """Listening on every interface names no address the others are known to reach."""
        assert derive_advertise_url(None, host, 8081) is None

    def test_given_wins(self) -> None:
        """--advertise-url is taken as given, whatever --host is."""
        assert derive_advertise_url("https://ctl-a:9000", "0.0.0.0", 8081) == "https://ctl-a:9000"


class TestFlag:
    """--advertise-url on the command line."""

    def test_default_is_none_until_bound(self) -> None:
        """Not given: None in the parsed config (derived once the port is bound)."""
        assert parse_args([], {}).advertise_url is None

    def test_trailing_slash_is_dropped(self) -> None:
        """A base URL with a trailing slash is kept without it."""
        got = parse_args(["--advertise-url", "http://ctl-a:8081/"], {})
        assert got.advertise_url == "http://ctl-a:8081"

    def test_from_the_environment(self) -> None:
        """LLMGW_CONTROLLER_ADVERTISE_URL sets it like every flag's variable."""
        got = parse_args([], {"LLMGW_CONTROLLER_ADVERTISE_URL": "http://10.1.2.3:8081"})
        assert got.advertise_url == "http://10.1.2.3:8081"

    @pytest.mark.parametrize(
        "url", ["ctl-a:8081", "ftp://ctl-a", "http://", "http://ctl-a:port", "http://a/?x=1"]
    )
    def test_a_bad_url_exits_2(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        """Not an http(s) base URL with a host: a bad command line, said at start."""
        with pytest.raises(SystemExit) as info:
            parse_args(["--advertise-url", url], {})
        assert info.value.code == 2
        assert "--advertise-url" in capsys.readouterr().err

    @pytest.mark.parametrize("url", ["http://u:pw-canary@ctl-a:8081", "http://pw-canary@ctl-a"])
    def test_a_user_or_password_exits_2_without_echoing_it(
        self, url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Credentials in the URL were logged when leading, stored in the database, and
        made every relayed usage report a 500 (aiohttp will not send them beside the
        router's Authorization): refused at start, and not repeated in the message."""
        with pytest.raises(SystemExit) as info:
            parse_args(["--advertise-url", url], {})
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "--advertise-url" in err
        assert "pw-canary" not in err
