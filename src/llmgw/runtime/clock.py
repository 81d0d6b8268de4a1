"""Injected time.

Two readings, never mixed: `monotonic()` for durations and deadlines, `wall()`
(unix seconds) for anything that crosses a process boundary or is shown to a
person. `ManualClock` moves only when a test says so.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    """The process's clocks. The C functions themselves, not wrappers: the router's
    hot path reads the clock a few times per request and per streamed chunk."""

    __slots__ = ()

    monotonic = staticmethod(time.monotonic)
    wall = staticmethod(time.time)


SYSTEM_CLOCK: Clock = SystemClock()


class ManualClock:
    """A clock for tests: both readings advance together, only through `advance()`."""

    def __init__(self, *, start_monotonic: float = 1_000.0, start_wall: float = 1.8e9) -> None:
        self._mono = start_monotonic
        self._wall = start_wall

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._mono += seconds
        self._wall += seconds
