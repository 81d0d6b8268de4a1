"""ctl behind a reverse proxy, or pointed at a host it cannot look up: one line, exit 1.

The proxy is played by a few bytes from a socket (not our component); what matters is
what ctl makes of a page, a compressed body or an answer that is not the controller's.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import zlib
from collections.abc import Iterator

import pytest

from llmgw.testing.procs import llmgw_argv
from tests.integration.test_ctl_transport import RawServer, ctl_nodes_fails

pytestmark = pytest.mark.timeout(60)

NODES = json.dumps(
    [
        {
            "name": "gpu-7", "address": "10.0.0.7:9000", "state": "hibernating",
            "fabrics": ["ib0"], "labels": {}, "gpus": [], "gpus_used": [],
            "last_heartbeat": None, "classes": ["H100-80G"], "gpu_total": 8,
            "gpu_free": 8, "unhealthy": [],
        }
    ]
).encode()  # fmt: skip


def answer(status: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in (*headers, f"Content-Length: {len(body)}"))
    return f"HTTP/1.1 {status}\r\n{head}\r\n".encode() + body


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[RawServer]:
    srv = RawServer(request.param)
    try:
        yield srv
    finally:
        srv.close()


def ctl_nodes(port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw_argv("ctl", "--controller", f"127.0.0.1:{port}", "-o", "tsv", "nodes"),
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


class TestPagesOfAProxy:
    """A proxy's page, error or 200, is named as one, in its own words, on one line."""

    @pytest.mark.parametrize(
        ("server", "said"),
        [
            pytest.param(
                answer(
                    "502 Bad Gateway",
                    b"<html><head><title>502 Bad Gateway</title></head>\n<body><h1>502 Bad "
                    b"Gateway</h1><hr><center>nginx</center></body></html>\n",
                    "Content-Type: text/html",
                ),
                "failed with 502: 502 Bad Gateway (a text/html answer, not the controller's",
                id="html-502",
            ),
            pytest.param(
                answer(
                    "200 OK",
                    b"<!doctype html><html><title>Sign in &middot; SSO</title><p>x</p></html>",
                    "Content-Type: text/html; charset=utf-8",
                ),
                "answered 200 with 'text/html; charset=utf-8', not the controller's JSON: "
                "'Sign in \u00b7 SSO'",
                id="html-200",
            ),
            pytest.param(
                answer(
                    "401 Unauthorized",
                    b"Unauthorized\n",
                    "Content-Type: text/plain",
                    'WWW-Authenticate: Basic realm="gateway"',
                ),
                "(401): Unauthorized (a text/plain answer, not the controller's",
                id="basic-auth-401",
            ),
        ],
        indirect=["server"],
    )
    def test_one_line_naming_the_page(self, server: RawServer, said: str) -> None:
        """The line quotes the page's title or text, not its markup, and says it is not
        the controller's (a login page read as JSON was "malformed at byte 0")."""
        stderr = ctl_nodes_fails(server.port, timeout_s=30)
        assert said in stderr
        assert "<" not in stderr


class TestCompressedAnswers:
    """A body a proxy compressed though ctl asked for none is read, within the size bound."""

    @pytest.mark.parametrize(
        "server",
        [
            pytest.param(
                answer("200 OK", gzip.compress(NODES), "Content-Encoding: gzip"), id="gzip"
            ),
            pytest.param(
                answer("200 OK", zlib.compress(NODES), "Content-Encoding: deflate"), id="deflate"
            ),
        ],
        indirect=True,
    )
    def test_a_compressed_answer_is_shown(self, server: RawServer) -> None:
        """The node list arrives gzip- or deflate-encoded and is shown, its unknown state as is."""
        done = ctl_nodes(server.port)
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.splitlines()[1].split("\t")[:2] == ["gpu-7", "hibernating"]

    @pytest.mark.parametrize(
        ("server", "said"),
        [
            pytest.param(
                answer("200 OK", b"\x1b\x00\x00", "Content-Encoding: br"),
                "Content-Encoding 'br', which ctl cannot read",
                id="brotli",
            ),
            pytest.param(
                answer("200 OK", b"[not gzip]", "Content-Encoding: gzip"),
                "Content-Encoding gzip, but the bytes are not",
                id="not-gzip",
            ),
            pytest.param(
                answer("200 OK", gzip.compress(b" " * (65 << 20)), "Content-Encoding: gzip"),
                "larger than 64 MiB",
                id="gzip-bomb",
            ),
        ],
        indirect=["server"],
    )
    def test_an_unreadable_encoding_is_one_line(self, server: RawServer, said: str) -> None:
        """An encoding ctl cannot undo, bytes not in it, or one that inflates past the
        bound are one line and exit 1."""
        assert said in ctl_nodes_fails(server.port, timeout_s=30)


class TestHostNames:
    """A host name the resolver cannot be asked for is refused up front."""

    @pytest.mark.parametrize("host", ["a..b", "x" * 64 + ".example", ".ctl"])
    def test_one_line_exit_1(self, host: str) -> None:
        """An empty or over-long part of the name is one line (it was a UnicodeError
        traceback from the resolver's encoding)."""
        done = subprocess.run(
            llmgw_argv("ctl", "nodes"),
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, check=False,
            env={**os.environ, "LLMGW_CONTROLLER": f"http://{host}:8081"},
        )  # fmt: skip
        assert done.returncode == 1
        assert "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert "the host name is not valid" in done.stderr
