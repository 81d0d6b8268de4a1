"""The agent's own HTTP surface under hostile input: JSON errors, one log line per refused
body, no traceback, the process up. A real agent on 127.0.0.1 (its controller absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.testing import start_program
from tests.integration.hostile import log_lines, no_traceback, raw_request

pytestmark = pytest.mark.timeout(60)


def post(path: str, payload: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode() + payload


class TestAgentRefusals:
    """The agent refuses bad bodies, paths and HTTP with JSON errors."""

    def test_bodies_paths_and_bad_http(self, tmp_path: Path) -> None:
        """Bad bodies, paths and HTTP get JSON errors, one log line each."""
        args = ["agent", "--controller", "http://127.0.0.1:9", "--node", "n", "--port", "0"]
        args += ["--gpus", "2xH100-80G", "--state-dir", str(tmp_path / "state")]
        with start_program(args, log_dir=tmp_path) as agent:
            n0 = len(log_lines(agent.log_text(), "refused request"))
            bodies = (b"[" * 5000 + b"]" * 5000, b'{"reason": 5}', b"\xff", b'{"x": 1}')
            for body in bodies:
                ans = raw_request(agent.port, post("/gpus/0/unhealthy", body))
                assert ans.status == 400, ans.body
                assert ans.json()["error"]["message"].startswith("bad body"), ans.body
            for data, status in (
                (post("/gpus/x/unhealthy", b""), 404),
                (b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 404),
                (b"DELETE /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 405),
                (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 400),
            ):
                ans = raw_request(agent.port, data)
                assert ans.status == status, (data[:30], ans.status, ans.body)
                assert isinstance(ans.json()["error"]["message"], str)
            ok = raw_request(
                agent.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )
            assert ok.status == 200
            assert agent.alive()
            text = agent.log_text()
            # One line per refused body, and one for the request aiohttp's parser refused.
            assert len(log_lines(text, "refused request")[n0:]) == len(bodies) + 1
            no_traceback(text)
