"""The router's HTTP server (router/http/) speaks HTTP/1.1 as clients expect.

Raw bytes go to a router; what it answers, and whether it keeps the connection:
keep-alive across routes, pipelining, chunked request bodies, Expect:
100-continue, HTTP/1.0, HEAD, a body too large as it is read, and a streamed
answer's framing. Real processes on 127.0.0.1 (a sim-engine, a router), bounded
in count and time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing import Program
from llmgw.testing.wait import wait_until
from tests.integration.hostile import parse_answer
from tests.integration.router_fixtures import (
    base_config,
    chat_body,
    config_path,
    endpoint_entries,
    router,
    sim_engines,
    write_config,
)

pytestmark = pytest.mark.timeout(90)

# The header names of a relayed chat answer (Date and Server aside).
HEAD_NAMES = ["content-length", "content-type", "x-llmgw-endpoint", "x-request-id"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Program]:
    tmp = tmp_path_factory.mktemp("http-server")
    with sim_engines(tmp, [50.0]) as engines:
        conf = {"endpoints": endpoint_entries(engines), "max_body_bytes": 64 * 1024}
        with router(tmp, base_config(**conf), name="r-http") as r:
            yield r


def chat(content: str = "hi", *, stream: bool = False) -> bytes:
    return json.dumps(chat_body(content, max_tokens=4, stream=stream)).encode()


def post(body: bytes, *extra: str, path: str = "/v1/chat/completions") -> bytes:
    lines = "".join(f"{x}\r\n" for x in extra)
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{lines}\r\n"
    ).encode() + body


def padded(size: int) -> bytes:
    """A chat request about `size` bytes long, padded where the engine does not read."""
    return json.dumps({**chat_body("hi", max_tokens=4), "user": "x" * size}).encode()


def chunked(body: bytes, path: str = "/v1/chat/completions") -> bytes:
    return (
        (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\n\r\n{len(body):x}\r\n"
        ).encode()
        + body
        + b"\r\n0\r\n\r\n"
    )


def get(path: str, *extra: str, method: str = "GET", version: str = "1.1") -> bytes:
    lines = "".join(f"{x}\r\n" for x in extra)
    return f"{method} {path} HTTP/{version}\r\nHost: x\r\n{lines}\r\n".encode()


class Conn:
    """One client connection that reads answers one at a time (Content-Length or chunked)."""

    def __init__(self, port: int) -> None:
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.s.sendall(data)

    def _more(self) -> bool:
        data = self.s.recv(65536)
        self.buf += data
        return bool(data)

    def answer(self, *, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            assert self._more(), self.buf
        end = self.buf.index(b"\r\n\r\n") + 4
        status, headers, _ = parse_answer(self.buf[:end])
        self.buf = self.buf[end:]
        if status == 100 or head_only:
            return status, headers, b""
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                while b"\r\n" not in self.buf:
                    assert self._more()
                line, _, rest = self.buf.partition(b"\r\n")
                size = int(line, 16)
                while len(rest) < size + 2:
                    assert self._more()
                    rest = self.buf.partition(b"\r\n")[2]
                body += rest[:size]
                self.buf = rest[size + 2 :]
                if size == 0:
                    return status, headers, body
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            assert self._more()
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, headers, body

    def closed(self) -> bool:
        """The server closed its end (after whatever it had sent)."""
        self.s.settimeout(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if not self._more():
                    return True
            except ConnectionResetError:
                return True
        return False

    def close(self) -> None:
        self.s.close()


@pytest.fixture
def port(served: Program) -> int:
    return served.port


class TestRouterHttp:
    """The router's HTTP/1.1 behaviour."""

    def test_keep_alive_across_routes(self, port: int) -> None:
        """One kept-alive connection is served across routes."""
        c = Conn(port)
        try:
            for data, want in (
                (get("/healthz"), 200),
                (post(chat()), 200),
                (get("/v1/models"), 200),
                (get("/v1/models/nope"), 404),
                (post(b"not json"), 400),
                (post(chat(), path="/v1/nope"), 404),
                (post(chat()), 200),
            ):
                c.send(data)
                status, headers, body = c.answer()
                assert status == want, (data[:40], status, body[:200])
                assert headers["content-type"].startswith("application/json")
                json.loads(body)
        finally:
            c.close()

    def test_pipelined_requests_are_answered_in_order(self, port: int) -> None:
        """Pipelined requests are answered in order."""
        c = Conn(port)
        try:
            c.send(post(chat("one")) + get("/readyz") + post(chat("two")) + get("/nope"))
            got = [c.answer()[0] for _ in range(4)]
            assert got == [200, 200, 200, 404], got
        finally:
            c.close()

    def test_chunked_request_body(self, port: int) -> None:
        """A chunked request body is read whole."""
        body = chat("chunked")
        half = len(body) // 2
        framed = (
            b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:]))
            + b"0\r\n\r\n"
        )
        c = Conn(port)
        try:
            c.send(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + framed
            )
            status, _, out = c.answer()
            assert status == 200, out[:200]
            assert json.loads(out)["object"] == "chat.completion"
            # The connection carries on.
            c.send(get("/healthz"))
            assert c.answer()[0] == 200
        finally:
            c.close()

    def test_expect_100_continue(self, port: int) -> None:
        """Expect: 100-continue gets a 100 before the body is sent."""
        body = chat("expecting")
        c = Conn(port)
        try:
            c.send(post(body, "Expect: 100-continue")[: -len(body)])
            status, _, _ = c.answer()
            assert status == 100
            c.send(body)
            status, _, out = c.answer()
            assert status == 200, out[:200]
        finally:
            c.close()

    def test_an_http_1_0_request_s_100_continue_is_ignored(self, port: int) -> None:
        """HTTP/1.0 has no 1xx answers: its `Expect: 100-continue` is ignored (RFC 9110
        10.1.1), no 100 is sent, and the request is answered."""
        body = chat("expecting on 1.0")
        data = post(body, "Expect: 100-continue").replace(b"HTTP/1.1", b"HTTP/1.0", 1)
        c = Conn(port)
        try:
            c.send(data[: -len(body)])
            time.sleep(0.2)
            c.send(body)
            status, _, out = c.answer()
            assert status == 200, out[:200]
        finally:
            c.close()

    def test_a_chunked_http_1_0_request_is_refused_and_closed(self, port: int) -> None:
        """HTTP/1.0 has no chunked framing: a 1.0 request with Transfer-Encoding is a 400
        and the connection closes (RFC 9112 6.1), so what follows it is never read as a
        request (a proxy in front framing it as 1.0 would see other requests)."""
        smuggled = get("/v1/models")
        data = chunked(chat()).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
        data = data.replace(b"Host: x\r\n", b"Host: x\r\nConnection: keep-alive\r\n", 1)
        c = Conn(port)
        try:
            c.send(data + smuggled)
            status, _, body = c.answer()
            assert status == 400, body[:200]
            assert c.closed()
            assert b"HTTP/1.1" not in c.buf
        finally:
            c.close()

    def test_an_unknown_expectation_is_417(self, port: int) -> None:
        """An unknown expectation is 417."""
        c = Conn(port)
        try:
            c.send(post(chat(), "Expect: teapot"))
            status, _, _ = c.answer()
            assert status == 417
        finally:
            c.close()

    def test_http_1_0_and_head(self, port: int) -> None:
        """HTTP/1.0 closes after its answer, and HEAD gets a head only."""
        c = Conn(port)
        try:
            c.send(get("/healthz", version="1.0"))
            status, _, body = c.answer()
            assert status == 200
            assert json.loads(body)["status"] == "ok"
            assert c.closed()
        finally:
            c.close()
        c = Conn(port)
        try:
            c.send(get("/healthz", method="HEAD"))
            status, headers, _ = c.answer(head_only=True)
            assert status == 200
            assert int(headers["content-length"]) > 0
            # No body followed the head: the next answer's head comes right after.
            c.send(get("/healthz"))
            assert c.answer()[0] == 200
        finally:
            c.close()

    def test_a_relayed_answer_has_the_router_head(self, port: int) -> None:
        """A relayed engine answer: the router's header names (as aiohttp's server wrote
        them before it was retired), the client's request id echoed as sent, and HTTP/1.0's
        keep-alive answered in kind or the connection closed."""
        c = Conn(port)
        try:
            c.send(post(chat(), "x-request-id: abc-123"))
            status, headers, body = c.answer()
            assert status == 200, body
            assert json.loads(body)["object"] == "chat.completion"
            assert int(headers["content-length"]) == len(body)
            head = {k: v for k, v in headers.items() if k not in ("date", "server")}
            one_o = post(chat()).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
            c.send(one_o.replace(b"\r\n\r\n", b"\r\nConnection: keep-alive\r\n\r\n", 1))
            status, headers, _ = c.answer()
            assert status == 200
            assert headers["connection"].lower() == "keep-alive"
            c.send(one_o)
            status, headers, _ = c.answer()
            assert status == 200
            assert c.closed()
        finally:
            c.close()
        assert sorted(head) == HEAD_NAMES
        assert head["x-request-id"] == "abc-123"
        assert head["content-type"].startswith("application/json")
        assert head["x-llmgw-endpoint"]

    def test_chunked_body_past_the_limit_is_413_and_closed(self, port: int) -> None:
        """Chunked body past the limit is 413 and closed."""
        piece = b"x" * 16_384
        framed = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(8)) + b"0\r\n\r\n"
        c = Conn(port)
        try:
            c.send(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + framed
            )
            status, _, body = c.answer()
            assert status == 413, body[:200]
            assert set(json.loads(body)) == {"error"}
            assert c.closed()
        finally:
            c.close()

    def test_stream_is_relayed_chunked_and_the_connection_kept(self, port: int) -> None:
        """Stream is relayed chunked and the connection kept."""
        c = Conn(port)
        try:
            for _ in range(2):
                c.send(post(chat("stream", stream=True)))
                status, headers, body = c.answer()
                assert status == 200
                assert headers["content-type"].startswith("text/event-stream")
                assert headers["x-accel-buffering"] == "no"
                assert "x-request-id" in headers
                events = [x for x in body.split(b"\n\n") if x.strip()]
                assert events[-1] == b"data: [DONE]", events[-3:]
        finally:
            c.close()

    def test_an_endless_header_line_is_refused_not_buffered(self, port: int) -> None:
        """An endless header line is refused, not buffered."""
        c = Conn(port)
        try:
            c.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
            with contextlib.suppress(OSError):
                # Past any sane head (2 MiB): the server refuses long before the end.
                for _ in range(32):
                    c.send(b"a" * 65_536)
            try:
                status, _, body = c.answer()
            except (ConnectionResetError, AssertionError):
                # Closed while we were still sending: the reset may beat the answer.
                pass
            else:
                assert status == 400, body[:200]
                assert json.loads(body)["error"]["code"] == "bad_http_request"
                assert c.closed()
        finally:
            c.close()
        # Refused, not held: the next client is served.
        c = Conn(port)
        try:
            c.send(get("/healthz"))
            assert c.answer()[0] == 200
        finally:
            c.close()

    def test_absolute_form_and_query_route_like_the_path(self, port: int) -> None:
        """Absolute form and query route like the path."""
        c = Conn(port)
        try:
            c.send(post(chat(), path="http://127.0.0.1/v1/chat/completions?x=1"))
            assert c.answer()[0] == 200
            c.send(get("/v1/models?limit=1"))
            assert c.answer()[0] == 200
        finally:
            c.close()

    def test_an_upgrade_header_is_ignored(self, port: int) -> None:
        """`Upgrade: h2c` (curl --http2 on HTTP://) is answered as HTTP/1.1."""
        up = (
            "Connection: Upgrade, HTTP2-Settings",
            "Upgrade: h2c",
            "HTTP2-Settings: AAMAAABkAAQAAP__",
        )
        for data in (get("/healthz", *up), post(chat("upgrade?"), *up)):
            c = Conn(port)
            try:
                c.send(data)
                status, _, body = c.answer()
                assert status == 200, body[:200]
            finally:
                c.close()

    @pytest.mark.parametrize(
        ("var", "value"),
        [
            ("LLMGW_ROUTER_SERVER", "nginx"),
            ("LLMGW_ROUTER_SERVER", "aiohttp"),
            ("LLMGW_ROUTER_UPSTREAM", "curl"),
            ("LLMGW_ROUTER_UPSTREAM", "aiohttp"),
        ],
    )
    def test_bad_environment_override_exits_2(self, tmp_path: Path, var: str, value: str) -> None:
        """LLMGW_ROUTER_UPSTREAM or LLMGW_ROUTER_SERVER (both retired) naming anything
        but the router's own client and server stops the router at start with exit 2."""
        cfg = tmp_path / "r.yaml"
        cfg.write_text("{}\n")
        proc = subprocess.run(
            [sys.executable, "-m", "llmgw", "router", "--config", str(cfg), "--port", "0"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, var: value},
        )
        assert proc.returncode == 2
        assert var in proc.stderr

    def test_sigterm_lets_a_stream_in_flight_finish(self, tmp_path: Path) -> None:
        """Stopping closes the listener first; a stream being relayed runs to its end."""
        with sim_engines(tmp_path, [1.0]) as engines:
            conf = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, conf) as r:
                c = Conn(r.port)
                try:
                    body = json.dumps(chat_body("slow", max_tokens=48, stream=True)).encode()
                    c.send(post(body))
                    while b"data:" not in c.buf:
                        assert c._more()
                    r.proc.send_signal(signal.SIGTERM)
                    status, _, out = c.answer()
                    assert status == 200
                    assert out.rstrip().endswith(b"data: [DONE]"), out[-200:]
                finally:
                    c.close()
                assert r.proc.wait(timeout=20) == 0


class TestBodyLimitOnReload:
    """`max_body_bytes` is restart-only: a reload that changes it changes nothing before then."""

    def test_the_limit_in_force_holds_for_declared_and_chunked_bodies(self, tmp_path: Path) -> None:
        """Lowered by a reload, the limit in force still admits a body under it, declared or
        chunked alike, and a body over it is refused naming the limit in force."""
        with sim_engines(tmp_path, [50.0]) as engines:
            conf = base_config(endpoints=endpoint_entries(engines), max_body_bytes=256 * 1024)
            with router(tmp_path, conf) as r:
                conf["max_body_bytes"] = 64 * 1024
                write_config(config_path(tmp_path), conf)
                wait_until(lambda: "config change needs a restart" in r.log_text())
                got = []
                for data in (post(padded(100_000)), chunked(padded(100_000))):
                    c = Conn(r.port)
                    try:
                        c.send(data)
                        got.append(c.answer()[0])
                    finally:
                        c.close()
                assert got == [200, 200]
                c = Conn(r.port)
                try:
                    c.send(post(padded(300_000)))
                    status, _, body = c.answer()
                finally:
                    c.close()
                assert status == 413
                assert b"larger than 262144 bytes" in body, body


def declaring(length: str, body: bytes, path: str = "/v1/chat/completions") -> bytes:
    """A POST whose Content-Length header is `length`, written as given, then `body`."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length:{length}\r\n\r\n"
    ).encode() + body


class TestDeclaredLength:
    """Every spelling of Content-Length gets its answer at once: 413 past the limit, 400
    when malformed, served when it is the body's length however it is written."""

    @pytest.mark.parametrize(
        "length",
        [
            " 65537",
            " 18446744073709551615",  # 2**64 - 1, the most llhttp holds
            " 18446744073709551616",  # 2**64: llhttp's overflow
            " 99999999999999999999",  # 20 digits
            " " + "9" * 40,
            " " + "0" * 30 + "70000",  # leading zeros, over the limit
        ],
    )
    def test_over_the_limit_is_413_at_once(self, port: int, length: str) -> None:
        """Declared past max_body_bytes, whatever its size: 413 request_too_large before any
        of the body is waited for (not the 408 of a slow body), and closed."""
        c = Conn(port)
        try:
            start = time.monotonic()
            c.send(declaring(length, b"{"))
            status, _, body = c.answer()
            assert (status, json.loads(body)["error"]["code"]) == (413, "request_too_large")
            assert time.monotonic() - start < 2.0
            assert c.closed()
        finally:
            c.close()

    def test_overflow_on_the_messages_route_is_anthropic_s_413(self, port: int) -> None:
        """On /v1/messages the same 413 comes in Anthropic's shape."""
        c = Conn(port)
        try:
            c.send(declaring(" 99999999999999999999", b"{", path="/v1/messages"))
            status, _, body = c.answer()
            assert (status, json.loads(body)["error"]["type"]) == (413, "request_too_large")
        finally:
            c.close()

    @pytest.mark.parametrize("length", [" -1", " +5", " 0x10", " 1 2", " 5,5", "", " 1e3"])
    def test_a_malformed_length_is_400_at_once(self, port: int, length: str) -> None:
        """A sign, hex, two numbers, a list, nothing, an exponent: 400 bad_http_request."""
        c = Conn(port)
        try:
            c.send(declaring(length, b"{}"))
            status, _, body = c.answer()
            assert (status, json.loads(body)["error"]["code"]) == (400, "bad_http_request")
            assert c.closed()
        finally:
            c.close()

    @pytest.mark.parametrize("spelling", ["{:08d}", "  {}", "{}  ", "\t{}\t"])
    def test_the_body_s_length_however_written_is_served(self, port: int, spelling: str) -> None:
        """Leading zeros and spaces or tabs around the number (RFC 9110's optional white
        space) declare the same length: the request is served."""
        body = chat()
        c = Conn(port)
        try:
            c.send(declaring(spelling.format(len(body)), body))
            assert c.answer()[0] == 200
        finally:
            c.close()
