"""The retired choice of HTTP server, and the router server's pure parts."""

from __future__ import annotations

import logging

import pytest
from multidict import CIMultiDict

from llmgw.router.config import check_retired_env, parse
from llmgw.router.errors import RouterConfigError
from llmgw.router.http.heads import head, status_line
from llmgw.router.http.server import FastServer
from llmgw.runtime.clock import ManualClock
from llmgw.runtime.httpserver import Edge, ServerLimits, openai_error
from llmgw.testing import vtime
from tests.unit.router_world import Answered, Pipe


class TestRetiredServerSetting:
    """`http_server` and LLMGW_ROUTER_SERVER are retired: the router's own server only."""

    def test_fast_is_accepted_with_a_warning(self, caplog: pytest.LogCaptureFixture) -> None:
        """`http_server: fast` names what the router does anyway: it parses, and a warning
        says to drop it."""
        with caplog.at_level(logging.WARNING, logger="llmgw.router.config"):
            cfg = parse("http_server: fast")
        assert cfg == parse("{}")
        assert "retired setting" in caplog.text
        assert "http_server" in caplog.text

    def test_aiohttp_is_refused_clearly(self) -> None:
        """`http_server: aiohttp` cannot be honoured: an error naming the setting."""
        with pytest.raises(RouterConfigError, match=r"http_server: 'aiohttp': retired"):
            parse("http_server: aiohttp")
        with pytest.raises(RouterConfigError, match="http_server: 'nginx'"):
            parse("http_server: nginx")

    def test_the_environment_variable_likewise(self, caplog: pytest.LogCaptureFixture) -> None:
        """LLMGW_ROUTER_SERVER: `fast` warns, anything else is an error naming it, unset
        or empty is nothing."""
        check_retired_env({})
        check_retired_env({"LLMGW_ROUTER_SERVER": " "})
        assert "retired" not in caplog.text
        with caplog.at_level(logging.WARNING, logger="llmgw.router.config"):
            check_retired_env({"LLMGW_ROUTER_SERVER": "fast"})
        assert "LLMGW_ROUTER_SERVER" in caplog.text
        with pytest.raises(RouterConfigError, match="LLMGW_ROUTER_SERVER: 'aiohttp'"):
            check_retired_env({"LLMGW_ROUTER_SERVER": "aiohttp"})


class TestAnswerHeads:
    """Answer heads the protocol-level server renders."""

    def test_status_line_and_own_headers_dropped(self) -> None:
        """The handler's framing headers give way to the server's own; Date is added."""
        headers = CIMultiDict(
            {"Content-Type": "application/json", "content-length": "99", "Connection": "x"}
        )
        got = head(404, None, headers, b"Content-Length: 2\r\n\r\n")
        lines = got.split(b"\r\n")
        assert lines[0] == b"HTTP/1.1 404 Not Found"
        assert b"Content-Type: application/json" in lines
        assert sum(x.lower().startswith(b"content-length") for x in lines) == 1
        assert not any(x.lower().startswith(b"connection") for x in lines)
        assert any(x.startswith(b"Date: ") and x.endswith(b" GMT") for x in lines)
        assert got.endswith(b"Content-Length: 2\r\n\r\n")

    def test_a_plain_dict_of_headers_reads_the_same(self) -> None:
        """The proxy's answers carry a dict: the same lines, in order, own ones dropped
        in any case (the first sight of a name and the remembered answer alike)."""
        fields = {
            "Content-Type": "text/plain",
            "TRANSFER-ENCODING": "chunked",
            "x-request-id": "r1",
            "Date": "yesterday",
            "X-Engine": "e0",
        }
        for _ in range(2):
            for headers in (fields, CIMultiDict(fields)):
                got = head(200, None, headers, b"\r\n")
                lines = got.split(b"\r\n")
                assert lines[1:4] == [
                    b"Content-Type: text/plain",
                    b"x-request-id: r1",
                    b"X-Engine: e0",
                ]
                assert lines[4].startswith(b"Date: ")
                assert lines[4] != b"Date: yesterday"
                assert b"chunked" not in got

    def test_unknown_status_and_own_reason(self) -> None:
        """A status outside HTTPStatus gets an empty phrase; a handler's reason is kept."""
        assert status_line(599, None) == b"HTTP/1.1 599 \r\n"
        assert status_line(200, "Fine") == b"HTTP/1.1 200 Fine\r\n"

    def test_header_bytes_round_trip(self) -> None:
        """A header value read as utf-8 with surrogateescape goes out as the same bytes."""
        raw = b"caf\xc3\xa9-\xff"
        value = raw.decode("utf-8", "surrogateescape")
        got = head(200, None, {"x-request-id": value}, b"\r\n")
        assert b"x-request-id: " + raw + b"\r\n" in got


class TestOverflowOnAnUploadPath:
    """A Content-Length past 2**64-1 on an upload path names that path's own limit."""

    def test_the_413_names_max_upload_bytes(self) -> None:
        """The transcription route takes 1 MiB: its overflow 413 says 1 MiB, not the
        JSON routes' 1 KiB (a client would shrink its file for nothing)."""

        async def handler(request: object) -> object:
            raise AssertionError("no handler for a head refused")

        async def main() -> Answered:
            server = FastServer(
                Edge(ServerLimits(decompress=False), openai_error, name="router"),
                handler,  # type: ignore[arg-type]
                max_body_bytes=1024,
                upload_paths={"/v1/audio/transcriptions"},
                max_upload_bytes=1024 * 1024,
            )
            conn = server.protocol()
            pipe = Pipe(conn)
            conn.connection_made(pipe)
            conn.data_received(
                b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: 99999999999999999999\r\n\r\n"
            )
            await pipe.closed
            return Answered(bytes(pipe.out))

        got = vtime.run(main(), ManualClock())
        assert got.status == 413
        assert f"larger than {1024 * 1024} bytes" in got.json()["error"]["message"]
