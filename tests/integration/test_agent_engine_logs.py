"""What engines write, against a real agent: a chatty engine's log stays within its bound
on disk without slowing the engine or the agent, and a crash inside an endless line still
reports how it ended.

The engine is tests/integration/spew_engine.py, run as the agent's `sim` engine
(`--engine-bin`); the controller is the scripted one of test_agent_supervision.py.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from llmgw.testing.wait import until
from tests.integration.test_agent_supervision import (
    INTERVAL_S,
    AgentRig,
    ScriptedController,
    rig_for,
    scripted_controller,
    sim_spec,
)

pytestmark = pytest.mark.timeout(90)

SPEW = Path(__file__).with_name("spew_engine.py")
MAX_BYTES = 1024 * 1024
KEEP = 2
# What a copy may hold beyond MAX_BYTES: the one line saying what was left out.
MARKER_BYTES = 200


@pytest.fixture
async def controller() -> AsyncIterator[ScriptedController]:
    async with scripted_controller() as c:
        yield c


@pytest.fixture
def rig(tmp_path: Path, controller: ScriptedController) -> Iterator[AgentRig]:
    with rig_for(tmp_path, controller) as r:
        yield r


def start_spewing(rig: AgentRig, tmp_path: Path, **env: str) -> Path:
    """The agent with a small log limit and its default 2 s tick; the stats file."""
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"log_max_bytes: {MAX_BYTES}\nlog_keep: {KEEP}\n")
    stats = tmp_path / "spew-stats"
    rig.start(
        "--config",
        str(cfg),
        "--engine-bin",
        f"sim={sys.executable} {SPEW}",
        env={"SPEW_STATS": str(stats), **env},
        interval_s=2.0,
    )
    return stats


def rss_mib(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[21]) * os.sysconf("SC_PAGE_SIZE") >> 20


class TestChattyEngine:
    """An engine writing tens of MB/s of log lines."""

    async def test_its_log_stays_bounded_and_nothing_waits(
        self, rig: AgentRig, controller: ScriptedController, tmp_path: Path
    ) -> None:
        """At 30 MB/s for 3 s against a 1 MiB limit and a 2 s tick, every rotated copy holds
        at most the limit and the folder stays near (keep + 1) x limit (it held whole ticks
        of output, 60 MB a copy); heartbeats keep their pace, the engine never waits on a
        write and the agent's memory stays flat."""
        rate = 30e6
        stats = start_spewing(rig, tmp_path, SPEW_RATE=str(rate), SPEW_SECONDS="3")
        assert rig.agent is not None
        rss_before = rss_mib(rig.agent.pid)
        controller.desired = (sim_spec("r1"),)
        logs = rig.tmp / "state" / "logs"
        peak_copy = peak_live = peak_total = 0
        first_beat = len(controller.beat_times)
        deadline = time.monotonic() + 30
        while not stats.exists() and time.monotonic() < deadline:
            sizes = {}
            for f in logs.glob("r1-rank0.log*"):
                try:
                    sizes[f.name] = f.stat().st_size
                except FileNotFoundError:
                    continue  # shifted between the listing and the stat
            copies = [n for name, n in sizes.items() if not name.endswith(".log")]
            peak_copy = max(peak_copy, *copies, 0)
            peak_live = max(peak_live, sizes.get("r1-rank0.log", 0))
            peak_total = max(peak_total, sum(sizes.values()))
            await asyncio.sleep(0.02)
        written, slowest_ms = stats.read_text().split()
        beats = controller.beat_times[first_beat:]
        gaps = [b - a for a, b in itertools.pairwise(beats)]
        print(
            f"\nwritten {int(written) / 1e6:.0f} MB, slowest write {slowest_ms} ms, "
            f"peak copy {peak_copy / 1e6:.2f} MB, live {peak_live / 1e6:.2f} MB, "
            f"total {peak_total / 1e6:.2f} MB, beats {len(beats)}, "
            f"widest gap {max(gaps, default=0):.2f} s, "
            f"rss {rss_before} -> {rss_mib(rig.agent.pid)} MiB"
        )
        assert int(written) > rate  # it did write for a while
        assert peak_copy <= MAX_BYTES + MARKER_BYTES
        assert peak_total <= KEEP * (MAX_BYTES + MARKER_BYTES) + MAX_BYTES + rate * 1.0
        assert float(slowest_ms) < 1000
        assert max(gaps) < INTERVAL_S + 1.5
        assert rss_mib(rig.agent.pid) - rss_before < 50


class TestEngineDyingMidLine:
    """An engine whose last output is one huge line of garbage, with no line break."""

    async def test_its_failure_says_how_it_ended(
        self, rig: AgentRig, controller: ScriptedController, tmp_path: Path
    ) -> None:
        """A 1 MB line of escapes and invalid UTF-8 before the exit ends the tail with that
        line's end, cut to 300 characters (the tail was empty)."""
        start_spewing(rig, tmp_path, SPEW_RATE="1e6", SPEW_SECONDS="0.1", SPEW_EXIT="1000000")
        controller.desired = (sim_spec("r1"),)
        failed = await until(
            lambda: (s := controller.shard("r1")) and s.state == "failed" and s, what="failed"
        )
        assert failed.exit_code == 3
        assert failed.log_tail[-1].endswith("RuntimeError: boom")
        assert all(len(line) <= 300 for line in failed.log_tail)


class TestCrashLoopAcrossAgentRestarts:
    """An engine crashing at start while its agent is restarted each time."""

    async def test_the_logs_it_leaves_stay_bounded(
        self, rig: AgentRig, controller: ScriptedController
    ) -> None:
        """Three agents (`--ended-logs-keep 1`), each killed after a new replica's engine
        failed, left three logs no shard owns; the next agent keeps only the newest, the
        adopted engine's log, a file not named like a log and its own lock (every crashed
        log stayed, since each agent's list of dropped shards died with it)."""
        logs = rig.tmp / "state" / "logs"
        logs.mkdir(parents=True)
        (logs / "notes.txt").write_text("the operator's\n")
        for i in range(3):
            # Too small a KV cache: the sim engine exits 2 at start.
            crash = sim_spec(f"crash{i}", args=("--num-gpu-blocks", "1"), gpus=(1,))
            controller.desired = (sim_spec("live"), crash)
            agent = rig.start("--ended-logs-keep", "1")
            await until(
                lambda i=i: (s := controller.shard(f"crash{i}")) and s.state == "failed",
                what=f"crash{i} failed",
            )
            await until(lambda: (s := controller.shard("live")) and s.state == "ready", what="up")
            rig.note_pids()
            agent.signal(signal.SIGKILL)
            agent.proc.wait(timeout=10)
        controller.desired = (sim_spec("live"),)
        rig.start("--ended-logs-keep", "1")
        expected = ["agent-logs.lock", "crash2-rank0.log", "live-rank0.log", "notes.txt"]
        await until(lambda: sorted(p.name for p in logs.iterdir()) == expected, what="swept")
