"""Heartbeats: report what is, receive what should be (docs/architecture.md).

`POST {controller}/v1/agents/{node}/heartbeat` with a wire.agent.Heartbeat;
the answer's shard list is the complete desired set for this node.

Losing the controller changes nothing on the node: a refused
connection, a timeout, a 503 from a standby, any non-200 is a failed beat,
retried after a jittered, growing delay; the desired set is only ever taken
from an actual answer, so no engine stops because the controller is away.
With several controller URLs, a failed beat moves to the next one.

Errors:

    HeartbeatFailed           no usable answer (connection, timeout, 5xx, bad body)
    └── HeartbeatRejected     the controller answered 4xx (bad token, unknown route)
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol
from urllib.parse import quote

import aiohttp
import msgspec

from llmgw.agent.errors import AgentError
from llmgw.agent.replyread import read_reply
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.runtime.logs import kv
from llmgw.wire.agent import Heartbeat, HeartbeatReply

log = logging.getLogger(__name__)


class HeartbeatFailed(AgentError):
    """No usable answer from the controller; retry later."""


class HeartbeatRejected(HeartbeatFailed):
    """The controller refused the heartbeat (4xx): likely a configuration error."""


def backoff_delay_s(
    failures: int,
    *,
    base_s: float,
    cap_s: float,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds before the next try after `failures` failures in a row (≥ 1).

    base × 2^(failures-1), capped, then scaled by a random factor in [0.5, 1):
    a controller that comes back is not hit by every agent in the same instant.
    """
    raw = min(cap_s, base_s * 2.0 ** min(failures - 1, 30))
    return raw * (0.5 + rng() / 2)


# Retries never wait longer than this many heartbeat intervals (8 s at the default
# 2 s). A controller that comes back, or a standby that takes over, must hear from
# every agent before its heartbeat timeout (10 s by default), or it shows healthy
# nodes as unreachable; a fixed 30 s cap did exactly that after any outage longer
# than a few seconds. 200 agents retrying every few seconds is no load at all.
BACKOFF_CAP_INTERVALS = 4.0


class HeartbeatSender(Protocol):
    @property
    def url(self) -> str: ...

    async def heartbeat(self, hb: Heartbeat) -> HeartbeatReply:
        """The answer, or HeartbeatFailed."""
        ...

    async def close(self) -> None: ...


class ControllerClient:
    def __init__(
        self, urls: Sequence[str], *, node: str, token: str | None, timeout_s: float = 5.0
    ) -> None:
        if not urls:
            raise ValueError("at least one controller URL is needed")
        self._urls = [u.rstrip("/") for u in urls]
        self._current = 0
        self._node = node
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return self._urls[self._current]

    async def heartbeat(self, hb: Heartbeat) -> HeartbeatReply:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = f"{self.url}/v1/agents/{quote(self._node, safe='')}/heartbeat"
        try:
            async with self._session.post(
                url, data=msgspec.json.encode(hb), headers=self._headers
            ) as resp:
                body = await resp.read()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self._next()
            raise HeartbeatFailed(f"{url}: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            self._next()
            text = body[:300].decode(errors="replace")
            cls = HeartbeatRejected if 400 <= status < 500 else HeartbeatFailed
            raise cls(f"{url}: HTTP {status}: {text}")
        try:
            return read_reply(body)
        except msgspec.DecodeError as exc:
            raise HeartbeatFailed(f"{url}: bad reply: {exc}") from exc

    def _next(self) -> None:
        self._current = (self._current + 1) % len(self._urls)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class Heartbeater:
    """One beat per tick; `beat()` returns how long to wait before the next."""

    def __init__(
        self,
        *,
        client: HeartbeatSender,
        build: Callable[[], Heartbeat],
        on_reply: Callable[[HeartbeatReply], None],
        interval_s: float,
        prepare: Callable[[], Awaitable[None]] | None = None,
        hurry: Callable[[], bool] = lambda: False,
        backoff_base_s: float = 1.0,
        backoff_cap_s: float | None = None,  # None: BACKOFF_CAP_INTERVALS × interval_s
        rng: Callable[[], float] = random.random,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._client = client
        self._build = build
        self._on_reply = on_reply
        self._interval_s = interval_s
        # Awaited before each build (the agent reads the logs the controller asked for).
        self._prepare = prepare
        # After a reply: True when the next beat should go at once (it carries answers).
        self._hurry = hurry
        self._base_s = backoff_base_s
        self._cap_s = BACKOFF_CAP_INTERVALS * interval_s if backoff_cap_s is None else backoff_cap_s
        self._rng = rng
        self._clock = clock
        self.failures = 0
        # Unix seconds of the last accepted beat; None before the first.
        self.last_ok_at: float | None = None
        self.last_error: str | None = None

    async def beat(self) -> float:
        if self._prepare is not None:
            try:
                await self._prepare()
            except Exception:
                # What prepares a beat (log asks) is extra: its failure must not end the
                # loop, or the node would read unreachable while its engines run on.
                log.exception("heartbeat preparation failed; beating without it")
        try:
            reply = await self._client.heartbeat(self._build())
        except HeartbeatFailed as exc:
            self.failures += 1
            self.last_error = str(exc)
            level = logging.ERROR if isinstance(exc, HeartbeatRejected) else logging.WARNING
            delay = backoff_delay_s(
                self.failures, base_s=self._base_s, cap_s=self._cap_s, rng=self._rng
            )
            # Engines are untouched: only an answer changes the desired set.
            log.log(
                level,
                kv("heartbeat failed", failures=self.failures, retry_s=f"{delay:.1f}", error=exc),
            )
            return delay
        if self.failures:
            log.info(kv("controller reachable again", after_failures=self.failures))
        self.failures = 0
        self.last_error = None
        self.last_ok_at = self._clock.wall()
        self._on_reply(reply)
        if self._hurry():
            return 0.0
        # Never slower than the controller expects, nor than we were told.
        return min(self._interval_s, reply.interval_s) if reply.interval_s > 0 else self._interval_s

    async def run(self) -> None:
        while True:
            delay = await self.beat()
            await asyncio.sleep(delay)
