"""Engines put to sleep and woken on the controller's word (ShardSpec.sleep_level).

A ready shard listed with a `sleep_level` is put to sleep (`POST /sleep?level=N
&mode=wait`: requests in flight finish first) and reported `sleeping`; a
sleeping shard listed without one is woken (`POST /wake_up`), then warmed up
with a one-token completion, and only then reported `ready` again: the first
request after a wake would otherwise run several times slower (vLLM's published
figures: 5.8-7.1×), and a router would send it the moment the replica is ready.
Every call carries the engine's key. A sleep or wake that fails is tried again
next tick; the state reported stays what the engine is known to be. A warm-up
that fails after a wake is tried again alone, and the engine served without it
after a few tries (waking.py). A sleep waits while the engine still has requests
running or waiting, for a little while; one that caught a request as it fell asleep
is undone at once: the engine woken, warmed up and reported `ready` again (quiet.py).

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import msgspec

from llmgw.agent import waking
from llmgw.agent.probe import netloc
from llmgw.agent.quiet import QUIET_WAIT_S, Load, QuietWait, parse_load, undo_sleep
from llmgw.agent.shards import Shard
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

    async def load(self, host: str, port: int, api_key: str) -> Load | None:
        """The requests running and waiting (GET /metrics); None when it does not say."""
        ...

    async def close(self) -> None: ...


class HttpSleepClient:
    """vLLM's dev-mode sleep routes and a one-token completion, over one session."""

    def __init__(
        self,
        *,
        timeout_s: float = 300.0,
        ask_timeout_s: float = 10.0,
        warm_up_timeout_s: float = 60.0,
    ) -> None:
        # A level-2 wake of a large model reads its weights again: minutes, not seconds.
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        # GET /is_sleeping and /metrics read a flag and two gauges: an engine silent this
        # long does not say, and the shard asked is then reported ready (or put to sleep)
        # rather than held for the minutes above.
        self._ask_timeout = aiohttp.ClientTimeout(total=ask_timeout_s)
        # One token, however cold the engine: a warm-up silent this long has failed, and
        # its tries (waking.WarmUpRetry) must end well inside the controller's start
        # deadline (300 s by default), or the deadline fails a replica that is awake.
        self._warm_up_timeout = aiohttp.ClientTimeout(total=warm_up_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def sleep(self, host: str, port: int, api_key: str, level: int) -> str | None:
        return await self._post(host, port, api_key, f"/sleep?level={level}&mode=wait", None)

    async def wake(self, host: str, port: int, api_key: str) -> str | None:
        return await self._post(host, port, api_key, "/wake_up", None)

    async def warm_up(self, host: str, port: int, api_key: str, model: str) -> str | None:
        body = {"model": model, "prompt": WARM_UP_PROMPT, "max_tokens": 1}
        return await self._post(
            host, port, api_key, "/v1/completions", body, limit=self._warm_up_timeout
        )

    async def is_sleeping(self, host: str, port: int, api_key: str) -> bool | None:
        got = await self._get(host, port, api_key, "/is_sleeping")
        try:
            answer = msgspec.json.decode(got) if got is not None else None
        except msgspec.DecodeError:
            return None
        value = answer.get("is_sleeping") if isinstance(answer, dict) else None
        return value if isinstance(value, bool) else None

    async def load(self, host: str, port: int, api_key: str) -> Load | None:
        got = await self._get(host, port, api_key, "/metrics")
        return parse_load(got.decode(errors="replace")) if got is not None else None

    async def _get(self, host: str, port: int, api_key: str, path: str) -> bytes | None:
        """The body of a 200 answer to a short question; None for anything else."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = f"http://{netloc(host)}:{port}{path}"
        try:
            async with self._session.get(url, headers=headers, timeout=self._ask_timeout) as resp:
                return await resp.read() if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def _post(
        self,
        host: str,
        port: int,
        api_key: str,
        path: str,
        body: dict[str, object] | None,
        *,
        limit: aiohttp.ClientTimeout | None = None,  # None: the session's
    ) -> str | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = f"http://{netloc(host)}:{port}{path}"
        try:
            async with self._session.post(
                url, json=body, headers=headers, timeout=limit or self._timeout
            ) as resp:
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


class Patience:
    """The quiet wait before each sleep (quiet.py) and the warm-up's tries after each
    wake (waking.py), kept for all the node's engines."""

    def __init__(
        self,
        *,
        quiet_wait_s: float = QUIET_WAIT_S,
        warm_up: waking.WarmUpRetry = waking.WarmUpRetry(),  # noqa: B008 (frozen)
    ) -> None:
        self.quiet = QuietWait(wait_s=quiet_wait_s)
        self.warm_up = warm_up


@dataclass(frozen=True, kw_only=True)
class Stepped:
    """What a sleep or wake left: the shard's state (None: unchanged, the call is made
    again next tick) and the agent's note on it for the controller ("": none)."""

    state: str | None
    note: str = ""


async def step(
    client: SleepClient,
    spec: ShardSpec,
    todo: str,
    patience: Patience,
    *,
    host: str,
    port: int | None,
    api_key: str,
    awake: Callable[[], None],
    now: float,
) -> Stepped:
    """Do `todo` ("sleep" or "wake", from `wants`) for one shard. `awake` runs once a
    wake has succeeded, before the warm-up; `now` is monotonic seconds (the quiet wait)."""
    who = {"replica": spec.replica_id, "rank": spec.rank}
    if spec.rank > 0 or port is None:
        return Stepped(state="ready" if todo == "wake" else "sleeping")
    if todo == "wake":
        woken = await waking.wake(
            client,
            spec,
            host=host,
            port=port,
            api_key=api_key,
            awake=awake,
            retry=patience.warm_up,
        )
        return Stepped(state=None) if woken is None else Stepped(state="ready", note=woken.note)
    assert spec.sleep_level is not None
    key = (spec.replica_id, spec.rank)
    load = await client.load(host, port, api_key)
    waited_s = patience.quiet.waited_s(key, now)
    if patience.quiet.postpone(key, load, now):
        log.info(kv("sleep postponed", **who, load=str(load), waited_s=round(waited_s, 1)))
        return Stepped(state=None, note=f"sleep postponed: {load}")
    if load is not None and not load.idle:
        log.warning(kv("sleeping with requests still there", **who, load=str(load)))
    err = await client.sleep(host, port, api_key, spec.sleep_level)
    if err is not None:
        log.warning(kv("sleep failed", **who, error=err))
        return Stepped(state=None)
    log.info(kv("engine asleep", **who, level=spec.sleep_level))
    # Read again: a request that arrived since the read above is held by the sleeping
    # engine, and nothing else would ever wake it for that request (quiet.py).
    caught = await client.load(host, port, api_key)
    if undo_sleep(load, caught):
        assert caught is not None
        return await _undo(client, spec, patience, caught, host=host, port=port, api_key=api_key)
    return Stepped(state="sleeping")


async def _undo(
    client: SleepClient,
    spec: ShardSpec,
    patience: Patience,
    caught: Load,
    *,
    host: str,
    port: int,
    api_key: str,
) -> Stepped:
    """Wake an engine whose sleep caught requests (quiet.undo_sleep). It stays `ready`
    throughout, as it was while falling asleep: its cards stay taken (the controller
    wakes no other engine onto them), and no router is sent to it meanwhile (the
    controller still counts it falling asleep, out of the endpoint list)."""
    who = {"replica": spec.replica_id, "rank": spec.rank}
    why = "requests arrived as it fell asleep"
    log.warning(kv("sleep undone", **who, why=why, load=str(caught)))
    woken = await waking.wake(
        client,
        spec,
        host=host,
        port=port,
        api_key=api_key,
        awake=lambda: None,
        retry=patience.warm_up,
    )
    if woken is None:
        # Asleep after all: its requests wait for its next wake, or their deadline.
        return Stepped(
            state="sleeping", note=f"asleep with {caught}: the wake to serve them failed"
        )
    note = f"sleep undone, {why}: {caught}" + (f"; {woken.note}" if woken.note else "")
    return Stepped(state="ready", note=note)


async def drive(
    client: SleepClient, patience: Patience, sh: Shard, todo: str, *, host: str, now: float
) -> bool:
    """`step` for one of the supervisor's shards, its outcome written into it; whether
    the sleep or wake was done (counted in the agent's metrics)."""

    def awake() -> None:
        # Woken, warming up: awake on its cards (the controller keeps them taken), not
        # serving yet. The call in flight keeps the health probe away from it.
        if sh.proc is not None and sh.stop_sent_at is None:
            sh.state, sh.note = "starting", ""

    done = await step(
        client,
        sh.spec,
        todo,
        patience,
        host=host,
        port=sh.port,
        api_key=sh.api_key,
        awake=awake,
        now=now,
    )
    # Re-check: while the call ran, a heartbeat may have stopped it, or the
    # controller changed its mind (the next tick does what it wants now).
    if sh.proc is not None and sh.stop_sent_at is None:
        sh.note = done.note
        if done.state is not None:
            sh.state = "sleeping" if done.state == "sleeping" else "ready"
    return done.state is not None
