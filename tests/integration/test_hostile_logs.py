"""What a client can put in the programs' logs, against real processes: a value it sends
(a path, a request id) never forges a line of its own in the text log format.

A router (static endpoints, its access log on) and a controller (SQLite in the test's
folder), each logging in the default text format, as an operator's `journalctl` reads it.
"""

from __future__ import annotations

import shlex
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.controller_harness import Db, controller
from tests.integration.hostile import log_lines, raw_request
from tests.integration.router_fixtures import base_config, router

pytestmark = pytest.mark.timeout(60)

# What a forged line would start with: a timestamp and a level, as the text format writes.
FORGED = "2026-01-01 00:00:00,000 INFO llmgw.router.access request request_id=forged status=200"
# The same, percent-encoded into a path after an encoded line feed.
FORGED_PATH = "/v1/x%0A" + FORGED.replace(" ", "%20")


def forged_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("2026-01-01")]


class TestLogLines:
    """A client's line feed stays inside the one log line that holds it, escaped."""

    def test_router_access_log(self, tmp_path: Path) -> None:
        """An encoded line feed in a path writes `\\n` in the access line, not a new line."""
        cfg = base_config(
            endpoints=[{"id": "e0", "url": "http://127.0.0.1:9", "models": ["m"]}],
            access_log=True,
        )
        with router(tmp_path, cfg) as r:
            head = f"POST {FORGED_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            ans = raw_request(r.port, head.encode())
            assert ans.status == 404
            r.stop(grace_s=5)
            text = r.log_text()
        assert forged_lines(text) == []
        access = log_lines(text, "llmgw.router.access")
        assert len(access) == 1
        assert 'path="/v1/x\\n2026-01-01 00:00:00,000 INFO' in access[0]

    def test_controller_refusal(self, tmp_path: Path) -> None:
        """An unauthenticated request's path is logged on the refusal's one line."""
        db = Db(f"sqlite:///{tmp_path}/c.db")
        with controller(db, token="logs-token", log_dir=tmp_path) as c:
            with pytest.raises(urllib.error.HTTPError) as got:
                urllib.request.urlopen(c.url + FORGED_PATH.replace("/v1/", "/admin/"), timeout=10)
            got.value.close()
            assert got.value.code == 401
            c.program.stop(grace_s=5)
            text = c.program.log_text()
        assert forged_lines(text) == []
        refused = log_lines(text, "refused request status=401")
        assert len(refused) == 1
        assert 'path="/admin/x\\n2026-01-01 00:00:00,000 INFO' in refused[0]


class TestLogFields:
    """A client's value with spaces stays one quoted field: it forges no field of its own."""

    def test_request_id_with_fields_in_it(self, tmp_path: Path) -> None:
        """An `x-request-id` of `rid status=200 key=alice` is one quoted `request_id`; the
        line's only bare `status=` is the router's own."""
        cfg = base_config(
            endpoints=[{"id": "e0", "url": "http://127.0.0.1:9", "models": ["m"]}],
            access_log=True,
        )
        with router(tmp_path, cfg) as r:
            head = (
                "POST /v1/nope HTTP/1.1\r\nHost: x\r\nx-request-id: rid status=200 key=alice\r\n"
                "Content-Length: 0\r\n\r\n"
            )
            assert raw_request(r.port, head.encode()).status == 404
            r.stop(grace_s=5)
            access = log_lines(r.log_text(), "llmgw.router.access")
        assert len(access) == 1
        assert 'request_id="rid status=200 key=alice"' in access[0]
        # Read as a logfmt reader reads it: quoted values are one field each.
        fields = [f for f in shlex.split(access[0]) if f.startswith("status=")]
        assert fields == ["status=404"], access[0]
