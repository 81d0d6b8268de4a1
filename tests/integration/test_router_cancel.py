"""A client that goes away cancels the engine's work, and the router's books balance."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing.wait import until

from .router_fixtures import (
    base_config,
    chat_body,
    endpoint_entries,
    get_json,
    router,
    sim_engines,
    wait_until_scraped,
)

pytestmark = pytest.mark.slow


def engine_running(engine_url: str) -> float:
    with urllib.request.urlopen(engine_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running{")
    )


class TestClientDisconnect:
    """A client disconnect aborts the engine's request."""

    @pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
    async def test_disconnect_aborts_engine_request(self, tmp_path: Path, stream: bool) -> None:
        """Closing the client connection mid-request stops the engine's generation and
        releases the router's in-flight slot."""
        with sim_engines(tmp_path, [2.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0"])
                body = json.dumps(chat_body("go on and on", max_tokens=2000, stream=stream))
                session = aiohttp.ClientSession()

                async def call() -> None:
                    async with session.post(
                        r.url + "/v1/chat/completions",
                        data=body,
                        headers={"Content-Type": "application/json"},
                    ) as resp:
                        assert resp.status == 200
                        await resp.content.readany()
                        await asyncio.sleep(60)

                task = asyncio.create_task(call())
                try:
                    await until(lambda: engine_running(engines[0].url) == 1, blocking=True)
                    await until(
                        lambda: get_json(r.url + "/admin/usage")["inflight"].get("e0") == 1,
                        blocking=True,
                    )
                finally:
                    # The client goes away mid-generation.
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    await session.close()
                await until(lambda: engine_running(engines[0].url) == 0, blocking=True)
                await until(
                    lambda: get_json(r.url + "/admin/usage")["inflight"].get("e0") == 0,
                    blocking=True,
                )
                snap = get_json(r.url + "/admin/endpoints")["endpoints"][0]
        # A client leaving is not the endpoint's fault.
        assert snap["breaker"] == "closed"
