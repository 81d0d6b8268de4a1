"""The hold queue for models with no available replica."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.router.errors import HoldQueueFull
from llmgw.router.request.holding import Holding


class TestHold:
    """The hold queue counts demand, enforces its bound and releases on errors."""

    def test_demand_counts_held_requests(self) -> None:
        """Demand is the number held per model, and leaves with them."""
        h = Holding(max_held=10)
        with h.hold("a"), h.hold("a"), h.hold("b"):
            assert h.demand() == {"a": 2, "b": 1}
            assert h.total == 3
        assert h.demand() == {}
        assert h.total == 0

    def test_bound_is_enforced(self) -> None:
        """Beyond max_held a hold is refused at once."""
        h = Holding(max_held=1)
        with h.hold("a"), pytest.raises(HoldQueueFull), h.hold("b"):
            pass
        assert h.total == 0

    def test_count_released_on_exception(self) -> None:
        """A held request that fails still leaves the count."""
        h = Holding()
        with pytest.raises(RuntimeError), h.hold("a"):
            raise RuntimeError("boom")
        assert h.demand() == {}


class TestWait:
    """Held waiters wake on a change or time out."""

    async def test_notify_wakes_waiters(self) -> None:
        """Every waiter wakes on notify_changed()."""
        h = Holding()
        waiters = [asyncio.create_task(h.wait_changed(timeout_s=5)) for _ in range(3)]
        await asyncio.sleep(0)
        h.notify_changed()
        assert await asyncio.gather(*waiters) == [True, True, True]

    async def test_timeout_returns_false(self) -> None:
        """Without a change, the wait ends False after its timeout."""
        assert await Holding().wait_changed(timeout_s=0.01) is False

    async def test_zero_timeout_does_not_wait(self) -> None:
        """A non-positive timeout returns at once."""
        assert await Holding().wait_changed(timeout_s=0) is False

    async def test_change_before_wait_is_not_seen_by_later_waiter(self) -> None:
        """A notify that happened before a wait began does not satisfy it."""
        h = Holding()
        h.notify_changed()
        assert await h.wait_changed(timeout_s=0.01) is False
