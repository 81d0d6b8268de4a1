"""An event loop on a `ManualClock`: asyncio's timers and the injected clock read one time.

Under `run(main, clock)` a sleep, `asyncio.timeout` or `call_at` takes no real
time: whenever every task waits and a timer is due later, the loop moves
`clock` to that timer at once. So code that waits on the loop (the hold queue,
a stream's idle bound) and code that reads the injected clock (deadlines,
breakers) agree, and a test of "after 30 s" runs in microseconds.

For in-memory tests only (the fake forwarder, no sockets): when nothing is ready
and no timer is set, nothing can ever happen, and the loop raises `Stuck`
instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

from llmgw.runtime.clock import ManualClock

T = TypeVar("T")


class Stuck(RuntimeError):
    """Every task waits on something that no timer and no I/O will ever bring."""


class _JumpingSelector(selectors.DefaultSelector):
    """Polls without blocking; where the loop would block until a timer, moves the clock."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise Stuck("every task waits and no timer is set")
        self.clock.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector loop whose `time()` is `clock.monotonic()`."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        super().__init__(_JumpingSelector(clock))

    def time(self) -> float:
        return self.clock.monotonic()


def run(main: Coroutine[Any, Any, T], clock: ManualClock) -> T:
    """Run `main` to completion on a fresh `VirtualTimeLoop` over `clock`."""
    loop = VirtualTimeLoop(clock)
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
