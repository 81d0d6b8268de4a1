"""The controller's published schema is the truth: schemathesis against a real controller,
and the hostile bodies that used to cost a traceback each.

One controller process (SQLite in the test's folder) on 127.0.0.1; schemathesis runs as
its own CLI, bounded by examples per operation and by time, with a fixed seed.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from llmgw.runtime.httpserver import FD_RESERVE
from llmgw.testing import start_program, wait_until
from tests.integration.controller_harness import Db, controller, spec
from tests.integration.hostile import log_lines, no_traceback, open_fds, parse_answer, rss_kib

pytestmark = pytest.mark.timeout(120)

TOKEN = "hostile-token"
CONFIG = Path(__file__).resolve().parent / "schemathesis" / "controller.toml"


def call(
    url: str, method: str, path: str, body: bytes | None = None, *, token: str | None = TOKEN
) -> tuple[int, dict[str, str], Any]:
    req = urllib.request.Request(url + path, data=body, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, dict(resp.headers), json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, dict(exc.headers), json.loads(raw) if raw else None


def openai_error(doc: Any) -> dict[str, Any]:
    assert set(doc) == {"error"}, doc
    err: dict[str, Any] = doc["error"]
    assert isinstance(err["message"], str), err
    assert err["message"], err
    return err


def schemathesis_cli() -> list[str]:
    """Schemathesis's CLI under this interpreter, through schemathesis/run.py (which
    leaves out Hypothesis's `target` phase: its optimiser can crash inside itself)."""
    try:
        import schemathesis  # noqa: F401
    except ImportError:
        pytest.fail("schemathesis is not installed: it is in the dev extra (pyproject.toml)")
    return [sys.executable, str(Path(__file__).parent / "schemathesis" / "run.py")]


@pytest.mark.slow  # schemathesis runs for up to 30 s: started early (tests/conftest.py)
class TestSchemaIsTheTruth:
    """Schemathesis finds nothing against a real controller."""

    def test_schemathesis_finds_nothing(self, tmp_path: Path) -> None:
        """Schemathesis finds nothing against the published schema."""
        with controller(Db(f"sqlite:///{tmp_path / 'c.db'}"), token=TOKEN, log_dir=tmp_path) as c:
            out = subprocess.run(
                [
                    *schemathesis_cli(),
                    "--config-file",
                    str(CONFIG),
                    "--no-color",
                    "run",
                    c.url + "/openapi.json",
                    "-H",
                    f"Authorization: Bearer {TOKEN}",
                    "--checks",
                    "all",
                    "--phases",
                    "examples,coverage,fuzzing,stateful",
                    "--max-examples",
                    "25",
                    "--max-time",
                    "30",
                    "--seed",
                    "12",
                    "--workers",
                    "2",
                ],
                capture_output=True,
                text=True,
                timeout=100,
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                check=False,
            )
            assert c.program.alive()
            no_traceback(c.program.log_text())
        assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
        assert "Stateful" in out.stdout, out.stdout[-2000:]


class TestHostileBodies:
    """Hostile bodies are refused in shape, each in one log line."""

    def test_each_refused_in_shape_in_one_line(self, tmp_path: Path) -> None:
        """Each hostile body is refused in shape with one log line, without growth."""
        deep = b"[" * 5000 + b"]" * 5000
        with controller(Db(f"sqlite:///{tmp_path / 'c.db'}"), token=TOKEN, log_dir=tmp_path) as c:
            url = c.url
            pid = c.program.pid
            call(url, "GET", "/admin/summary")
            rss0, fds0 = rss_kib(pid), open_fds(pid)
            n0 = len(log_lines(c.program.log_text(), "refused request"))
            refused = 0
            for path in (
                "/admin/models",
                "/v1/usage",
                "/v1/agents/n1/heartbeat",
                "/admin/nodes/n1/drain",
                "/admin/models/m/scale",
            ):
                for body in (deep, b'{"x": ' + deep + b"}", b"\xff\xfe", b"[1, 2"):
                    status, _, doc = call(url, "POST", path, body)
                    # 400 (not JSON, too deep) or 422 (JSON of the wrong type): refused.
                    assert status in (400, 422), (path, body[:20], status, doc)
                    openai_error(doc)
                    refused += 1
            # What the schema says is what is accepted, and what is refused.
            status, _, doc = call(url, "GET", "/v1/endpoints?timeout_s=-1")
            assert status == 400, doc
            assert openai_error(doc)["param"] == "timeout_s"
            refused += 1
            status, _, doc = call(url, "GET", "/admin/events?limit=1039.0")
            assert status == 200, doc
            body = json.dumps([spec("m", gpu_classes=[""])]).encode()
            status, _, doc = call(url, "POST", "/admin/models", body)
            assert status == 422, doc
            assert openai_error(doc)["param"] == "[0].gpu_classes[0]"
            refused += 1
            body = json.dumps(spec("m", max_replicas=3.0, min_replicas=1.0)).encode()
            status, _, doc = call(url, "POST", "/admin/models", body)
            assert status == 200, doc
            status, _, doc = call(url, "POST", "/admin/models/m/scale", b'{"max_replicas": 4.0}')
            assert status == 200, doc
            assert doc["max"] == 4
            for empty in (b"", b"{}"):
                status, _, doc = call(url, "POST", "/admin/models/m/scale", empty)
                assert status == 400, doc
                refused += 1
            status, _, doc = call(url, "POST", "/admin/models", b"[]")
            assert status == 400, doc
            refused += 1
            # 405 names what the path takes.
            for method, path, allow in (
                ("PUT", "/admin/models", "GET, POST, HEAD"),
                ("DELETE", "/admin/models/m/scale", "POST"),
                ("POST", "/healthz", "GET, HEAD"),
            ):
                status, headers, doc = call(url, method, path, b"{}")
                assert status == 405, (method, path, doc)
                assert headers.get("Allow") == allow, headers
                openai_error(doc)
            assert c.program.alive()
            assert open_fds(pid) <= fds0 + 4
            assert rss_kib(pid) < rss0 + 20_000
            text = c.program.log_text()
            assert len(log_lines(text, "refused request")[n0:]) == refused
            no_traceback(text)


class TestMetricsToken:
    """The metrics token alone and beside the admin token."""

    def test_metrics_token_alone_and_beside_the_admin_token(self, tmp_path: Path) -> None:
        """The metrics token works alone and beside the admin token."""
        db = Db(f"sqlite:///{tmp_path / 'a.db'}")
        with controller(db, "--metrics-token", "scrape", log_dir=tmp_path) as c:
            assert call(c.url, "GET", "/metrics", token=None)[0] == 401
            assert call(c.url, "GET", "/metrics", token="wrong")[0] == 401
            status, headers, _ = urllib_get(c.url + "/metrics", "scrape")
            assert status == 200
            assert headers["Content-Type"].startswith("text/plain")
            # Without --token the rest of the API stays as open as before.
            assert call(c.url, "GET", "/admin/summary", token=None)[0] == 200
        db = Db(f"sqlite:///{tmp_path / 'b.db'}")
        with controller(db, "--metrics-token", "scrape", token=TOKEN, log_dir=tmp_path) as c:
            assert urllib_get(c.url + "/metrics", "scrape")[0] == 200
            assert urllib_get(c.url + "/metrics", TOKEN)[0] == 200
            # A valid token outside its scope: 403, as the other scoped tokens answer.
            status, _, doc = call(c.url, "GET", "/admin/summary", token="scrape")
            assert status == 403
            openai_error(doc)


class TestWebPages:
    """A page in the operator's browser cannot write to a controller without a token."""

    def test_a_cross_site_simple_post_changes_nothing(self, tmp_path: Path) -> None:
        """A text/plain spec or a body-less drain with an Origin is 403, and nothing is applied."""
        with controller(Db(f"sqlite:///{tmp_path / 'c.db'}"), log_dir=tmp_path) as c:
            body = json.dumps(spec("pwn", args=["--trust-remote-code"])).encode()
            for path, data in (("/admin/models", body), ("/admin/nodes/n1/drain", b"")):
                req = urllib.request.Request(c.url + path, data=data, method="POST")
                req.add_header("Content-Type", "text/plain")
                req.add_header("Origin", "https://evil.example")
                with pytest.raises(urllib.error.HTTPError) as caught:
                    urllib.request.urlopen(req, timeout=10)
                assert caught.value.code == 403
                assert openai_error(json.loads(caught.value.read()))["type"] == "permission_error"
            assert call(c.url, "GET", "/admin/models", token=None)[2] == []
            # A program's write (no Origin) is taken as before.
            assert call(c.url, "POST", "/admin/models", body, token=None)[0] == 200
            no_traceback(c.program.log_text())


class TestOneAddressFlood:
    """One client address cannot take every connection of the controller."""

    @pytest.mark.skipif(
        shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed"
    )
    def test_idle_connections_from_one_address_leave_the_others_served(
        self, tmp_path: Path
    ) -> None:
        """Idle connections from 127.0.0.2 get 503 past its share; 127.0.0.1 is served."""
        nofile = 512
        cap = nofile // 2 - FD_RESERVE
        args = ["controller", "--port", "0", "--database", "memory://"]
        with start_program(
            args, log_dir=tmp_path, prefix=["prlimit", f"--nofile={nofile}:{nofile}", "--"]
        ) as c:
            idle: list[socket.socket] = []
            try:
                for _ in range(cap):
                    s = socket.socket()
                    idle.append(s)
                    s.bind(("127.0.0.2", 0))
                    s.connect(("127.0.0.1", c.port))
                refused = []

                def some_refused() -> bool:
                    for s in idle:
                        s.setblocking(False)
                        try:
                            data = s.recv(65536)
                        except BlockingIOError:
                            continue
                        if data and s not in refused:
                            refused.append(s)
                            assert parse_answer(data)[0] == 503, data
                    return len(refused) >= cap // 2

                wait_until(some_refused, timeout_s=20, every_s=0.1, what="half refused")
                # Before: every slot was 127.0.0.2's, and agents, routers and ctl got 503.
                assert call(c.url, "GET", "/healthz", token=None)[0] == 200
            finally:
                for s in idle:
                    s.close()
            no_traceback(c.log_text())


def urllib_get(url: str, token: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()
