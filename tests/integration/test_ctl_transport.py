"""ctl against something that is not a working controller: one line, exit 1, no traceback."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from llmgw.adminclient.client import AdminClient, UrllibTransport
from llmgw.adminclient.errors import AdminUnreachable
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


def ctl_nodes_fails(port: int, *, timeout_s: float) -> str:
    """`ctl nodes` against 127.0.0.1:`port`: asserts exit 1 with one line and no
    traceback; that line."""
    out = subprocess.run(
        llmgw_argv("ctl", "--controller", f"127.0.0.1:{port}", "nodes"),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    return out.stderr


class TestBrokenAnswers:
    """Broken answers give one line and exit 1."""

    def test_one_line_and_exit_1(self, server: RawServer) -> None:
        """A non-HTTP or truncated answer, error or not, is one line naming the URL, exit 1."""
        stderr = ctl_nodes_fails(server.port, timeout_s=30)
        assert f"127.0.0.1:{server.port}" in stderr


class StreamServer:
    """A TCP server on 127.0.0.1 that writes what `stream` yields to each connection
    until the client goes away (a controller stand-in that never finishes its answer)."""

    def __init__(self, stream: Callable[[], Iterator[bytes]]) -> None:
        self.stream = stream
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = int(self.sock.getsockname()[1])
        self.sock.settimeout(0.05)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)
                for piece in self.stream():
                    if self._stop.is_set():
                        return
                    conn.sendall(piece)
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self.sock.close()


def _trickle_body() -> Iterator[bytes]:
    """A 200 whose body comes a byte a quarter second: each read is quick, the whole never ends."""
    yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n["
    while True:
        time.sleep(0.25)
        yield b" "


def _trickle_head() -> Iterator[bytes]:
    """A status line, then header bytes a quarter second apart, never the blank line."""
    yield b"HTTP/1.1 200 OK\r\nX-Slow: "
    while True:
        time.sleep(0.25)
        yield b"a"


def _endless_chunks() -> Iterator[bytes]:
    """A chunked 200 that never ends, as fast as the client reads (an error page looping)."""
    yield b"HTTP/1.1 502 Bad Gateway\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"x" * 65536
    while True:
        yield b"%x\r\n%s\r\n" % (len(chunk), chunk)


@pytest.fixture
def stream_server(request: pytest.FixtureRequest) -> Iterator[StreamServer]:
    server = StreamServer(request.param)
    try:
        yield server
    finally:
        server.close()


class TestAnswersThatNeverEnd:
    """An answer that never ends is cut at a deadline or a size bound."""

    @pytest.mark.parametrize(
        "stream_server",
        [
            pytest.param(_trickle_body, id="trickled-body"),
            pytest.param(_trickle_head, id="trickled-head"),
        ],
        indirect=True,
    )
    def test_a_trickle_ends_at_the_deadline(self, stream_server: StreamServer) -> None:
        """A byte every quarter second keeps each read short; the answer ends at the deadline."""
        transport = UrllibTransport(answer_within_s=2.0)
        client = AdminClient(f"http://127.0.0.1:{stream_server.port}", transport=transport)
        t0 = time.monotonic()
        with pytest.raises(AdminUnreachable, match="did not finish its answer within 2s"):
            client.nodes()
        assert time.monotonic() - t0 < 10

    @pytest.mark.parametrize("stream_server", [_endless_chunks], indirect=True)
    def test_an_endless_answer_is_one_line_exit_1(self, stream_server: StreamServer) -> None:
        """An endless error page stops at the size bound: one line, exit 1, memory bounded."""
        assert "larger than 64 MiB" in ctl_nodes_fails(stream_server.port, timeout_s=45)
