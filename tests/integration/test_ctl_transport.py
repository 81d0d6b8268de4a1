"""ctl against something that is not a working controller: one line, exit 1, no traceback."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from llmgw.testing.procs import llmgw_argv

pytestmark = pytest.mark.timeout(60)


class RawServer:
    """A TCP server on 127.0.0.1 that answers every connection with the same bytes, then closes."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = int(self.sock.getsockname()[1])
        # close() does not wake a thread blocked in accept(): poll a flag instead.
        self.sock.settimeout(0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    conn.sendall(self.answer)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture(
    params=[
        pytest.param(b"SSH-2.0-OpenSSH_9.6\r\n", id="not-http"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n[{",
            id="cut-short",
        ),
        # An error status is read like any other answer: a proxy's page cut short, or
        # framing broken after the status line, used to end ctl in a traceback.
        pytest.param(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\n"
            b"Content-Length: 500\r\n\r\n<html><head>",
            id="error-cut-short",
        ),
        pytest.param(
            b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            id="error-broken-chunks",
        ),
    ]
)
def server(request: pytest.FixtureRequest) -> Iterator[RawServer]:
    srv = RawServer(request.param)
    try:
        yield srv
    finally:
        srv.close()


class TestBrokenAnswers:
    """Broken answers give one line and exit 1."""

    def test_one_line_and_exit_1(self, server: RawServer) -> None:
        """A non-HTTP or truncated answer, error or not, is one line naming the URL, exit 1."""
        out = subprocess.run(
            llmgw_argv("ctl", "--controller", f"127.0.0.1:{server.port}", "nodes"),
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert out.returncode == 1
        assert "Traceback" not in out.stderr
        assert out.stderr.count("\n") == 1, out.stderr
        assert f"127.0.0.1:{server.port}" in out.stderr
