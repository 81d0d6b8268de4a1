"""Clients that misbehave leave the router as they found it: its descriptors, memory
and connection slots come back once they are done (or once its bounds cut them off).

Real processes on 127.0.0.1 only (a sim-engine, a router), bounded in count and time.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from tests.integration.hostile import open_fds, rss_kib, wait_fds_at_most
from tests.integration.router_fixtures import (
    base_config,
    endpoint_entries,
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
