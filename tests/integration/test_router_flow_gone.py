"""Flow control when its model's replicas leave the list: a real router in front of real
sim-engines, the endpoint list edited in the router's file while a request is queued."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing import start_program

from .router_fixtures import (
    Reply,
    base_config,
    chat_body,
    config_path,
    get_json,
    post,
    router,
    sim_args,
    write_config,
)
from .test_router_flow import queued, until

pytestmark = pytest.mark.slow

MODEL = "sim-model"
# The standard band's wait: the queued request outlives it while its model has no replica.
MAX_WAIT_S = 2.0


async def send(s: aiohttp.ClientSession, url: str, tokens: int) -> Reply:
    return await post(s, url, chat_body("gone", max_tokens=tokens, model=MODEL))


def demand(url: str) -> dict[str, int]:
    got: dict[str, int] = get_json(url + "/admin/usage")["demand"]
    return got


class TestQueuedWhenReplicasLeave:
    """A request queued at capacity whose model's replicas all leave is held for one."""

    async def test_the_queued_request_is_held_and_served_by_the_next_replica(
        self, tmp_path: Path
    ) -> None:
        """Queued behind 8 running on e0, then e0 leaves the file: the request becomes
        held demand (not queued), outlives the band's max_wait_s, and is served by e1
        once e1 is added."""
        engines = [
            start_program(
                sim_args(model=MODEL, speed=1.0, extra=("--max-num-seqs", "8")), log_dir=tmp_path
            )
            for _ in range(2)
        ]
        entries = [{"id": f"e{i}", "url": e.url, "models": [MODEL]} for i, e in enumerate(engines)]
        cfg = base_config(
            endpoints=entries[:1],
            models=[MODEL],
            hold_timeout_s=30.0,
            flow={"standard": {"max_wait_s": MAX_WAIT_S}},
        )
        try:
            with router(tmp_path, cfg) as r:
                async with aiohttp.ClientSession() as s:
                    # 12 on an engine of 8: it queues, and the router learns its capacity.
                    warm = await asyncio.gather(*(send(s, r.url, 150) for _ in range(12)))
                    assert [w.status for w in warm] == [200] * 12
                    await asyncio.sleep(0.5)
                    running = [asyncio.create_task(send(s, r.url, 600)) for _ in range(8)]
                    await asyncio.sleep(0.8)
                    held = asyncio.create_task(send(s, r.url, 4))
                    await until(lambda: queued(r.url) != {}, "one request queued")
                    write_config(config_path(tmp_path), {**cfg, "endpoints": []})
                    await until(lambda: demand(r.url) == {MODEL: 1}, "the request held")
                    assert queued(r.url) == {}
                    await asyncio.sleep(MAX_WAIT_S + 0.5)
                    assert not held.done()
                    write_config(config_path(tmp_path), {**cfg, "endpoints": entries[1:]})
                    answer = await asyncio.wait_for(held, timeout=15)
                    await asyncio.gather(*running)
        finally:
            for e in engines:
                e.stop(grace_s=3)
        assert answer.status == 200, answer.body
        assert answer.endpoint == "e1"
