"""Engine priority: the `priority` a request carries to an engine that orders its queue
by one, from its key's band and its tenant's backlog."""

from __future__ import annotations

import asyncio

import msgspec

from llmgw.router.request import enginepriority
from llmgw.router.request.enginepriority import granted, of, with_priority
from llmgw.router.request.flowgate import FlowGate
from llmgw.router.request.tenants import Tenant
from llmgw.wire.keys import ClientKey
from tests.unit.test_router_flow import limits
from tests.unit.test_router_scheduler import snap

FULL = [snap("e1", running=8, waiting=1, capacity=8)]


def tenant(band: str) -> Tenant:
    return Tenant(ClientKey(name="k", sha256="0" * 64, priority=band))  # type: ignore[arg-type]


class TestBandPriority:
    """A key's band sets the value; 0 with no field of the client's writes nothing."""

    def test_bands(self) -> None:
        """critical -10, batch 10; standard and keyless requests are left untouched."""
        assert of(tenant("critical"), {}) == -10
        assert of(tenant("batch"), {}) == 10
        assert of(tenant("standard"), {}) is None
        assert of(None, {"model": "m"}) is None

    def test_a_clients_own_priority_is_replaced(self) -> None:
        """A body naming `priority` gets its key's value, 0 included."""
        assert of(tenant("standard"), {"priority": -100}) == 0
        assert of(None, {"priority": 7}) == 0
        assert of(tenant("batch"), {"priority": -5}) == 10

    def test_backlogged_tenants_wait_behind_the_band(self) -> None:
        """A request let go while its tenant has more queued is one later than its band;
        the same band without a backlog keeps its value."""
        assert granted(None, backlogged=True) == enginepriority.BACKLOGGED
        assert granted(-10, backlogged=True) == -9
        assert granted(None, backlogged=False) is None
        assert granted(10, backlogged=False) == 10


class TestBody:
    """The field is written into the JSON body, replacing any the client sent."""

    def test_written_and_replaced(self) -> None:
        """Other fields stay as they were; an existing priority is overwritten."""
        body = b'{"model":"m","priority":-100,"messages":[]}'
        doc = msgspec.json.decode(with_priority(body, 0))
        assert doc == {"model": "m", "priority": 0, "messages": []}
        assert msgspec.json.decode(with_priority(b"{}", -10)) == {"priority": -10}


class TestBacklog:
    """Flow control says which tenants have requests queued for a model."""

    def test_only_a_tenant_with_requests_queued_is_backlogged(self) -> None:
        """While team a waits in the standard band it is backlogged there, not in
        another band, not for another model, and team b is not."""
        gate = FlowGate(limits())

        async def main() -> None:
            waiter = asyncio.create_task(
                gate.wait_turn("m", "standard", "a", deadline=1e9, snapshots=lambda: FULL)
            )
            await asyncio.sleep(0.01)
            assert gate.backlogged("m", "standard", "a") is True
            assert gate.backlogged("m", "standard", "b") is False
            assert gate.backlogged("m", "batch", "a") is False
            assert gate.backlogged("other", "standard", "a") is False
            waiter.cancel()

        asyncio.run(main())
        assert gate.backlogged("m", "standard", "a") is False
