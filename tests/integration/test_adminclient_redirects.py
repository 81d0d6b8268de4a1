"""The admin client never follows a redirect: its bearer token would go along.

urllib's default opener follows 3xx and copies every header but the content ones,
Authorization included, to whatever host the Location names. A controller never
redirects, so a 3xx comes from something else (a proxy, a squatter on the port):
the answer is an error naming where it pointed, and the token stays here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llmgw.adminclient.client import AdminClient
from llmgw.adminclient.errors import AdminServerFailed

TOKEN = "admin-token-never-elsewhere"


class _Recorder(BaseHTTPRequestHandler):
    seen: list[str | None]

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def elsewhere() -> Iterator[tuple[str, list[str | None]]]:
    seen: list[str | None] = []
    handler = type("Elsewhere", (_Recorder,), {"seen": seen})
    server, url = _serve(handler)
    try:
        yield url, seen
    finally:
        server.shutdown()
        server.server_close()


class TestAdminClientRedirects:
    """The admin client refuses redirects and proxies, so its token stays home."""

    @pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
    def test_a_redirect_is_an_error_and_the_token_stays(
        self, elsewhere: tuple[str, list[str | None]], status: int
    ) -> None:
        """A redirect is an error, and the token does not follow it."""
        target, seen = elsewhere

        class Redirect(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("Location", target + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        server, url = _serve(Redirect)
        try:
            client = AdminClient(url, token=TOKEN, timeout_s=10)
            with pytest.raises(AdminServerFailed) as err:
                client.summary()
        finally:
            server.shutdown()
            server.server_close()
        assert seen == []
        message = str(err.value)
        assert f"redirect ({status}) to {target}/admin/summary" in message
        assert "not followed" in message
        assert TOKEN not in message

    def test_a_loopback_controller_is_never_reached_through_a_proxy(
        self, elsewhere: tuple[str, list[str | None]], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """urllib sends every http request through `http_proxy` unless `no_proxy` names the
        host, 127.0.0.1 included: the token (ctl's own, or the one `llmgw up` left in
        ./.llmgw/tokens/admin, read only for a loopback controller) would leave the host."""
        proxy_url, proxy_saw = elsewhere
        controller_saw: list[str | None] = []
        handler = type("Controller", (_Recorder,), {"seen": controller_saw})
        server, url = _serve(handler)
        for var in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("http_proxy", proxy_url)
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        try:
            for where in (url, url.replace("127.0.0.1", "localhost")):
                AdminClient(where, token=TOKEN, timeout_s=10).summary()
        finally:
            server.shutdown()
            server.server_close()
        assert proxy_saw == []
        assert controller_saw == [f"Bearer {TOKEN}"] * 2
