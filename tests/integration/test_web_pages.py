"""What a web page in the operator's browser can ask of real servers (runtime/webpages.py).

A controller without a token, a router's admin routes without `admin_token` and the
agent's API on 127.0.0.1, each sent raw requests as a browser would send them: a write
with `Origin` or `Sec-Fetch-Site`, and a read whose `Host` is a hostile page's own name
pointed at 127.0.0.1 (DNS rebinding). Both are 403; a token, an IP literal or
`localhost` is answered as before, and so are ctl, agents and routers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from llmgw.testing import start_program
from llmgw.testing.procs import Program
from llmgw.testing.wait import wait_until
from tests.integration.controller_harness import Db, controller
from tests.integration.hostile import Answer, no_traceback, raw_request
from tests.integration.router_fixtures import base_config, router

pytestmark = pytest.mark.timeout(120)

EVIL = "rebind.evil.example"
TOKEN = "web-pages-token"


def ask(
    port: int,
    method: str,
    path: str,
    *,
    host: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> Answer:
    """One raw HTTP/1.1 request with exactly these headers (what a browser would send)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if method not in ("GET", "HEAD"):
        lines += ["Content-Type: text/plain", f"Content-Length: {len(body)}"]
    return raw_request(port, ("\r\n".join(lines) + "\r\n\r\n").encode() + body)


def message(ans: Answer) -> str:
    doc = ans.json()
    text: str = doc["error"]["message"]
    return text


def sim_agent(tmp_path: Path, controller_url: str, *extra: str) -> Program:
    args = ["agent", "--controller", controller_url, "--node", "n1", "--port", "0"]
    args += ["--gpus", "1xH100-80G", "--state-dir", str(tmp_path / "state"), *extra]
    return start_program(args, log_dir=tmp_path)


class TestController:
    """A controller without a token answers programs and its own names, not web pages."""

    def test_a_rebinding_page_reads_nothing(self, tmp_path: Path) -> None:
        """Every read with a foreign Host is 403; an IP literal or localhost is answered."""
        with controller(Db("memory://"), log_dir=tmp_path) as c:
            port = c.program.port
            for path in ("/admin/keys", "/admin/events", "/admin/nodes", "/healthz", "/status"):
                ans = ask(port, "GET", path, host=f"{EVIL}:{port}")
                assert ans.status == 403, (path, ans.body)
                assert ans.json()["error"]["type"] == "permission_error"
                assert "allowed_hosts" in message(ans)
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "[::1]", "LOCALHOST."):
                assert ask(port, "GET", "/admin/keys", host=host).status == 200, host
            no_traceback(c.program.log_text())

    def test_a_page_cannot_write_by_any_name(self, tmp_path: Path) -> None:
        """A write with a browser's Origin or Sec-Fetch-Site is 403 with a loopback Host too."""
        with controller(Db("memory://"), log_dir=tmp_path) as c:
            port = c.program.port
            for marks in ({"Origin": "null"}, {"Sec-Fetch-Site": "same-origin"}):
                ans = ask(
                    port, "POST", "/admin/nodes/n1/drain", host=f"127.0.0.1:{port}", headers=marks
                )
                assert ans.status == 403, ans.body
                assert "web page" in message(ans)

    def test_allowed_hosts_and_the_token_open_other_names(self, tmp_path: Path) -> None:
        """A name in --allowed-host is answered; with a token, any name with the token is."""
        with controller(Db("memory://"), "--allowed-host", "gw.internal", log_dir=tmp_path) as c:
            port = c.program.port
            assert ask(port, "GET", "/admin/keys", host=f"GW.internal:{port}").status == 200
            assert ask(port, "GET", "/admin/keys", host=f"{EVIL}:{port}").status == 403
        with controller(Db("memory://"), token=TOKEN, log_dir=tmp_path) as c:
            port = c.program.port
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            assert ask(port, "GET", "/admin/keys", host=EVIL, headers=bearer).status == 200
            # Without the token it is the 401 it always was, not a 403 about the name.
            assert ask(port, "GET", "/admin/keys", host=EVIL).status == 401
            # The open routes of a controller with a token carry no fleet data.
            assert ask(port, "GET", "/healthz", host=EVIL).status == 200

    def test_agents_routers_and_ctl_are_unaffected(self, tmp_path: Path) -> None:
        """An agent heartbeats, a router follows and ctl reads a tokenless controller."""
        with controller(Db("memory://"), log_dir=tmp_path) as c:
            with sim_agent(tmp_path, c.url):
                wait_until(lambda: c.get("/admin/nodes"), what="the agent's node registered")
            host, port = urlsplit(c.url).hostname, urlsplit(c.url).port
            for url in (c.url, f"http://localhost:{port}"):
                env = {**os.environ, "LLMGW_CONTROLLER": url, "XDG_CONFIG_HOME": "/nonexistent"}
                env.pop("LLMGW_TOKEN", None)
                done = subprocess.run(
                    [sys.executable, "-m", "llmgw", "ctl", "nodes", "-o", "json"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    env=env,
                    check=False,
                )
                assert done.returncode == 0, done.stderr
                assert [n["name"] for n in json.loads(done.stdout)] == ["n1"]
            cfg = base_config(controller={"url": f"http://{host}:{port}"})
            with router(tmp_path, cfg) as r:
                wait_until(
                    lambda: ask(r.port, "GET", "/readyz", host="x").status == 200,
                    what="the router's first endpoint list",
                )


class TestRouterAdmin:
    """A router's admin routes without admin_token answer loopback names only; /v1 any."""

    def test_admin_reads_need_a_name_of_the_router(self, tmp_path: Path) -> None:
        """/admin with a foreign Host is 403; with 127.0.0.1, localhost or an allowed name, 200."""
        cfg = base_config(models=["m"], allowed_hosts=["router.internal"])
        with router(tmp_path, cfg) as r:
            for path in ("/admin/endpoints", "/admin/usage"):
                ans = ask(r.port, "GET", path, host=f"{EVIL}:{r.port}")
                assert ans.status == 403, (path, ans.body)
                assert "allowed_hosts" in message(ans)
                for host in (f"127.0.0.1:{r.port}", "localhost", "router.internal:443"):
                    assert ask(r.port, "GET", path, host=host).status == 200, (path, host)
            no_traceback(r.log_text())

    def test_v1_and_health_take_any_name(self, tmp_path: Path) -> None:
        """Clients reach routers by any name: /v1, /healthz and /metrics never look at Host."""
        with router(tmp_path, base_config(models=["m"])) as r:
            for path in ("/v1/models", "/healthz", "/metrics"):
                assert ask(r.port, "GET", path, host=EVIL).status == 200, path

    def test_the_admin_token_opens_any_name(self, tmp_path: Path) -> None:
        """With admin_token set, the token is the guard: any Host with it is answered."""
        with router(tmp_path, base_config(models=["m"], admin_token=TOKEN)) as r:
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            assert ask(r.port, "GET", "/admin/endpoints", host=EVIL, headers=bearer).status == 200
            assert ask(r.port, "GET", "/admin/endpoints", host=EVIL).status == 401


class TestAgent:
    """The agent's API answers loopback names only, and no write from a web page."""

    def test_a_page_can_neither_read_nor_fault_a_gpu(self, tmp_path: Path) -> None:
        """A foreign Host is 403 everywhere; a fault POST with an Origin is 403, not applied."""
        with sim_agent(tmp_path, "http://127.0.0.1:9") as agent:
            port = agent.port
            for path in ("/status", "/healthz", "/metrics"):
                ans = ask(port, "GET", path, host=f"{EVIL}:{port}")
                assert ans.status == 403, (path, ans.body)
                assert "allowed_hosts" in message(ans)
            marks = {"Origin": "https://evil.example"}
            ans = ask(port, "POST", "/gpus/0/unhealthy", host=f"127.0.0.1:{port}", headers=marks)
            assert ans.status == 403, ans.body
            assert "web page" in message(ans)
            status = ask(port, "GET", "/status", host=f"127.0.0.1:{port}")
            assert status.status == 200
            assert all(g["healthy"] for g in status.json()["gpus"]), status.body
            # A program's fault POST is taken as before.
            assert ask(port, "POST", "/gpus/0/unhealthy", host=f"127.0.0.1:{port}").status == 200
            no_traceback(agent.log_text())

    def test_allowed_hosts_opens_a_name(self, tmp_path: Path) -> None:
        """A name in --allowed-host is answered."""
        with sim_agent(tmp_path, "http://127.0.0.1:9", "--allowed-host", "node.internal") as agent:
            assert ask(agent.port, "GET", "/status", host="node.internal").status == 200
