"""A stop that cancels a tick mid-write waits for that write before closing the store."""

from __future__ import annotations

import asyncio
import threading

from llmgw.controller.config import ControllerConfig
from llmgw.controller.fleet import commands
from llmgw.controller.fleet.live import Fleet
from llmgw.controller.fleet.records import Changes, Event
from llmgw.controller.store.memory import MemoryStore
from llmgw.runtime.clock import ManualClock
from llmgw.wire.models import ModelSpec


class SlowStore(MemoryStore):
    """A store whose writes wait for `go` (a database busy with a transaction)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def apply(self, changes: Changes) -> list[Event]:
        assert self.go.wait(10), "the test never let the write go"
        return super().apply(changes)


class TestWritesSettled:
    """Fleet.writes_settled waits for writes whose callers were cancelled."""

    async def test_a_cancelled_commit_is_waited_for_and_mirrored(self) -> None:
        """The caller is cancelled while the store works; the wait ends only once the
        write committed, and memory then holds what the store holds."""
        store = SlowStore()
        fleet = Fleet(store, clock=ManualClock(), config=ControllerConfig())
        fleet.begin_term()
        spec = ModelSpec(name="m", engine="sim", gpu_classes=("H100-80G",))
        batch = commands.apply_models(fleet.state, [spec], now=0.0)
        caller = asyncio.create_task(fleet.commit(batch.changes))
        await asyncio.sleep(0.05)
        caller.cancel()
        settled = asyncio.create_task(fleet.writes_settled())
        await asyncio.sleep(0.05)
        assert not settled.done()
        store.go.set()
        await asyncio.wait_for(settled, 10)
        assert caller.cancelled()
        assert "m" in fleet.state.models
        assert "m" in store.load().models

    async def test_nothing_in_flight_returns_at_once(self) -> None:
        """With no write running there is nothing to wait for."""
        fleet = Fleet(MemoryStore(), clock=ManualClock(), config=ControllerConfig())
        await asyncio.wait_for(fleet.writes_settled(), 1)
