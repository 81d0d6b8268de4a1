"""A stand-in for a newer controller, as a router of this version meets one during a
rolling upgrade (docs/operations.md#which-versions-run-together): it serves the
endpoint list and answers usage reports with whatever JSON the test sets, so a test
can add the fields and values a later version may send.

Threads, not the test's event loop: the router it serves is a real process started
with blocking calls.
"""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


class NewerController:
    """`GET /v1/endpoints` (long-poll on `after`) and `POST /v1/usage`, as the test sets them."""

    def __init__(self, endpoint_list: dict[str, Any], lease: dict[str, Any] | None = None) -> None:
        self._cond = threading.Condition()
        self._list = endpoint_list
        # The answer to each usage report; None: answered without a body.
        self.lease = lease
        self.polls = 0
        # The `after` of each poll: a router asks after a version once it has taken it.
        self.afters: list[int] = []
        self.reports = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def publish(self, endpoint_list: dict[str, Any]) -> None:
        """Answer polls with this list from now on (its `version` should be newer)."""
        with self._cond:
            self._list = endpoint_list
            self._cond.notify_all()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> NewerController:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _endpoints(self, query: dict[str, list[str]]) -> bytes | None:
        after = int(query["after"][0]) if "after" in query else None
        wait_s = min(float(query.get("timeout_s", ["1"])[0]), 2.0)
        with self._cond:
            self.polls += 1
            if after is not None:
                self.afters.append(after)
            if after is not None and after == self._list["version"]:
                self._cond.wait(wait_s)
            if after is not None and after == self._list["version"]:
                return None
            return json.dumps(self._list).encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path != "/v1/endpoints":
                    self._send(404, b"{}")
                    return
                body = owner._endpoints(parse_qs(url.query))
                if body is None:
                    self._send(204, b"")
                else:
                    self._send(200, body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if urlparse(self.path).path != "/v1/usage":
                    self._send(404, b"{}")
                    return
                owner.reports += 1
                if owner.lease is None:
                    self._send(204, b"")
                else:
                    self._send(200, json.dumps(owner.lease).encode())

            def _send(self, status: int, body: bytes) -> None:
                # A router that stops mid long-poll has closed its end.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

        return Handler
