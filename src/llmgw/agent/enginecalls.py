"""Calls to running engines (sleep, wake and warm-up, adapter loads), beside the tick.

Each call runs as a task of its own, at most one per engine at a time, and the
supervisor's tick waits for the calls it started only briefly (`wait_started`).
Awaited inside the tick, a call the engine is slow to answer (a `/sleep` in
"wait" mode behind a long request, a level-2 wake reading the weights again, an
engine stopped or wedged) held the whole tick for the client's timeout, minutes:
meanwhile no exit on the node was reaped (its GPUs stayed taken and the
controller could place nothing there), no starting engine was probed ready, no
other engine slept, woke or loaded an adapter. A call records its own outcome
when it ends, and `wait_finished` lets the supervise loop tick again at once,
so a swap's wake follows its sleep without waiting out an interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Coroutine
from typing import Any

from llmgw.runtime.logs import kv

log = logging.getLogger(__name__)

# How long a tick waits for the calls it started: a call that answers within it
# is seen in the same tick (a swap's sleep, then its wake, in one tick).
CALL_WAIT_S = 1.0

Key = tuple[str, int]


class EngineCalls:
    """The calls in flight, by shard key (replica_id, rank)."""

    def __init__(self) -> None:
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        # Set when a call ends; the supervise loop's wait clears it.
        self._finished = asyncio.Event()

    def busy(self, key: Key) -> bool:
        """A call to this engine is still in flight."""
        return key in self._tasks

    def start(self, key: Key, call: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `call` for the engine at `key` (never two at once for one engine)."""
        assert key not in self._tasks, key
        task = asyncio.create_task(call)
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._ended(key, t))
        return task

    def _ended(self, key: Key, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        self._finished.set()
        if not task.cancelled() and (exc := task.exception()) is not None:
            # The clients translate the engine's errors into answers; anything else
            # is a bug, logged here rather than lost with the task.
            log.error(kv("engine call failed", replica=key[0], rank=key[1], error=repr(exc)))

    async def wait_started(
        self, tasks: Collection[asyncio.Task[None]], *, timeout_s: float = CALL_WAIT_S
    ) -> None:
        """Until `tasks` end, or `timeout_s`; those still running go on without the tick."""
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    async def wait_finished(self, *, timeout_s: float) -> None:
        """Until a call ends (at once if one ended since the last wait), or `timeout_s`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._finished.wait(), timeout_s)
        self._finished.clear()

    async def close(self) -> None:
        """Cancel every call in flight and wait for each to end."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
