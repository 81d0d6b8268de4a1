"""Flow control's queue in `ctl status`: a router following a real controller reports
what it holds at capacity, and ctl shows it while non-zero."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import pytest

from llmgw.testing import Program, start_program

from .controller_harness import Controller, Db, FakeAgents, controller, spec, wait_for
from .router_fixtures import base_config, chat_body, router, sim_args, wait_until_scraped
from .test_ctl_controller import ctl

pytestmark = pytest.mark.slow

TOKEN = "integration-token"
MODEL = "m1"


@dataclass
class Fleet:
    c: Controller
    router: Program


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A controller serving m1 on one real sim-engine of 8 sequences, and a router
    following it (no client keys: one anonymous tenant, band standard)."""
    tmp = tmp_path_factory.mktemp("flowstatus")
    engine = start_program(
        sim_args(model=MODEL, speed=1.0, extra=("--max-num-seqs", "8")), log_dir=tmp
    )
    try:
        with controller(Db(f"sqlite:///{tmp}/c.db"), token=TOKEN, log_dir=tmp) as c:
            c.post("/admin/models", [spec(MODEL)])
            agents = FakeAgents(c, {"n1": 8})
            # The first shard reported lands on the real engine's port.
            agents._next_port = int(engine.url.rsplit(":", 1)[1]) - 1
            cfg = base_config(controller={"url": c.url, "token": TOKEN, "poll_timeout_s": 5.0})
            with agents, router(tmp, cfg) as r:
                wait_for(lambda: c.endpoint_ids(), what="m1 placed and ready")
                # The router has the replica and its figures, not only the controller.
                asyncio.run(wait_until_scraped(r.url, c.endpoint_ids()))
                yield Fleet(c, r)
    finally:
        engine.stop(grace_s=3)


async def send(s: aiohttp.ClientSession, url: str, tokens: int) -> str:
    """The answer's status as "200", or with its body: a failure shows why."""
    body = chat_body("flow", max_tokens=tokens, stream=True, model=MODEL)
    async with s.post(url + "/v1/chat/completions", json=body) as resp:
        text = await resp.text()
        return "200" if resp.status == 200 else f"{resp.status} {text[:300]}"


def queued_in_status(f: Fleet) -> list[dict[str, object]]:
    r = ctl(f.c.url, "status", "--json")
    assert r.code == 0, r.err
    data = r.json()
    assert isinstance(data, dict)
    out = data["flow_queued"]
    assert isinstance(out, list)
    return out


class TestFlowInStatus:
    """ctl status shows the routers' flow-control queues while requests wait in them."""

    def test_queue_depth_reaches_ctl_status_and_leaves_it(self, fleet: Fleet) -> None:
        """With the engine full and requests held by the router, `ctl status --json` has
        them by band and team and the screen says so; once served, neither does."""
        url = fleet.router.url
        seen: list[list[dict[str, object]]] = []

        async def scenario() -> list[str]:
            async with aiohttp.ClientSession() as s:
                # 12 at once on an engine of 8: it queues, the router learns its capacity.
                warm = await asyncio.gather(*(send(s, url, 150) for _ in range(12)))
                full = [asyncio.create_task(send(s, url, 600)) for _ in range(8)]
                await asyncio.sleep(1.0)  # their first tokens are in: the engine is full
                held = [asyncio.create_task(send(s, url, 20)) for _ in range(3)]
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    got = await asyncio.to_thread(queued_in_status, fleet)
                    if got:
                        seen.append(got)
                        text = await asyncio.to_thread(ctl, fleet.c.url, "status")
                        assert "Queued at capacity" in text.out
                        assert "standard" in text.out
                        break
                    await asyncio.sleep(0.2)
                return [*warm, *await asyncio.gather(*full, *held)]

        statuses = asyncio.run(scenario())
        assert statuses == ["200"] * 23  # nothing lost
        assert seen, "ctl status never showed the queue"
        [row] = seen[0]
        assert (row["band"], row["team"]) == ("standard", "")
        assert row["requests"] in (1, 2, 3)
        wait_for(lambda: queued_in_status(fleet) == [], what="the queue leaves ctl status")
        assert "Queued at capacity" not in ctl(fleet.c.url, "status").out
