"""Clients that misbehave leave the router as they found it: its descriptors, memory
and connection slots come back once they are done (or once its bounds cut them off).

Real processes on 127.0.0.1 only (a sim-engine, a router), bounded in count and time.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing.wait import until
from tests.integration.hostile import open_fds, rss_kib, wait_fds_at_most
from tests.integration.router_fixtures import (
    base_config,
    chat_body,
    endpoint_entries,
    get_json,
    post,
    router,
    sim_engines,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

# An embeddings answer of this many inputs (the sim's 1,024 dimensions) is about 11 MB:
# far more than the kernel's socket buffers take while the client reads nothing.
INPUTS = 512


def _non_reader(port: int, payload: bytes, connection: str) -> socket.socket:
    """A client that sends its request and then reads nothing, its socket left open."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    head = (
        "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        f"Connection: {connection}\r\n\r\n"
    )
    s.sendall(head.encode() + payload)
    return s


class TestAnswersNobodyReads:
    """A client that reads none of a large answer is cut off after idle_timeout_s."""

    @pytest.mark.parametrize("connection", ["keep-alive", "close"])
    async def test_unread_answer_is_dropped(self, tmp_path: Path, connection: str) -> None:
        """Six clients each ask for an 11 MB answer and read none of it, keeping their
        sockets open: within idle_timeout_s (1 s) and a few seconds more the router's
        descriptors and memory are back near where they were, whether the answer was to
        keep the connection or close it (a closing answer waited on them for ever)."""
        payload = json.dumps({"model": "m", "input": ["hello world"] * INPUTS}).encode()
        with sim_engines(tmp_path, [50.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines), idle_timeout_s=1.0)
            with router(tmp_path, cfg) as r:
                async with aiohttp.ClientSession() as session:
                    for _ in range(2):  # warm: the engine connection, one answer's memory
                        got = await post(session, r.url, payload, path="/v1/embeddings")
                        assert got.status == 200, got.body[:300]
                fds0, rss0 = open_fds(r.pid), rss_kib(r.pid)
                socks = [_non_reader(r.port, payload, connection) for _ in range(6)]
                try:
                    # Every answer is made and stuck in the router's buffers.
                    time.sleep(3)
                    fds = wait_fds_at_most(r.pid, fds0 + 2, timeout_s=8)
                    rss = rss_kib(r.pid)
                finally:
                    for s in socks:
                        s.close()
        assert fds <= fds0 + 2, (fds0, fds)
        # Six answers held would be 60 MB and more.
        assert rss <= rss0 + 30_000, (rss0, rss)


KEY = "sk-leaks"
# Router and engine gauges that must all read 0 once every client has gone.
BOOKS = (
    "llmgw_router_inflight{",
    "llmgw_router_pending{",
    "llmgw_router_held{",
    "llmgw_router_flow_queued{",
)


def _gauges(url: str, prefixes: tuple[str, ...]) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in text.splitlines())
        if name.startswith(prefixes)
    }


def _settled(router_url: str, engine_url: str) -> bool:
    books = _gauges(router_url, BOOKS)
    engine = _gauges(engine_url, ("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
    return not any(books.values()) and not any(engine.values())


async def _leaver(port: int, body: dict[str, Any], how: str) -> None:
    """One client of the key that goes away: `first` after its stream's first chunk,
    `early` 0.3 s after sending (before its first token, or while queued or held),
    `upload` with half of its body sent."""
    data = json.dumps(body).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if how == "upload":
            writer.write(head + data[: len(data) // 2])
        else:
            writer.write(head + data)
        await writer.drain()
        if how == "first":
            got = b""
            while b"data:" not in got:
                chunk = await asyncio.wait_for(reader.read(4096), 10)
                assert chunk, got
                got += chunk
        else:
            await asyncio.sleep(0.3 if how != "queued" else 1.0)
    finally:
        writer.close()


async def _remaining(session: aiohttp.ClientSession, url: str) -> int:
    """The key's requests left after one ordinary request."""
    got = await post(
        session, url, chat_body("fine", max_tokens=4), headers={"Authorization": f"Bearer {KEY}"}
    )
    assert got.status == 200, got.body[:300]
    return int(got.headers["x-ratelimit-remaining-requests"])


async def _seen(url: str, how: str, body: dict[str, Any]) -> None:
    """The round did what it says: requests queued by flow control, or held."""
    if how == "queued":
        gauge = "llmgw_router_flow_queued{"
    elif body["model"] == "sleepy":
        gauge = "llmgw_router_held{"
    else:
        return
    await until(
        lambda: sum(_gauges(url, (gauge,)).values()) > 0, blocking=True, timeout_s=5, what=gauge
    )


def _pids(pid: int) -> list[int]:
    """The router and its workers (`--workers N` forks them from the supervisor)."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *map(int, kids)]


def _fds(pid: int) -> int:
    return sum(open_fds(p) for p in _pids(pid))


class TestClientsThatLeave:
    """Clients that leave at any point leave no in-flight count, queue entry or charge."""

    @pytest.mark.parametrize("workers", [1, 2])
    async def test_books_back_to_zero(self, tmp_path: Path, workers: int) -> None:
        """Three rounds of 12 clients each leaving mid-stream, before their first token,
        while queued by flow control at a learned capacity of 2, while held for a model
        with no replica, and mid-upload: each time the router's in-flight, pending, held
        and queued gauges and the engine's running and waiting return to 0, the key
        (600 rpm) gets back the requests that reached no engine, the learned capacity
        stays 2, and the router's descriptors come back."""
        key = {"name": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "rpm": 600}
        long = chat_body("go on", max_tokens=400, stream=True)
        rounds = [
            ("first", long),
            ("early", long),
            ("queued", long),
            ("early", chat_body("wait", model="sleepy")),
            ("upload", long),
        ]
        with sim_engines(tmp_path, [1.0], extra=("--max-num-seqs", "2")) as engines:
            eng = engines[0]
            cfg = base_config(
                endpoints=endpoint_entries(engines),
                models=["sleepy"],
                flow={"enabled": True},
                api_keys=[key],
            )
            with router(tmp_path, cfg, workers=workers) as r:
                # Capacity is learned from the engine seen full, with requests waiting.
                await asyncio.gather(*(_leaver(r.port, long, "queued") for _ in range(5)))
                await until(lambda: _settled(r.url, eng.url), blocking=True, timeout_s=15)
                fds0 = _fds(r.pid)
                async with aiohttp.ClientSession() as session:
                    for _ in range(3):
                        for how, body in rounds:
                            before = await _remaining(session, r.url)
                            seen = asyncio.create_task(_seen(r.url, how, body))
                            await asyncio.gather(*(_leaver(r.port, body, how) for _ in range(12)))
                            await seen
                            await until(
                                lambda: _settled(r.url, eng.url),
                                blocking=True,
                                timeout_s=15,
                                what=f"books at 0 after clients left ({how})",
                            )
                            after = await _remaining(session, r.url)
                            if body["model"] == "sleepy" or how == "upload":
                                # None reached an engine; the bucket refills meanwhile.
                                assert after >= before - 1, (how, before, after)
                    snap = get_json(r.url + "/admin/endpoints")["endpoints"][0]
                fds = _fds(r.pid)
                if fds > fds0 + 4:
                    time.sleep(2)  # connections the router closes as it settles
                    fds = _fds(r.pid)
        assert snap["running_capacity"] == 2, snap
        assert snap["inflight"] == 0, snap
        assert fds <= fds0 + 4, (fds0, fds)
