"""Requests held for a replica whose model leaves the router's models while they wait:
the real router, proxy and HTTP server in memory (router_world.py), time virtual."""

from __future__ import annotations

import asyncio

from llmgw.router.config import parse
from tests.unit.router_world import Answered, World

HELD = "models: [z]\nhold_timeout_s: 120\n"


class TestModelRemovedWhileHeld:
    """A held request whose model the router no longer knows is answered as a new one is."""

    def test_a_reload_without_the_model_answers_404_at_once(self) -> None:
        """Held for `z`, then a reload drops `z`: 404 model_not_found within the second,
        as a request sent then gets, not a 503 after hold_timeout_s; no demand left."""
        w = World(HELD)

        async def main() -> tuple[Answered, float]:
            loop = asyncio.get_running_loop()
            task = asyncio.create_task(w.send({"model": "z", "messages": []}))
            await asyncio.sleep(1)
            assert w.router.holding.demand() == {"z": 1}
            w.router.apply_config(parse("hold_timeout_s: 120\n"))
            removed_at = loop.time()
            answer = await task
            return answer, loop.time() - removed_at

        answer, waited = w.run(main)
        assert (answer.status, answer.json()["error"]["code"]) == (404, "model_not_found")
        assert waited < 1.0
        assert w.router.holding.demand() == {}
