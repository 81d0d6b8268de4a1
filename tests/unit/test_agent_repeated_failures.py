"""An agent whose supervise tick or log rotation keeps failing (a full disk): said once,
then every few minutes, and once when it clears."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from llmgw.agent.config import parse_config
from llmgw.agent.gpus.fake import FakeInventory
from llmgw.agent.ports import PortAllocator
from llmgw.agent.service import Agent
from llmgw.agent.statefile import StateStore
from llmgw.agent.supervisor import Supervisor
from llmgw.runtime.clock import ManualClock
from llmgw.runtime.repeats import REPEAT_S
from tests.unit.test_agent_heartbeat_config import ScriptedClient
from tests.unit.test_agent_supervisor import FakeProbe, FakeSpawner

TICK_S = 0.5
FULL = OSError(errno.ENOSPC, "No space left on device")


class FullDiskInventory(FakeInventory):
    """GPUs whose poll fails as a full disk does while `full` is set."""

    full = False

    async def refresh(self) -> None:
        if self.full:
            raise FULL


class FullDiskSupervisor(Supervisor):
    """A supervisor whose log rotation fails as a full disk does while `full` is set."""

    full = False

    async def tidy_logs(self) -> None:
        if self.full:
            raise FULL
        await super().tidy_logs()


def make_agent(tmp_path: Path) -> tuple[Agent, FullDiskInventory, FullDiskSupervisor, ManualClock]:
    clock = ManualClock()
    probe = FakeProbe()
    sup = FullDiskSupervisor(
        log_dir=tmp_path / "logs",
        store=StateStore(tmp_path / "state", node="n1"),
        ports=PortAllocator(21000, 21009, is_free=lambda p: True),
        spawner=FakeSpawner(),
        probe=probe,
        clock=clock,
    )
    cfg = parse_config(
        ["--controller", "http://c:1", "--node", "n1", "--state-dir", str(tmp_path / "s")]
    )
    gpus = FullDiskInventory.from_spec("1xH100-80G", uuid_prefix="n1")
    assert isinstance(gpus, FullDiskInventory)
    agent = Agent(
        config=cfg,
        inventory=gpus,
        supervisor=sup,
        client=ScriptedClient([]),
        probe=probe,
        clock=clock,
    )
    return agent, gpus, sup, clock


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


class TestSuperviseTickFailed:
    """A supervise tick that a full disk fails every time is said once, not every tick."""

    async def test_said_once_then_every_few_minutes_then_cleared(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """'supervise tick failed' was logged at every tick of the outage; now once,
        again after REPEAT_S with the count, and once when a tick works again."""
        agent, gpus, _, clock = make_agent(tmp_path)
        gpus.full = True
        n = int(REPEAT_S / TICK_S)
        with caplog.at_level(logging.INFO):
            for _ in range(n):
                await agent.supervise_step()
                clock.advance(TICK_S)
            (first,) = lines(caplog, "supervise tick failed")
            assert "No space left on device" in first
            await agent.supervise_step()
            again = lines(caplog, "supervise tick failed")
            assert len(again) == 2
            assert f"ticks_failed={n}" in again[1]
            gpus.full = False
            for _ in range(3):
                clock.advance(TICK_S)
                await agent.supervise_step()
        (back,) = lines(caplog, "supervise tick works again")
        assert f"ticks_failed={n + 1}" in back
        assert len(lines(caplog, "supervise tick failed")) == 2
        failed = [r for r in caplog.records if "supervise tick failed" in r.getMessage()]
        assert [r.levelno for r in failed] == [logging.ERROR, logging.ERROR]


class TestLogRotationFailed:
    """Log rotation that a full disk fails every pass is said once, and when it clears."""

    async def test_said_once_then_every_few_minutes_then_cleared(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """'engine log rotation failed' was said once per distinct error and never
        again nor when it cleared; now again after REPEAT_S with the count, and once
        when a pass works again."""
        agent, _, sup, clock = make_agent(tmp_path)
        sup.full = True
        n = int(REPEAT_S / TICK_S)
        with caplog.at_level(logging.INFO):
            for _ in range(n):
                await agent.tidy_step()
                clock.advance(TICK_S)
            assert len(lines(caplog, "engine log rotation failed")) == 1
            await agent.tidy_step()
            again = lines(caplog, "engine log rotation failed")
            assert len(again) == 2
            assert f"passes_failed={n}" in again[1]
            sup.full = False
            await agent.tidy_step()
            await agent.tidy_step()
        (back,) = lines(caplog, "engine log rotation works again")
        assert f"passes_failed={n + 1}" in back
