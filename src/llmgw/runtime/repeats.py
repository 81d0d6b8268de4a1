"""A failure said once, then again at most every REPEAT_S while it repeats, and once when
it clears.

A failure that no tick can get past (a stored row this llmgw cannot read, a database
down for an hour) was logged at every tick: on a standby, one line per reload, every
few tenths of a second to seconds, which buries whatever else the log says. The
first line says all there is to say; a repeat every few minutes, with how many times
it failed meanwhile, says it still holds; one line says when it stopped. A different
failure is said at once. A traceback, when the caller has one, goes with the first
line only: the repeats would print the same one again.
"""

from __future__ import annotations

import logging

from llmgw.runtime.logs import kv

# Seconds between two lines for the same failure.
REPEAT_S = 300.0


class FailureLog:
    """Decides which failures of one repeated step are logged, as `event` on `logger`
    (at `level`) with `count_as` the failures since its last line, and `cleared` (info)
    once the step works again; `now` is monotonic. `cleared` None: the caller says it,
    with the count `worked` returns."""

    def __init__(
        self,
        event: str,
        *,
        cleared: str | None,
        count_as: str,
        logger: logging.Logger,
        repeat_s: float = REPEAT_S,
        level: int = logging.WARNING,
    ) -> None:
        self._event = event
        self._cleared = cleared
        self._count_as = count_as
        self._log = logger
        self._repeat_s = repeat_s
        self._level = level
        # The last failure logged and when; None: none since the step last worked.
        self._said: str | None = None
        self._said_at = 0.0
        # Failures since that line, the next line's included.
        self._since = 0
        # Failures since the step last worked.
        self._total = 0

    def failed(self, message: str, *, now: float, exc: BaseException | None = None) -> None:
        """The step failed with `message`; `exc`: its traceback goes with a first line."""
        self._since += 1
        self._total += 1
        if message == self._said and now - self._said_at < self._repeat_s:
            return
        if message == self._said:
            fields = {self._count_as: self._since}
            self._log.log(self._level, kv(self._event, error=message, **fields))
        else:
            self._log.log(self._level, kv(self._event, error=message), exc_info=exc)
        self._said, self._said_at, self._since = message, now, 0

    def worked(self) -> int:
        """The step worked: the failures since it last did (0: none), said in one line
        if any; the next failure is said at once."""
        total = self._total
        if total and self._cleared is not None:
            fields = {self._count_as: total}
            self._log.info(kv(self._cleared, **fields))
        self._said, self._since, self._total = None, 0, 0
        return total
