"""A wake, then its warm-up, tried again alone when it fails (sleeping.py drives it).

`POST /wake_up` succeeds and the engine is awake; the one-token warm-up that
follows may still fail (a 5xx, a timeout). Before this module the whole step
counted as a failed wake: the shard stayed `sleeping` in the agent's report
although its engine was awake on its cards, and every tick woke it again and
warmed it up again, until the controller's deadline failed the replica minutes
later, with a reason ("still waking") that named neither the engine nor the
warm-up.

Now a wake that succeeded is never repeated: the shard is reported `starting`
at once (awake on its cards, not serving yet), and the warm-up alone is tried
again with a backoff (WarmUpRetry). After the last try the shard is reported
`ready` all the same, with the failure in its note, so the controller's event
says "awake, not warmed up: …". A warm-up only spares the first request a slow
step; an engine started cold is reported ready on its health probe with no
completion tried at all, and failing a woken engine for it would trade seconds
of one slow request for a cold start elsewhere. An engine that cannot serve is
seen as one started cold is: its process exits (vLLM's does when its engine
core dies), or the routers' breakers take it out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from llmgw.runtime.logs import kv
from llmgw.wire.agent import ShardSpec

log = logging.getLogger(__name__)


class WakeClient(Protocol):
    """The two engine calls of a wake (sleeping.SleepClient has them)."""

    async def wake(self, host: str, port: int, api_key: str) -> str | None: ...

    async def warm_up(self, host: str, port: int, api_key: str, model: str) -> str | None: ...


@dataclass(frozen=True, kw_only=True)
class WarmUpRetry:
    """How often a failed warm-up is tried again after one wake, and how far apart."""

    # Warm-ups after one wake, the first included; at least 1.
    tries: int = 3
    # Seconds before the second try; doubled before each next one, up to max_backoff_s.
    first_backoff_s: float = 1.0
    max_backoff_s: float = 8.0

    def backoff_s(self, failed: int) -> float:
        """Seconds to wait after the `failed`-th failed try (from 1)."""
        return float(min(self.max_backoff_s, self.first_backoff_s * 2 ** (failed - 1)))


@dataclass(frozen=True, kw_only=True)
class Woken:
    """A wake that succeeded; `note` says why it is not warmed up ("" when it is)."""

    note: str = ""


async def wake(
    client: WakeClient,
    spec: ShardSpec,
    *,
    host: str,
    port: int,
    api_key: str,
    awake: Callable[[], None],
    retry: WarmUpRetry,
    pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Woken | None:
    """Wake the engine and warm it up; None when the wake itself was refused (still
    asleep: tried again next tick). `awake` runs once the engine is awake, before the
    warm-up, so the caller reports it holding its cards."""
    who = {"replica": spec.replica_id, "rank": spec.rank}
    err = await client.wake(host, port, api_key)
    if err is not None:
        log.warning(kv("wake failed", **who, error=err))
        return None
    awake()
    for attempt in range(1, retry.tries + 1):
        err = await client.warm_up(host, port, api_key, spec.served_names[0])
        if err is None:
            log.info(kv("engine awake", **who, warm_ups=attempt))
            return Woken()
        if attempt < retry.tries:
            wait_s = retry.backoff_s(attempt)
            log.warning(kv("warm-up failed, trying again", **who, attempt=attempt, error=err))
            await pause(wait_s)
    note = f"warm-up failed {retry.tries} times, last: {err}"
    log.warning(kv("engine awake, not warmed up", **who, error=err, tries=retry.tries))
    return Woken(note=note)
