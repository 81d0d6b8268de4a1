"""A key's requests that wait (held for a replica) and never reach an engine: what they
cost the key, what their refusal says, and what becomes of them when the key goes."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from llmgw.router.config import parse
from llmgw.testing.forwarder import reply
from llmgw.wire.endpoints import EndpointInfo
from tests.unit.router_world import World

KEY = "sk-alice"
AUTH = {"Authorization": f"Bearer {KEY}"}
DIGEST = hashlib.sha256(KEY.encode()).hexdigest()
HELD = "models: [m]\nhold_timeout_s: 2\n"
# Another key that stays: a file with no key at all opens /v1/* to every client.
BOB = f'api_keys: [{{name: bob, sha256: "{"1" * 64}"}}]\n'
REPLICA = EndpointInfo(id="r1", url="http://10.0.0.9:1", models=("m",))


def keyed(limits: str) -> str:
    """A router file with model `m` and no replica, and the key alice with `limits`."""
    return HELD + f"api_keys: [{{name: alice, sha256: {DIGEST}, {limits}}}]\n"


def held_twice(w: World) -> tuple[Any, Any]:
    """Two requests of the key one after the other, each held to its 503."""

    async def main() -> tuple[Any, Any]:
        first = await w.send(headers=AUTH)
        return first, await w.send(headers=AUTH)

    result: tuple[Any, Any] = w.run(main)
    return result


class TestRefusedCostsNothing:
    """A request refused before any engine saw it gives its charge back."""

    def test_a_held_request_refused_gives_its_request_back(self) -> None:
        """With 1 rpm, a 503 after holding leaves the minute's request for the next one."""
        first, second = held_twice(World(keyed("rpm: 1")))
        assert (first.status, second.status) == (503, 503)
        assert second.json()["error"]["code"] == "no_replica"

    def test_the_refusal_carries_the_keys_rate_limit_headers(self) -> None:
        """The 503 says what the key has left, as every answer to a limited key does."""
        first, _ = held_twice(World(keyed("rpm: 1, tpm: 1000")))
        assert first.headers["x-ratelimit-limit-requests"] == "1"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        assert first.headers["x-ratelimit-remaining-tokens"] == "1000"
        assert first.headers["Retry-After"] == "5"

    def test_a_held_request_refused_spends_no_budget(self) -> None:
        """A budget of one token is not spent by a request no engine answered."""
        _, second = held_twice(World(keyed("budget: {tokens: 1, per: day}")))
        assert second.json()["error"]["code"] == "no_replica"


class TestRevokedWhileWaiting:
    """A key revoked while its request is held is refused when the wait ends."""

    def test_revoked_key_is_refused_when_the_replica_comes(self) -> None:
        """Revoked while held, the request is answered 401 once a replica arrives, and the
        engine never sees it."""
        w = World(keyed("rpm: 60").replace("hold_timeout_s: 2", "hold_timeout_s: 30"))
        w.fake.script("r1", reply(200, b'{"id":"served"}'))

        async def main() -> Any:
            task = asyncio.create_task(w.send(headers=AUTH))
            await asyncio.sleep(1)
            w.router.apply_config(parse(HELD + BOB))
            w.router.apply_endpoints([REPLICA])
            return await task

        r = w.run(main)
        assert (r.status, r.json()["error"]["code"]) == (401, "invalid_api_key")
        assert "revoked" in r.json()["error"]["message"]
        assert w.fake.tried() == []


class TestSkippedProbeCostsNothing:
    """A request whose only replica's half-open probe was taken, held to its end, is free."""

    def test_a_request_held_after_a_taken_probe_gives_its_request_back(self) -> None:
        """With 3 rpm: a failure, a slow probe, then a request that finds the probe taken
        and is held to its 503 leaves one request of the minute: no engine saw it."""
        w = World(
            'endpoints: [{id: a, url: "http://10.0.0.1:8000", models: [m]}]\n'
            "breaker: {failure_threshold: 1, cooldown_s: 2}\n"
            f"hold_timeout_s: 1\napi_keys: [{{name: alice, sha256: {DIGEST}, rpm: 3}}]\n"
        )
        w.fake.script("a", reply(500), reply(200, b'{"id":"probe"}', delay_s=5))

        async def main() -> tuple[Any, Any]:
            await w.send(headers=AUTH)  # opens the breaker
            await asyncio.sleep(2.5)  # the cooldown passed: the next request is the probe
            probe = asyncio.create_task(w.send(headers=AUTH))
            await asyncio.sleep(0.5)
            skipped = await w.send(headers=AUTH)
            return skipped, await probe

        skipped, probe = w.run(main)
        assert (skipped.status, probe.status) == (503, 200)
        assert w.fake.tried() == ["a", "a"]
        assert skipped.headers["x-ratelimit-remaining-requests"] == "1"


class TestNarrowedWhileWaiting:
    """A key whose model list loses the request's model while it is held is refused then."""

    def test_a_held_request_for_a_model_the_key_lost_is_refused(self) -> None:
        """Narrowed by a reload to `n` (same hash) while held, the request for `m` is
        answered 403 model_not_allowed once a replica arrives, its request given back,
        and the engine never sees it."""
        alice = f"api_keys: [{{name: alice, sha256: {DIGEST}, rpm: 60, models: [m, n]}}]\n"
        w = World(HELD.replace("[m]", "[m, n]").replace("2", "30") + alice)
        w.fake.script("r1", reply(200, b'{"id":"served"}'))

        async def main() -> Any:
            task = asyncio.create_task(w.send(headers=AUTH))
            await asyncio.sleep(1)
            w.router.apply_config(parse(HELD + alice.replace("[m, n]", "[n]")))
            w.router.apply_endpoints([REPLICA])
            return await task

        r = w.run(main)
        assert (r.status, r.json()["error"]["code"]) == (403, "model_not_allowed")
        assert r.headers["x-ratelimit-remaining-requests"] == "60"
        assert w.fake.tried() == []
