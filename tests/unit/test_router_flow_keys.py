"""Flow control's metric series per team as keys come and go: the real router, proxy and
HTTP server in memory (router_world.py), time virtual."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from llmgw.router.config import parse
from llmgw.router.replicas.stats import Stats
from llmgw.testing.forwarder import reply
from tests.unit.router_world import World

ENDPOINT = 'endpoints: [{id: r1, url: "http://10.0.0.9:1", models: [m]}]\n'


def key(name: str) -> str:
    digest = hashlib.sha256(f"sk-{name}".encode()).hexdigest()
    return f"{{name: {name}, sha256: {digest}}}"


def config(*names: str) -> str:
    return ENDPOINT + f"api_keys: [{', '.join(key(n) for n in names)}]\n"


def flow_wait_teams(w: World) -> set[str]:
    """The teams of the llmgw_router_flow_wait_seconds series /metrics shows."""
    out = set()
    for line in w.router.metrics.render().decode().splitlines():
        if line.startswith("llmgw_router_flow_wait_seconds_count{"):
            out.add(line.split('team="', 1)[1].split('"', 1)[0])
    return out


class TestFlowSeriesOfKeysThatLeft:
    """A key that leaves the keys in force takes its flow-control series with it."""

    def test_a_revoked_keys_wait_series_is_dropped_and_a_kept_ones_stays(self) -> None:
        """alice and bob (no team: the key's name is the label) each waited at capacity;
        once alice is revoked only bob's series is left, so key churn cannot grow
        /metrics for ever."""
        w = World(config("alice", "bob"))
        w.router.registry.observe("r1", Stats(running=8, waiting=2, kv_usage=0.5))
        w.router.observed("r1")
        w.fake.script("r1", reply(200, b"{}"))

        async def main() -> list[int]:
            sent = [
                asyncio.create_task(w.send(headers={"Authorization": f"Bearer sk-{n}"}))
                for n in ("alice", "bob")
            ]
            await asyncio.sleep(1)
            assert w.router.flow.waiting == 2
            w.router.registry.observe("r1", Stats(running=0, waiting=0, kv_usage=0.1))
            return [a.status for a in await asyncio.gather(*sent)]

        assert w.run(main) == [200, 200]
        assert flow_wait_teams(w) == {"alice", "bob"}
        w.router.apply_config(parse(config("bob")))
        assert flow_wait_teams(w) == {"bob"}


class TestNarrowedWhileQueued:
    """A key whose model list loses the request's model while it is queued is refused."""

    def test_a_queued_request_for_a_model_the_key_lost_is_refused(self) -> None:
        """Queued at capacity, then narrowed by a reload to `n` (same hash): let go, the
        request is answered 403 model_not_allowed and the engine never sees it."""
        digest = hashlib.sha256(b"sk-alice").hexdigest()
        alice = f"api_keys: [{{name: alice, sha256: {digest}, models: [m, n]}}]\n"
        w = World(ENDPOINT + "models: [n]\n" + alice)
        w.router.registry.observe("r1", Stats(running=8, waiting=2, kv_usage=0.5))
        w.router.observed("r1")
        w.fake.script("r1", reply(200, b"{}"))

        async def main() -> Any:
            sent = asyncio.create_task(w.send(headers={"Authorization": "Bearer sk-alice"}))
            await asyncio.sleep(1)
            assert w.router.flow.waiting == 1
            w.router.apply_config(parse(ENDPOINT + "models: [n]\n" + alice.replace("m, n", "n")))
            w.router.registry.observe("r1", Stats(running=0, waiting=0, kv_usage=0.1))
            return await sent

        r = w.run(main)
        assert (r.status, r.json()["error"]["code"]) == (403, "model_not_allowed")
        assert w.fake.tried() == []
