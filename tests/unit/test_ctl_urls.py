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

    @pytest.mark.parametrize(
        ("given", "said"),
        [
            ("http://ctl.example:8081?x=1", "query"),
            ("http://ctl.example:8081/#top", "fragment"),
            ("http://ctl example:8081", "space"),
        ],
    )
    def test_a_url_the_api_paths_cannot_follow_is_refused(
        self, tmp_path: Path, given: str, said: str
    ) -> None:
        """A query, a fragment or a space is refused up front: ctl's paths went after a `?`
        or `#` (every command answered `GET /: Not Found`), and a space failed deep in
        urllib as "no valid HTTP answer"."""
        with pytest.raises(CtlError, match=said):
            resolve(given, tmp_path)

    def test_a_password_in_the_url_is_refused_and_not_repeated(self, tmp_path: Path) -> None:
        """`user:pw@host` is refused without echoing the password (urllib took `user:pw@host`
        for a host name and printed it whole in its "cannot reach" line)."""
        with pytest.raises(CtlError, match="user name or password") as exc:
            resolve("http://admin:s3@cret@ctl.example:8081/x", tmp_path)
        assert "cret" not in str(exc.value)
        assert "'http://***@ctl.example:8081/x'" in str(exc.value)

    def test_malformed_env_url_names_the_variable(self, tmp_path: Path) -> None:
        """A bad URL from the environment says so, so the operator knows what to fix."""
        with pytest.raises(CtlError, match=config.ENV_CONTROLLER):
            config.resolve(
                flag_url=None, flag_token=None, env={config.ENV_CONTROLLER: "h:x"}, home=tmp_path
            )
