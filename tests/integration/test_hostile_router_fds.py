"""The router at 1,024 open files under 1,100 idle client connections (a replay).

Before the connection cap, 1,100 idle connections to a router with 1,024 open files
used up every descriptor: 15 of 15 normal requests failed, the router could not open
a connection to its engine. Now the router raises its soft open-file limit to the hard
one and takes at most half of it, less a reserve, in client connections
(runtime.httpserver.connection_cap): the rest are refused at once (503
too_many_connections, one log line each), a client with an established connection is
served on (each of its requests opens or reuses an engine connection), and once the
idle ones go, new clients are served again and the descriptors come back.
"""

from __future__ import annotations

import http.client
import json
import resource
import shutil
import socket
from pathlib import Path

import pytest

from llmgw.runtime.httpserver import FD_RESERVE
from llmgw.testing import start_program, wait_until
from tests.integration.hostile import Answer as RawAnswer
from tests.integration.hostile import (
    assert_openai_error,
    log_lines,
    no_traceback,
    open_fds,
    parse_answer,
    wait_fds_at_most,
)
from tests.integration.router_fixtures import (
    base_config,
    chat_body,
    config_path,
    endpoint_entries,
    sim_engines,
    write_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

NOFILE = 1024
IDLE = 1100


def _raise_own_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"this process may open only {hard} files; the replay needs {need}")
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _chat(conn: http.client.HTTPConnection, text: str) -> int:
    body = json.dumps(chat_body(text, max_tokens=4)).encode()
    conn.request(
        "POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    resp.read()
    return resp.status


class TestIdleFlood:
    """An idle connection flood at the open-file limit leaves established clients served."""

    @pytest.mark.skipif(
        shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed"
    )
    def test_idle_flood_at_1024_files_leaves_established_clients_served(
        self, tmp_path: Path
    ) -> None:
        """An idle flood at 1,024 files leaves established clients served."""
        _raise_own_limit(IDLE + 256)
        with sim_engines(tmp_path, [50.0]) as engines:
            # Every idle connection comes from 127.0.0.1: the cap as a whole, not one
            # address's share of it.
            conf = base_config(
                endpoints=endpoint_entries(engines), idle_timeout_s=60.0, client_share=1.0
            )
            path = write_config(config_path(tmp_path), conf)
            with start_program(
                ["router", "--config", str(path), "--port", "0", "--workers", "1"],
                log_dir=tmp_path,
                prefix=["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--"],
            ) as r:
                cap = NOFILE // 2 - FD_RESERVE
                keep = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
                assert _chat(keep, "warm") == 200
                fds0 = open_fds(r.pid)
                idle: list[socket.socket] = []
                try:
                    for _ in range(IDLE):
                        idle.append(socket.create_connection(("127.0.0.1", r.port), timeout=10))
                    # Every connection over the cap is answered and closed at once.
                    refused = 0
                    pending = list(idle)

                    def over_the_cap_refused() -> bool:
                        nonlocal refused, pending
                        still: list[socket.socket] = []
                        for s in pending:
                            s.setblocking(False)
                            try:
                                data = s.recv(65536)
                            except BlockingIOError:
                                still.append(s)
                                continue
                            ans = RawAnswer(*parse_answer(data), closed=True, elapsed_s=0)
                            assert assert_openai_error(ans, 503)["code"] == "too_many_connections"
                            refused += 1
                        pending = still
                        return refused >= IDLE - (cap - 1)

                    wait_until(
                        over_the_cap_refused,
                        timeout_s=20,
                        every_s=0.1,
                        what=lambda: f"{IDLE - (cap - 1)} refused; {refused} so far",
                    )
                    # The established connection is one of the cap.
                    assert refused == IDLE - (cap - 1), (refused, cap)
                    # The established client is served on: 15 of 15, each needing an engine
                    # connection while the idle ones hold every client slot.
                    statuses = [_chat(keep, f"served on {i}") for i in range(15)]
                    assert statuses == [200] * 15
                    assert open_fds(r.pid) < NOFILE - FD_RESERVE // 2
                finally:
                    for s in idle:
                        s.close()
                    keep.close()
                # The idle ones gone, new clients are served again.
                fresh = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
                try:
                    assert [_chat(fresh, f"fresh {i}") for i in range(5)] == [200] * 5
                finally:
                    fresh.close()
                assert r.alive()
                fds = wait_fds_at_most(r.pid, fds0 + 6, timeout_s=15)
                assert fds <= fds0 + 6, (fds0, fds)
                text = r.log_text()
                conn_lines = [x for x in log_lines(text, "refused") if "refused connection" in x]
                assert len(conn_lines) == IDLE - (cap - 1)
                no_traceback(text)
                assert f"max_connections={cap}" in text, text[:2000]
