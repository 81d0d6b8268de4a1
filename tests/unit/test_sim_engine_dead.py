"""sim-engine loop guard: a loop that raises kills the engine loudly, never silently."""

from __future__ import annotations

import asyncio
import logging
from typing import NoReturn

import pytest

from llmgw.simengine import app as sim_app
from llmgw.simengine.app import SimEngine
from llmgw.simengine.batcher import SimRequest
from llmgw.simengine.config import SimConfig
from llmgw.simengine.faults import FaultPatch

CFG = SimConfig(model="m", served_model_names=("m",), num_gpu_blocks=100, max_model_len=64)


class Died(Exception):
    """Stands in for the process exit."""


def die() -> NoReturn:
    raise Died


def req(rid: str) -> SimRequest:
    return SimRequest(rid, [1, 2, 3], arrival_s=0.0, max_tokens=50, seed=1, ignore_eos=True)


class TestLoopGuard:
    """A failing engine loop fails loudly, and cancelling it is not a failure."""

    async def test_loop_error_fails_streams_health_and_exits(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The loop's exception is logged with its traceback, every open stream is
        failed and woken, /health answers 503, and the process exit is called."""
        monkeypatch.setattr(sim_app, "DEAD_EXIT_DELAY_S", 0.0)
        sim = SimEngine(CFG, die=die)
        sim.faults.update(FaultPatch(loop_error_after_steps=2))
        streams = [sim.engine.submit(req(f"r{i}")) for i in range(3)]
        assert (await sim.health(None)).status == 200
        with caplog.at_level(logging.ERROR), pytest.raises(Died):
            await sim.run_engine()
        assert all(s.failed and s.ready() for s in streams)
        for s in streams:
            await s.wait_output()  # returns at once: nobody waits forever
        assert (await sim.health(None)).status == 503
        failure = [r for r in caplog.records if r.exc_info]
        assert failure
        assert "loop_error_after_steps" in str(failure[0].exc_info[1])  # type: ignore[index]

    async def test_cancel_is_not_a_failure(self) -> None:
        """Stopping the loop (cancellation at shutdown) leaves the engine alive."""
        sim = SimEngine(CFG, die=die)
        task = asyncio.create_task(sim.run_engine())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not sim.dead
