"""Flow control's refusals and a key's limits end to end: a limited key refused by a full
queue keeps its requests per minute, and is told what it has left."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing import start_program

from .router_fixtures import Reply, base_config, chat_body, post, router, sim_args
from .test_router_flow import queued, until

pytestmark = pytest.mark.slow

MODEL = "sim-model"
FILL = "sk-fill"
LIMITED = "sk-limited"


def key(name: str, secret: str, **limits: int) -> dict[str, object]:
    return {"name": name, "team": name, "sha256": hashlib.sha256(secret.encode()).hexdigest()} | (
        limits
    )


async def send(s: aiohttp.ClientSession, url: str, secret: str, tokens: int) -> Reply:
    body = chat_body("limits", max_tokens=tokens, model=MODEL)
    return await post(s, url, body, headers={"Authorization": f"Bearer {secret}"})


class TestFlowRefusalAndLimits:
    """A request flow control refuses costs its key nothing."""

    async def test_flow_refusals_leave_the_keys_rpm_whole(self, tmp_path: Path) -> None:
        """Five 429 flow_queue_full answers to a 3 rpm key each say 3 requests remain, and
        its requests are served once the engine has room."""
        engine = start_program(
            sim_args(model=MODEL, speed=1.0, extra=("--max-num-seqs", "8")), log_dir=tmp_path
        )
        cfg = base_config(
            endpoints=[{"id": "e0", "url": engine.url, "models": [MODEL]}],
            api_keys=[key("fill", FILL), key("limited", LIMITED, rpm=3)],
            # One queued request fills the band: every later arrival is refused at once.
            flow={"standard": {"max_queued": 1, "max_wait_s": 20.0}},
        )
        try:
            with router(tmp_path, cfg) as r:
                async with aiohttp.ClientSession() as s:
                    # 12 on an engine of 8: it queues, and the router learns its capacity.
                    warm = await asyncio.gather(*(send(s, r.url, FILL, 150) for _ in range(12)))
                    assert [w.status for w in warm] == [200] * 12
                    await asyncio.sleep(0.5)
                    running = [asyncio.create_task(send(s, r.url, FILL, 600)) for _ in range(8)]
                    await asyncio.sleep(0.8)
                    held = asyncio.create_task(send(s, r.url, FILL, 4))
                    await until(lambda: queued(r.url) != {}, "one request queued")
                    refused = [await send(s, r.url, LIMITED, 4) for _ in range(5)]
                    await asyncio.gather(held, *running)
                    after = await send(s, r.url, LIMITED, 4)
        finally:
            engine.stop(grace_s=3)
        codes = [x.json()["error"]["code"] for x in refused]
        assert codes == ["flow_queue_full"] * 5
        assert [x.headers.get("x-ratelimit-remaining-requests") for x in refused] == ["3"] * 5
        assert all(x.headers["x-ratelimit-limit-requests"] == "3" for x in refused)
        assert after.status == 200, after.body
        assert after.headers["x-ratelimit-remaining-requests"] == "2"
