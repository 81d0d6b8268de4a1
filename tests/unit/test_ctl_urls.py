"""ctl's controller URL: accepted forms, and one-line refusals of the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.ctl import config
from llmgw.ctl.errors import CtlError


def resolve(url: str, tmp_path: Path) -> str:
    return config.resolve(flag_url=url, flag_token=None, env={}, home=tmp_path).url


class TestControllerUrl:
    """ctl's controller URL: the accepted forms and one-line refusals."""

    @pytest.mark.parametrize(
        ("given", "url"),
        [
            ("127.0.0.1:8081", "http://127.0.0.1:8081"),
            ("http://ctl.example:9000/", "http://ctl.example:9000"),
            ("https://ctl.example", "https://ctl.example"),
            ("[::1]:8081", "http://[::1]:8081"),
        ],
    )
    def test_accepted_forms(self, tmp_path: Path, given: str, url: str) -> None:
        """host:port and full http(s) URLs are accepted, without a trailing slash."""
        assert resolve(given, tmp_path) == url

    @pytest.mark.parametrize(
        "given", ["localhost:abc", "http://[::1", "ftp://host:21", "http://", "http://h:70000"]
    )
    def test_malformed_url_is_a_ctl_error(self, tmp_path: Path, given: str) -> None:
        """A URL ctl cannot use is refused up front, naming it and where it came from."""
        with pytest.raises(CtlError) as exc:
            resolve(given, tmp_path)
        assert given in str(exc.value)
        assert "flag" in str(exc.value)

    def test_malformed_env_url_names_the_variable(self, tmp_path: Path) -> None:
        """A bad URL from the environment says so, so the operator knows what to fix."""
        with pytest.raises(CtlError, match=config.ENV_CONTROLLER):
            config.resolve(
                flag_url=None, flag_token=None, env={config.ENV_CONTROLLER: "h:x"}, home=tmp_path
            )
