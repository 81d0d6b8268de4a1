"""Helpers for the hostile suites (test_hostile_*.py): raw sockets, a process's footprint.

Everything here talks to 127.0.0.1 only, to processes the test started itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.testing.wait import wait_until


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the server closed the connection after answering
    elapsed_s: float

    def json(self) -> Any:
        return json.loads(self.body)


def parse_answer(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        body = body[: int(headers["content-length"])]
    return status, headers, body


def raw_request(
    port: int, data: bytes, *, timeout_s: float = 10.0, pause_s: float = 0.0, rest: bytes = b""
) -> Answer:
    """Send `data` (then `rest` after `pause_s`), read until the server closes or answers."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        if pause_s:
            time.sleep(pause_s)
        if rest:
            with contextlib.suppress(OSError):
                s.sendall(rest)
        out = b""
        closed = False
        while True:
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                closed = True
                break
            out += chunk
            if b"\r\n\r\n" in out:
                status, headers, body = parse_answer(out)
                if len(body) >= int(headers.get("content-length", "-1")) >= 0:
                    # Answered; see whether the server also closes.
                    s.settimeout(0.5)
    if not out:
        raise AssertionError(f"no answer to {data[:80]!r}")
    status, headers, body = parse_answer(out)
    return Answer(status, headers, body, closed, time.monotonic() - t0)


def assert_openai_error(ans: Answer, status: int) -> dict[str, Any]:
    """The answer is `status` with OpenAI's error object as JSON."""
    assert ans.status == status, (ans.status, ans.body[:300])
    assert ans.headers.get("content-type", "").startswith("application/json"), ans.headers
    doc = ans.json()
    assert set(doc) == {"error"}, doc
    err = doc["error"]
    for key in ("message", "type"):
        assert isinstance(err[key], str), err
        assert err[key], err
    assert "param" in err, err
    assert "code" in err, err
    return dict(err)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def peak_kib(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def wait_fds_at_most(pid: int, limit: int, timeout_s: float = 10.0) -> int:
    """The process's open descriptors once they are back to at most `limit`."""
    counts: list[int] = []

    def back() -> bool:
        counts.append(open_fds(pid))
        return counts[-1] <= limit

    wait_until(
        back,
        timeout_s=timeout_s,
        every_s=0.1,
        what=lambda: f"pid {pid} back to at most {limit} descriptors; last count {counts[-1]}",
    )
    return counts[-1]


def log_lines(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def no_traceback(text: str) -> None:
    at = text.find("Traceback")
    # The lines before the first traceback and the traceback itself, not the log's tail.
    assert at < 0, text[max(0, at - 1500) : at + 4000]


async def read_post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Read one request off a raw engine's connection, its body skipped: True for a POST,
    else (the router's scrapes) False, answered 404 already."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    if head.startswith(b"POST "):
        return True
    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    await writer.drain()
    return False


# What a `RawEngine` does after writing its answer: keep the connection for the next
# request, close it, or reset it (RST).
KEEP, CLOSE, RESET = "keep", "close", "reset"


@dataclass
class Script:
    """One answer of a `RawEngine`: its bytes, written piece by piece, and what then."""

    pieces: list[bytes]
    then: str = KEEP


class RawEngine:
    """An engine on 127.0.0.1 that answers each POST with the bytes its script gives,
    and anything else (the router's scrapes) with 404: raw asyncio, standing in for an
    outside engine whose wire behaviour a test needs to choose byte by byte.

    `script(n)` gives the answer to the n-th POST (from 0); `posts` counts them and
    `connections` the connections they came on (the router's scrapes come on others).
    """

    def __init__(self, script: Callable[[int], Script]) -> None:
        self.script = script
        self.posts = 0
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        server = self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        server = self._server
        assert server is not None
        server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        carried = False
        try:
            while True:
                if not await read_post(reader, writer):
                    continue
                answer = self.script(self.posts)
                self.posts += 1
                if not carried:
                    carried = True
                    self.connections += 1
                for piece in answer.pieces:
                    writer.write(piece)
                    await writer.drain()
                if answer.then == RESET:
                    writer.transport.abort()
                    return
                if answer.then == CLOSE:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()
