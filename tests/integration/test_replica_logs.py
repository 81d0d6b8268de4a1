"""`GET /admin/replicas/{id}/logs` and `llmgw ctl logs`, against a real controller, a real
agent and sim-engine children.

The lines checked are appended to the engine's log file by the test (the sim engine
writes little of its own), as an engine would, O_APPEND.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing.procs import Program, free_port, start_program
from llmgw.testing.wait import until
from tests.integration.test_agent_controller import AUTH, TOKEN, sim_model
from tests.integration.test_agent_supervision import AgentRig
from tests.integration.test_ctl_controller import ctl

pytestmark = pytest.mark.timeout(120)

READ_TOKEN = "R"


class Fleet:
    """One controller (admin and read tokens) and one agent with sim engines."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.url = f"http://127.0.0.1:{free_port()}"
        self.controller: Program | None = None
        self.agent = AgentRig(tmp, self.url, token=TOKEN)

    def start(self) -> None:
        self.controller = start_program(
            [
                "controller",
                "--port",
                self.url.rsplit(":", 1)[1],
                "--database",
                f"sqlite:///{self.tmp / 'c.db'}",
                "--token",
                TOKEN,
                "--read-token",
                READ_TOKEN,
                "--tick-s",
                "0.2",
                "--heartbeat-interval-s",
                "0.3",
                "--heartbeat-timeout-s",
                "3",
                "--unreachable-grace-s",
                "600",
                # No router reports in-flight requests: a scaled-down replica stops at once.
                "--drain-grace-s",
                "0.5",
            ],
            log_dir=self.tmp / "controller-logs",
        )
        cfg = self.tmp / "agent.yaml"
        # Small enough that the follow test passes it: a copy-truncate mid-follow.
        cfg.write_text("log_max_bytes: 4096\nlog_keep: 3\n")
        self.agent.start("--config", str(cfg))

    def log_path(self, rid: str) -> Path:
        return self.agent.tmp / "state" / "logs" / f"{rid}-rank0.log"

    def append(self, rid: str, data: bytes) -> None:
        with self.log_path(rid).open("ab") as f:
            f.write(data)

    def stop(self) -> None:
        self.agent.cleanup()
        if self.controller is not None:
            self.controller.stop(grace_s=5)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        f.start()
        yield f
    finally:
        f.stop()


async def get(url: str, *, token: str | None = TOKEN) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers) as s, s.get(url) as resp:
        return resp.status, await resp.json()


async def ready_replica(fleet: Fleet, model: str) -> str:
    async with (
        aiohttp.ClientSession(headers=AUTH) as s,
        s.post(f"{fleet.url}/admin/models", json=sim_model(model)) as resp,
    ):
        assert resp.status == 200, await resp.text()

    async def ready() -> str:
        status, body = await get(f"{fleet.url}/admin/replicas?model={model}")
        assert status == 200, body
        assert [r["state"] for r in body] == ["ready"], body
        rid: str = body[0]["id"]
        return rid

    got: str = await until(
        ready, timeout_s=45, every_s=0.2, ignore=(AssertionError,), what=f"{model} ready"
    )
    return got


class TestReplicaLogs:
    """The admin route asks the replica's agent and answers its log's tail."""

    async def test_the_tail_of_a_live_replica(self, fleet: Fleet) -> None:
        """The last lines come back raw, invalid UTF-8 replaced, the engine key masked."""
        rid = await ready_replica(fleet, "m1")
        async with (
            aiohttp.ClientSession(headers=AUTH) as s,
            s.post(f"{fleet.url}/admin/replicas/{rid}/engine-key") as resp,
        ):
            key = (await resp.json())["api_key"]
        fleet.append(rid, b"alpha \xff\n" + f"key {key}\n".encode() + b"\x1b[31mred\x1b[0m\n")
        status, body = await get(f"{fleet.url}/admin/replicas/{rid}/logs?tail=3")
        assert status == 200, body
        assert body["lines"] == ["alpha \ufffd", "key ***", "\x1b[31mred\x1b[0m"]
        assert (body["replica"], body["rank"], body["node"]) == (rid, 0, "n1")
        assert body["cut"] is False
        # ctl prints them raw, one per line, the escape sequence made visible.
        got = await asyncio.to_thread(ctl, fleet.url, "logs", rid, "--tail", "2", token=TOKEN)
        assert (got.code, got.err) == (0, "")
        assert got.out == "key ***\n\\x1b[31mred\\x1b[0m\n"

    async def test_bad_requests(self, fleet: Fleet) -> None:
        """Bad tail or rank, unknown replica or parameter: refused with the reason."""
        rid = await ready_replica(fleet, "m2")
        base = f"{fleet.url}/admin/replicas"
        for query, status, words in [
            ("tail=0", 400, "tail must be in 1..10000"),
            ("tail=10001", 400, "tail must be in 1..10000"),
            ("tail=abc", 400, "tail must be an integer"),
            ("rank=-1", 400, "rank must be in"),
            ("rank=1", 404, "has no rank 1"),
            ("lines=5", 400, "lines"),
        ]:
            got, body = await get(f"{base}/{rid}/logs?{query}")
            assert (got, words in body["error"]["message"]) == (status, True), (query, body)
        got, body = await get(f"{base}/r-nope/logs")
        assert (got, body["error"]["type"]) == (404, "not_found_error")
        # Admin only: the read token may read replicas, never their logs.
        got, body = await get(f"{base}/{rid}/logs", token=READ_TOKEN)
        assert got == 403, body
        assert (await get(f"{base}/{rid}", token=READ_TOKEN))[0] == 200
        assert (await get(f"{base}/{rid}/logs", token=None))[0] == 401
        bad = await asyncio.to_thread(ctl, fleet.url, "logs", "r-nope", token=TOKEN)
        assert bad.code == 1
        assert "no replica with id 'r-nope'" in bad.err

    async def test_an_ended_replica_keeps_its_log(self, fleet: Fleet) -> None:
        """Scaled to zero, the stopped replica's log is still served from the node."""
        rid = await ready_replica(fleet, "m3")
        fleet.append(rid, b"last words\n")
        async with (
            aiohttp.ClientSession(headers=AUTH) as s,
            s.post(
                f"{fleet.url}/admin/models/m3/scale", json={"min_replicas": 0, "max_replicas": 0}
            ) as resp,
        ):
            assert resp.status == 200

        async def stopped() -> bool:
            status, body = await get(f"{fleet.url}/admin/replicas/{rid}")
            return status == 200 and body["state"] == "stopped"

        await until(stopped, timeout_s=30, every_s=0.2, what="replica stopped")
        status, body = await get(f"{fleet.url}/admin/replicas/{rid}/logs?tail=1")
        assert (status, body["lines"]) == (200, ["last words"])

    async def test_an_unreachable_node_is_503(self, fleet: Fleet) -> None:
        """The agent gone silent: 503 naming the node, no wait for an answer."""
        rid = await ready_replica(fleet, "m4")
        assert fleet.agent.agent is not None
        fleet.agent.agent.signal(signal.SIGSTOP)
        try:

            async def unreachable() -> bool:
                status, body = await get(f"{fleet.url}/admin/replicas/{rid}/logs")
                return status == 503 and "node n1 is unreachable" in body["error"]["message"]

            await until(unreachable, timeout_s=30, every_s=0.5, what="503 for an unreachable node")
        finally:
            fleet.agent.agent.signal(signal.SIGCONT)


class TestFollow:
    """`ctl logs --follow` prints new lines as they come, across a rotation, until Ctrl-C."""

    async def test_follow_across_a_rotation(self, fleet: Fleet) -> None:
        """Every appended line once, in order, through a copy-truncate; Ctrl-C exits 130."""
        rid = await ready_replica(fleet, "m5")
        fleet.append(rid, b"before\n")
        env = {
            **os.environ,
            "LLMGW_CONTROLLER": fleet.url,
            "LLMGW_TOKEN": TOKEN,
            "XDG_CONFIG_HOME": "/nonexistent",
        }
        argv = [sys.executable, "-m", "llmgw", "ctl", "logs", rid, "--tail", "1", "-f"]
        proc = subprocess.Popen(
            [*argv, "--interval", "0.3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            # Its first answer printed before anything else is written.
            assert proc.stdout is not None
            first = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
            assert first == b"before\n"
            # 3 batches of 40 lines of ~60 bytes: the log passes 4096 bytes, rotated.
            for batch in range(3):
                await asyncio.sleep(1.0)
                lines = b"".join(
                    b"batch %d line %02d %s\n" % (batch, i, b"x" * 40) for i in range(40)
                )
                fleet.append(rid, lines)
            # Rotated meanwhile (the agent looks four times a second), and polled after.
            await until(
                fleet.log_path(rid).with_name(f"{rid}-rank0.log.1").exists,
                timeout_s=10,
                every_s=0.1,
                what="the log rotated",
            )
            await asyncio.sleep(2.0)
        finally:
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.to_thread(proc.communicate, timeout=20)
        got = ["before", *out.decode().splitlines()]
        expected = ["before"] + [
            f"batch {b} line {i:02d} {'x' * 40}" for b in range(3) for i in range(40)
        ]
        assert (proc.returncode, err.decode()) == (130, "")
        assert expected == got
