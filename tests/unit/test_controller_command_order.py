"""Operator commands that race or come in conflicting orders: what they decide and say."""

from __future__ import annotations

import asyncio

from llmgw.controller.api.services import Services
from llmgw.controller.config import ControllerConfig
from llmgw.controller.fleet import commands
from llmgw.controller.fleet.live import Fleet
from llmgw.controller.idle import IdleTracker
from llmgw.controller.store.memory import MemoryStore
from llmgw.runtime.clock import ManualClock
from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.models import ModelSpec
from tests.unit.controller_reconcile_world import World, spec


class TestDeleteStory:
    """A deleted model's events say so before they say what became of its replicas."""

    def test_model_deleted_comes_first(self) -> None:
        """Read in id order, model.deleted precedes each replica's drain or stop."""
        w = World()
        w.node("a")
        w.model(spec("m", min_replicas=2, max_replicas=2))
        w.tick()
        w.ready_all("m")
        batch = commands.delete_model(w.state, w.index, "m", now=w.now, grace_s=5)
        kinds = [e.kind for e in batch.changes.events]
        assert kinds[0] == "model.deleted"
        assert len(kinds) == 3, kinds
        assert all(k.startswith("replica.") for k in kinds[1:]), kinds
        assert batch.changes.events[0].message == "deleted; 2 replica(s) drain"


class TestDeleteAnswer:
    """A delete answers with an adapter's base as the fleet's lock found it, not as before."""

    async def test_adapter_applied_while_the_delete_waited(self) -> None:
        """A delete queued behind the apply that creates adapter `x` says it deleted an adapter."""
        clock, config = ManualClock(), ControllerConfig()
        fleet = Fleet(MemoryStore(), clock=clock, config=config)
        fleet.begin_term()
        services = Services(fleet, IdleTracker(clock=clock), config=config, clock=clock)
        base = ModelSpec(name="m", engine="sim", gpu_classes=("H100-80G",))
        await services.apply_models([base])
        async with fleet.lock:
            # The delete starts while `x` is no adapter yet, and waits for the lock.
            deleting = asyncio.create_task(services.delete_model("x"))
            await asyncio.sleep(0)
            adapter = AdapterSpec(name="x", adapter_of="m", source="/lora/x")
            batch = commands.apply_models(fleet.state, [adapter], now=clock.wall())
            await fleet.commit(batch.changes)
        assert await deleting == "m"
        assert "x" not in fleet.state.adapters
        assert await services.delete_model("m") is None
