"""The status page cannot be framed by another site (issue 34, item 10): it holds the
operator's token, so a framing page must not overlay it. A real controller on 127.0.0.1."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from tests.integration.controller_harness import Db, controller

pytestmark = pytest.mark.timeout(60)


class TestStatusPageHeaders:
    """The status page cannot be framed."""

    @pytest.mark.parametrize(
        "path", ["/status", "/status/", "/status/static/status.js", "/status/static/status.css"]
    )
    def test_never_in_a_frame(self, tmp_path: Path, path: str) -> None:
        """Every file of the page forbids framing (CSP frame-ancestors and X-Frame-Options),
        loads nothing from elsewhere, and is not type-sniffed."""
        with (
            controller(Db(f"sqlite:///{tmp_path}/c.db"), log_dir=tmp_path) as c,
            urllib.request.urlopen(c.url + path, timeout=10) as resp,
        ):
            headers = resp.headers
            assert resp.status == 200
        csp = [d.strip() for d in headers["Content-Security-Policy"].split(";")]
        assert "frame-ancestors 'none'" in csp
        assert "default-src 'self'" in csp
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["X-Content-Type-Options"] == "nosniff"
