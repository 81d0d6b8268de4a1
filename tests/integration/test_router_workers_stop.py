"""`llmgw router --workers 2` stopping: what a client sees while the workers drain.

A real supervisor, its workers and a slow sim-engine; the stream is long enough
that the drain is still under way when the checks run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing.wait import until

from .router_fixtures import (
    base_config,
    chat_body,
    endpoint_entries,
    router,
    sim_engines,
)

pytestmark = pytest.mark.slow


def refused(port: int) -> bool:
    """Whether a new connection to the port is refused (rather than taken)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return False
    except ConnectionRefusedError:
        return True


class TestGracefulStop:
    """SIGTERM to the supervisor drains the streams and turns new clients away."""

    async def test_new_connections_are_refused_while_streams_drain(self, tmp_path: Path) -> None:
        """Once SIGTERM has reached the supervisor, a new connection is refused at once,
        as a one-process router's is (a load balancer moves on), while a stream begun
        before goes on to its end; it was taken into the socket's queue and reset only
        when the drain ended."""
        with sim_engines(tmp_path, [0.05]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg, workers=2) as r:
                async with aiohttp.ClientSession() as session:
                    body = chat_body("hi", max_tokens=40, stream=True)
                    resp = await session.post(r.url + "/v1/chat/completions", json=body)
                    first = await resp.content.readline()
                    assert first.startswith(b"data: ")
                    os.kill(r.pid, signal.SIGTERM)
                    sent = time.monotonic()
                    await until(
                        lambda: refused(r.port),
                        timeout_s=3.0,
                        blocking=True,
                        what="new connections refused during the drain",
                    )
                    assert time.monotonic() - sent < 3.0
                    assert not resp.content.at_eof()
                    rest = await asyncio.wait_for(resp.content.read(), timeout=30)
                    resp.release()
                assert rest.endswith(b"data: [DONE]\n\n")
                with contextlib.suppress(Exception):
                    r.proc.wait(timeout=15)
                assert r.proc.returncode == 0
