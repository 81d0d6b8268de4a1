"""The one way a test waits for a condition: poll it until it holds or time runs out.

A fixed sleep either wastes time (the condition held long before) or flakes
(a loaded two-core machine needed longer); polling returns as soon as the
condition holds, and a timeout fails naming what was awaited and the last value
seen, not a bare "condition not met".

`wait_until` blocks (for tests without an event loop); `until` awaits, so the
test's own servers keep running meanwhile. Both return the first truthy value
the check gave, so a test can wait for a thing and use it in one line. `what`
may be a function, called only on a timeout, to describe the state then (what a
loop gathered while it waited).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# Generous: tests share a loaded machine; a condition that holds ends the wait at once.
DEFAULT_TIMEOUT_S = 30.0


What = str | Callable[[], str]


def _timed_out(timeout_s: float, what: What, check: object, last: object) -> AssertionError:
    said = what() if callable(what) else what
    return AssertionError(f"not within {timeout_s}s: {said or check}; last seen {last!r}")


def wait_until(
    check: Callable[[], T],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    what: What = "",
    every_s: float = 0.05,
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """Call `check` until it returns something truthy, and return that.

    An exception of a type in `ignore` counts as "not yet" (a server still
    starting refuses connections); any other propagates at once. After
    `timeout_s` an AssertionError names `what` and the last value or exception.
    """
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            got = check()
        except ignore as exc:
            last = exc
        else:
            if got:
                return got
            last = got
        if time.monotonic() >= deadline:
            raise _timed_out(timeout_s, what, check, last)
        time.sleep(every_s)


async def until(
    check: Callable[[], Any],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    what: What = "",
    every_s: float = 0.05,
    ignore: tuple[type[Exception], ...] = (),
    blocking: bool = False,
) -> Any:
    """Await `check` holding, and return its first truthy value.

    `check` may be plain or a coroutine function. With `blocking`, it runs in a
    thread: a check that makes a blocking HTTP call would otherwise stall the
    event loop that serves it. `ignore` and the timeout are as in `wait_until`.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: object = None
    while True:
        try:
            got = await asyncio.to_thread(check) if blocking else check()
            if inspect.isawaitable(got):
                got = await got
        except ignore as exc:
            last = exc
        else:
            if got:
                return got
            last = got
        if loop.time() >= deadline:
            raise _timed_out(timeout_s, what, check, last)
        await asyncio.sleep(every_s)
