"""Load spreads by load, not by count: a slower engine gets correspondingly fewer requests."""

from __future__ import annotations

import asyncio
import collections
import uuid
from pathlib import Path

import aiohttp
import pytest

from .router_fixtures import (
    base_config,
    chat_body,
    endpoint_entries,
    post,
    router,
    sim_engines,
    wait_until_scraped,
)

pytestmark = pytest.mark.slow


async def closed_loop(url: str, *, concurrency: int, seconds: float) -> collections.Counter[str]:
    """`concurrency` clients sending distinct prompts back to back; endpoint → answers."""
    counts: collections.Counter[str] = collections.Counter()
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while loop.time() < stop_at:
            # A fresh prompt each time: no prefix affinity, only load decides.
            r = await post(session, url, chat_body(uuid.uuid4().hex * 4, max_tokens=48))
            assert r.status == 200, r.body
            assert r.endpoint is not None
            counts[r.endpoint] += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return counts


class TestLoadSpread:
    """A slower engine gets fewer requests."""

    async def test_slow_engine_gets_fewer_requests(self, tmp_path: Path) -> None:
        """An engine 4× slower receives well under half as many requests as the fast one."""
        with sim_engines(tmp_path, [16.0, 4.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0", "e1"])
                counts = await closed_loop(r.url, concurrency=12, seconds=5.0)
        fast, slow = counts["e0"], counts["e1"]
        assert fast + slow >= 40, counts
        # Count-based routing would give 1:1; a load-aware one approaches 4:1. The
        # bound is loose for a loaded 2-core machine.
        assert fast >= 2.0 * slow, counts
