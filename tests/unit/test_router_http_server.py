"""Choosing the router's HTTP server, and the protocol-level server's pure parts."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from llmgw.router.config import http_server, parse, restart_only_changes
from llmgw.router.errors import RouterConfigError
from llmgw.router.http.heads import head, status_line


class TestHttpServerChoice:
    """Choosing the router's HTTP server from the file and the environment."""

    def test_default_is_fast(self) -> None:
        """Neither the file nor the environment says: the protocol-level server."""
        assert http_server(parse("{}"), {}) == "fast"

    def test_environment_applies_when_the_file_is_silent(self) -> None:
        """LLMGW_ROUTER_SERVER picks the server for a file that names none."""
        assert http_server(parse("{}"), {"LLMGW_ROUTER_SERVER": "aiohttp"}) == "aiohttp"

    def test_file_wins_over_environment(self) -> None:
        """A file that names its server keeps it whatever the environment says."""
        cfg = parse("http_server: aiohttp")
        assert http_server(cfg, {"LLMGW_ROUTER_SERVER": "fast"}) == "aiohttp"

    def test_bad_values(self) -> None:
        """An unknown name: refused at parse time in the file, naming the variable in the env."""
        with pytest.raises(RouterConfigError, match="http_server"):
            parse("http_server: nginx")
        with pytest.raises(RouterConfigError, match="LLMGW_ROUTER_SERVER"):
            http_server(parse("{}"), {"LLMGW_ROUTER_SERVER": "nginx"})

    def test_a_reload_cannot_switch_it(self) -> None:
        """The listening socket's protocol is chosen once: a change needs a restart."""
        old, new = parse("http_server: fast"), parse("http_server: aiohttp")
        assert restart_only_changes(old, new) == ["http_server"]


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
