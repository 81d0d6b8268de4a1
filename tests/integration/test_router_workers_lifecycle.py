"""`llmgw router --workers 2` stopping and restarting workers: what a client sees.

A real supervisor, its workers and sim-engines; each wait polls a condition with a
generous deadline.
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
    config_path,
    endpoint_entries,
    post,
    router,
    sim_engines,
    write_config,
)
from .test_router_workers import DEBUG, dead, fresh_session, workers_of

pytestmark = pytest.mark.slow


def refused(port: int) -> bool:
    """Whether a new connection to the port is turned away (rather than taken).

    A connection that reaches the listener in the instant it closes is reset during
    the handshake instead of refused; the client is turned away all the same.
    """
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return False
    except (ConnectionRefusedError, ConnectionResetError):
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


class TestRestartAfterReload:
    """A worker started again runs with what its siblings run with."""

    async def test_a_worker_restarted_after_a_restart_only_change_serves_as_before(
        self, tmp_path: Path
    ) -> None:
        """The file gains a controller in place of its endpoints (which needs a restart,
        so every worker keeps the endpoints in force); a worker killed afterwards comes
        back serving those endpoints, not waiting for a controller nobody follows."""
        with sim_engines(tmp_path, [5.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines), hold_timeout_s=1.0)
            with router(tmp_path, cfg, workers=2) as r:
                edited = {**cfg, "endpoints": [], "controller": {"url": "http://127.0.0.1:9"}}
                write_config(config_path(tmp_path), edited)
                await until(
                    lambda: "config change needs a restart field=controller" in r.log_text(),
                    what="the reload seen",
                )
                old = await until(lambda: _two(workers_of(r.pid)), what="two workers")
                os.kill(old[1], signal.SIGKILL)
                await until(lambda: dead(old[1]), what="worker 1 dead")
                await until(
                    lambda: (
                        old[1] not in workers_of(r.pid).values() and len(workers_of(r.pid)) == 2
                    ),
                    what="worker 1 started again",
                )
                got: dict[str, set[int]] = {}
                deadline = time.monotonic() + 20.0
                async with fresh_session() as session:
                    while "1" not in got and time.monotonic() < deadline:
                        reply = await post(
                            session, r.url, chat_body("hi", max_tokens=2), headers=DEBUG
                        )
                        worker = reply.headers.get("x-llmgw-worker", "?")
                        got.setdefault(worker, set()).add(reply.status)
                assert got.get("1") == {200}, got
                assert all(statuses == {200} for statuses in got.values()), got


def _two(pids: dict[int, int]) -> dict[int, int] | None:
    return pids if set(pids) == {0, 1} else None
