"""Engines put to sleep and woken on the controller's word (ShardSpec.sleep_level).

A ready shard listed with a `sleep_level` is put to sleep (`POST /sleep?level=N
&mode=wait`: requests in flight finish first) and reported `sleeping`; a
sleeping shard listed without one is woken (`POST /wake_up`), then warmed up
with a one-token completion, and only then reported `ready` again: the first
request after a wake would otherwise run several times slower (vLLM's published
figures: 5.8-7.1×), and a router would send it the moment the replica is ready.
Every call carries the engine's key. A call that fails is tried again next
tick; the state reported stays what the engine is known to be.

An engine that becomes ready to the health probe is asked `GET /is_sleeping` when its
model may sleep: an engine adopted after an agent restart may be asleep, and reporting it
ready would send requests into its paused queue; it is reported `sleeping` instead, and
woken if the controller lists it awake. The question is an engine call beside the tick
(enginecalls.py), with a short timeout of its own; the shard stays `starting` until the
answer, and an engine that does not say is reported ready, as before the question.

Ranks above 0 of a multi-node vLLM replica run headless (no HTTP): rank 0's
engine drives them, so they follow the listed state without a call.
"""

from __future__ import annotations

import logging
from typing import Protocol

import aiohttp

from llmgw.agent.probe import netloc
from llmgw.runtime.logs import kv
from llmgw.wire.agent import ShardSpec

log = logging.getLogger(__name__)

WARM_UP_PROMPT = "Hello"


class SleepClient(Protocol):
    """The engine's sleep routes; each answers None on success, else what went wrong."""

    async def sleep(self, host: str, port: int, api_key: str, level: int) -> str | None: ...

    async def wake(self, host: str, port: int, api_key: str) -> str | None: ...

    async def warm_up(self, host: str, port: int, api_key: str, model: str) -> str | None: ...

    async def is_sleeping(self, host: str, port: int, api_key: str) -> bool | None:
        """GET /is_sleeping; None when the engine does not say."""
        ...

    async def close(self) -> None: ...


class HttpSleepClient:
    """vLLM's dev-mode sleep routes and a one-token completion, over one session."""

    def __init__(self, *, timeout_s: float = 300.0, ask_timeout_s: float = 10.0) -> None:
        # A level-2 wake of a large model reads its weights again: minutes, not seconds.
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        # GET /is_sleeping reads a flag: an engine silent this long does not say, and the
        # shard asked is then reported ready rather than `starting` for the minutes above.
        self._ask_timeout = aiohttp.ClientTimeout(total=ask_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def sleep(self, host: str, port: int, api_key: str, level: int) -> str | None:
        return await self._post(host, port, api_key, f"/sleep?level={level}&mode=wait", None)

    async def wake(self, host: str, port: int, api_key: str) -> str | None:
        return await self._post(host, port, api_key, "/wake_up", None)

    async def warm_up(self, host: str, port: int, api_key: str, model: str) -> str | None:
        body = {"model": model, "prompt": WARM_UP_PROMPT, "max_tokens": 1}
        return await self._post(host, port, api_key, "/v1/completions", body)

    async def is_sleeping(self, host: str, port: int, api_key: str) -> bool | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = f"http://{netloc(host)}:{port}/is_sleeping"
        try:
            async with self._session.get(url, headers=headers, timeout=self._ask_timeout) as resp:
                if resp.status != 200:
                    return None
                got = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None
        value = got.get("is_sleeping") if isinstance(got, dict) else None
        return value if isinstance(value, bool) else None

    async def _post(
        self, host: str, port: int, api_key: str, path: str, body: dict[str, object] | None
    ) -> str | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = f"http://{netloc(host)}:{port}{path}"
        try:
            async with self._session.post(url, json=body, headers=headers) as resp:
                if resp.status == 200:
                    await resp.read()
                    return None
                return f"HTTP {resp.status}: {(await resp.text())[:300]}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def wants(spec: ShardSpec, state: str) -> str | None:
    """What a shard in `state` must do now: "sleep", "wake", or None."""
    if state == "ready" and spec.sleep_level is not None:
        return "sleep"
    if state == "sleeping" and spec.sleep_level is None:
        return "wake"
    return None


async def step(
    client: SleepClient, spec: ShardSpec, todo: str, *, host: str, port: int | None, api_key: str
) -> str | None:
    """Do `todo` ("sleep" or "wake", from `wants`) for one shard; the state it is in
    afterwards, or None when the engine refused (unchanged, tried again next tick)."""
    who = {"replica": spec.replica_id, "rank": spec.rank}
    if spec.rank > 0 or port is None:
        return "ready" if todo == "wake" else "sleeping"
    if todo == "sleep":
        assert spec.sleep_level is not None
        err = await client.sleep(host, port, api_key, spec.sleep_level)
        if err is not None:
            log.warning(kv("sleep failed", **who, error=err))
            return None
        log.info(kv("engine asleep", **who, level=spec.sleep_level))
        return "sleeping"
    err = await client.wake(host, port, api_key)
    if err is None:
        err = await client.warm_up(host, port, api_key, spec.served_names[0])
    if err is not None:
        log.warning(kv("wake failed", **who, error=err))
        return None
    log.info(kv("engine awake", **who))
    return "ready"
