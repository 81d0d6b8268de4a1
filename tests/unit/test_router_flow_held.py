"""Flow control when replicas leave the endpoint list: the real router, proxy and HTTP
server in memory (router_world.py), time virtual."""

from __future__ import annotations

import asyncio
from typing import Any

from llmgw.router.replicas.stats import Stats
from llmgw.testing.forwarder import reply
from llmgw.wire.endpoints import EndpointInfo
from tests.unit.router_world import World

# One replica of `m`; a request may be held for one for two minutes, while the standard
# band lets a request wait 30 s in flow control's queue (the defaults).
CONFIG = """
models: [m]
hold_timeout_s: 120
endpoints:
  - {id: r1, url: "http://10.0.0.9:1", models: [m]}
"""
R2 = EndpointInfo(id="r2", url="http://10.0.0.9:2", models=("m",))


def saturated() -> World:
    """A router whose one replica is at its capacity and has shown it (a queue)."""
    w = World(CONFIG)
    w.router.registry.observe("r1", Stats(running=8, waiting=2, kv_usage=0.5))
    w.router.observed("r1")
    w.fake.script("r2", reply(200, b'{"id":"served"}'))
    return w


class TestReplicasGone:
    """A model whose every replica leaves the list: its queued requests are held for one."""

    def test_a_queued_request_is_served_by_a_replica_that_comes_after_the_bands_wait(
        self,
    ) -> None:
        """Queued at capacity, then the replica leaves and another comes 40 s later: the
        request is served there, within hold_timeout_s, not refused at the band's 30 s."""
        w = saturated()

        async def main() -> Any:
            task = asyncio.create_task(w.send())
            await asyncio.sleep(1)
            assert w.router.flow.waiting == 1
            w.router.apply_endpoints([])
            await asyncio.sleep(40)
            w.router.apply_endpoints([R2])
            return await task

        answer = w.run(main)
        assert (answer.status, answer.body) == (200, b'{"id":"served"}')
        assert (w.router.flow.waiting, w.router.flow.depth()) == (0, {})

    def test_queued_requests_become_held_demand_and_newcomers_are_not_queued(self) -> None:
        """Once the replica is gone, the queued request and one arriving after are both
        held for a replica (the demand the controller starts one for), none queued."""
        w = saturated()

        async def main() -> tuple[int, dict[tuple[str, str], int], dict[str, int]]:
            first = asyncio.create_task(w.send())
            await asyncio.sleep(1)
            w.router.apply_endpoints([])
            second = asyncio.create_task(w.send())
            await asyncio.sleep(1)
            seen = (w.router.flow.waiting, w.router.flow.depth(), w.router.holding.demand())
            w.router.apply_endpoints([R2])
            assert [a.status for a in await asyncio.gather(first, second)] == [200, 200]
            return seen

        assert w.run(main) == (0, {}, {"m": 2})


class TestHoldPointsOfGoneReplicas:
    """A replica that leaves the list takes its hold point with it."""

    def test_a_departed_replicas_low_point_no_longer_holds_the_proxy(self) -> None:
        """r1 queued at 2 of 8, so every request was looked at from a quarter load; once
        r1 has left for r2, only r2's point counts: the ceiling again."""
        w = World(CONFIG)
        for _ in range(10):
            w.router.registry.observe("r1", Stats(running=2, waiting=3, kv_usage=0.5))
            w.router.observed("r1")
        assert w.router.flow.saturated_load < 0.5
        w.router.apply_endpoints([R2])
        w.router.registry.observe("r2", Stats(running=1, waiting=0, kv_usage=0.1))
        w.router.observed("r2")
        assert w.router.flow.saturated_load == 1.0
