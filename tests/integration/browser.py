"""Headless chromium for the status page tests, and a relay that can garble its data.

    with chromium() as driver: driver.get(c.url + "/status#token=T")

`Garbler` stands between the browser and a real controller: it relays every GET as
it is, except `/admin/status` while `garble` holds a body, which it answers instead
(what a captive portal, a proxy's error page or a half-written answer looks like).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = "/usr/bin/chromedriver"


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium that reports its JS heap precisely; skips without one."""
    if CHROMIUM is None or not Path(CHROMEDRIVER).exists():
        pytest.skip("chromium and chromium-driver are not installed (scripts/test installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,2400",
        "--enable-precise-memory-info",
        "--js-flags=--expose-gc",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


class Garbler:
    """Relays GETs to `target`; `/admin/status` is answered with `garble` while it is set."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.garble: tuple[str, bytes] | None = None  # (content type, body)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/admin/status") and outer.garble is not None:
                    ctype, body = outer.garble
                    self._answer(200, {"Content-Type": ctype}, body)
                    return
                keep = ("Authorization", "Accept")
                headers = {k: v for k, v in self.headers.items() if k in keep}
                req = urllib.request.Request(outer.target + self.path, headers=headers)
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        self._answer(resp.status, dict(resp.headers), resp.read())
                except urllib.error.HTTPError as exc:
                    self._answer(exc.code, dict(exc.headers), exc.read())

            def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
