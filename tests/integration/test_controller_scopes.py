"""The scope matrix: every controller route × every kind of token → the designed status.

Routes come from the controller's own /openapi.json, so a new route cannot be left
out. Tokens: none, a wrong one, admin, read-only, metrics, agent (any node), node n1's,
router. "allowed" means the request got past authorization (any status but 401/403).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.controller.api.auth import OPEN_PATHS, OPEN_PREFIXES, READ_PATHS, READ_PREFIXES
from llmgw.testing import Program, start_program

TOKENS = {
    "admin": "admin-secret-1",
    "read": "read-secret-2",
    "agent": "agent-secret-3",
    "n1": "node-one-secret-4",
    "n2": "node-two-secret-5",
    "router": "router-secret-6",
    "metrics": "metrics-secret-7",
}


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Program]:
    tmp: Path = tmp_path_factory.mktemp("scopes")
    files = {}
    for name in ("admin", "agent", "router", "metrics"):
        files[name] = tmp / f"{name}.token"
        files[name].write_text(TOKENS[name] + "\n")
    nodes = tmp / "nodes.tokens"
    nodes.write_text(f"# per-node tokens\nn1={TOKENS['n1']}\nn2={TOKENS['n2']}\n")
    prog = start_program(
        [
            "controller", "--port", "0", "--database", "memory://",
            "--token-file", str(files["admin"]), "--read-token", TOKENS["read"],
            "--agent-token-file", str(files["agent"]), "--router-token-file", str(files["router"]),
            "--node-tokens-file", str(nodes), "--metrics-token-file", str(files["metrics"]),
        ],
        log_dir=tmp,
    )  # fmt: skip
    try:
        yield prog
    finally:
        prog.stop(grace_s=5)


def status(url: str, method: str, path: str, token: str | None) -> int:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = b"{}" if method in ("POST", "PUT", "PATCH") else None
    req = urllib.request.Request(url + path, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        exc.close()
        return int(exc.code)


def expected(who: str, method: str, template: str, path: str) -> str:
    """'open', 'allowed', 401 or 403 for this token kind on this route."""
    if template in OPEN_PATHS or template.startswith(OPEN_PREFIXES):
        return "open"
    if who in ("none", "wrong"):
        return "401"
    if who == "admin":
        return "allowed"
    if who == "read":
        readable = template in READ_PATHS or template.startswith(READ_PREFIXES)
        # Engine logs are the admin token's alone, though under /admin/replicas.
        readable = readable and template != "/admin/replicas/{id}/logs"
        return "allowed" if method == "GET" and readable else "403"
    if who == "metrics":
        return "allowed" if (method, template) == ("GET", "/metrics") else "403"
    heartbeat = template == "/v1/agents/{node}/heartbeat"
    if who == "agent":
        return "allowed" if heartbeat else "403"
    if who in ("n1", "n2"):
        return "allowed" if heartbeat and path == f"/v1/agents/{who}/heartbeat" else "403"
    assert who == "router"
    return (
        "allowed"
        if (method, template) in {("GET", "/v1/endpoints"), ("POST", "/v1/usage")}
        else "403"
    )


def routes(url: str) -> list[tuple[str, str, str]]:
    with urllib.request.urlopen(url + "/openapi.json", timeout=10) as resp:
        doc = json.loads(resp.read())
    out: list[tuple[str, str, str]] = []
    for template, ops in doc["paths"].items():
        for method in ops:
            if template == "/v1/agents/{node}/heartbeat":
                paths = ["/v1/agents/n1/heartbeat", "/v1/agents/n2/heartbeat"]
            else:
                paths = [
                    template.replace("{node}", "n1").replace("{name}", "m").replace("{id}", "r-1")
                ]
            out += [(method.upper(), template, p) for p in paths]
    return out


def _parse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    from llmgw.controller.config import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def raw_status(url: str, authorization: bytes) -> int:
    """The status of GET /admin/summary sent with these exact header bytes (urllib
    would refuse to send a header that is not Latin-1 text; an attacker's client would not)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(
            b"GET /admin/summary HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Authorization: " + authorization + b"\r\n\r\n"
        )
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


class TestTokenScopes:
    """Every route answers every kind of token with its designed status."""

    def test_every_route_times_every_token(self, ctl: Program) -> None:
        """Every route answers every kind of token with the designed status."""
        table = routes(ctl.url)
        assert len(table) >= 15, table  # the whole API, not an empty schema
        wrong: list[str] = []
        for method, template, path in table:
            for who in ("none", "wrong", *TOKENS):
                token = (
                    None if who == "none" else ("not-a-token" if who == "wrong" else TOKENS[who])
                )
                got = status(ctl.url, method, path, token)
                want = expected(who, method, template, path)
                ok = got not in (401, 403) if want in ("open", "allowed") else got == int(want)
                if not ok:
                    wrong.append(f"{who:>6} {method} {path}: got {got}, want {want}")
        assert not wrong, "\n".join(wrong)

    def test_a_node_token_cannot_pose_as_another_node(self, ctl: Program) -> None:
        """A node token cannot pose as another node."""
        assert status(ctl.url, "POST", "/v1/agents/n2/heartbeat", TOKENS["n1"]) == 403
        assert status(ctl.url, "POST", "/admin/models", TOKENS["n1"]) == 403
        assert status(ctl.url, "POST", "/admin/models", TOKENS["agent"]) == 403
        assert status(ctl.url, "POST", "/admin/models", TOKENS["router"]) == 403

    def test_only_the_admin_token_may_have_an_engine_key(self, ctl: Program) -> None:
        """POST, so the read token (which may GET all of /admin/replicas) never reaches it;
        every scoped token is refused before the replica is even looked up."""
        path = "/admin/replicas/r-1/engine-key"
        for who in ("read", "metrics", "agent", "n1", "n2", "router"):
            assert status(ctl.url, "POST", path, TOKENS[who]) == 403, who
        assert status(ctl.url, "POST", path, None) == 401
        # The admin token gets past authorization: an unknown replica is 404.
        assert status(ctl.url, "POST", path, TOKENS["admin"]) == 404
        # GET is no way round it: the read token gets 405, not a key.
        assert status(ctl.url, "GET", path, TOKENS["read"]) == 405

    def test_bad_scoped_token_settings_are_refused(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Bad scoped token settings are refused."""
        agent = tmp_path / "agent.token"
        agent.write_text("a-token\n")
        admin = tmp_path / "admin.token"
        admin.write_text("a-token\n")
        err = _parse_error(["--agent-token-file", str(agent)], capsys)
        assert "need the admin token" in err
        err = _parse_error(["--token-file", str(admin), "--agent-token-file", str(agent)], capsys)
        assert "every token must differ" in err
        nodes = tmp_path / "nodes"
        nodes.write_text("n1=x\nn1=y\n")
        err = _parse_error(["--token-file", str(admin), "--node-tokens-file", str(nodes)], capsys)
        assert "given twice" in err
        nodes.write_text("just-a-token\n")
        err = _parse_error(["--token-file", str(admin), "--node-tokens-file", str(nodes)], capsys)
        assert "expected NODE=TOKEN" in err
        assert "just-a-token" not in err
        nodes.write_bytes(b"n1=\xff\xfe\n")
        err = _parse_error(["--token-file", str(admin), "--node-tokens-file", str(nodes)], capsys)
        assert "not UTF-8 text" in err

    @pytest.mark.parametrize("header", [b"Bearer \xff\xfe", b"Bearer \xc3\xa9", b"\xff"])
    def test_a_token_that_is_not_text_is_refused_not_a_crash(
        self, ctl: Program, header: bytes
    ) -> None:
        """Bytes that are not UTF-8 are a wrong token (401), never a 500 and a traceback."""
        assert raw_status(ctl.url, header) == 401
