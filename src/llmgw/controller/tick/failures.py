"""A tick's failure said once, then again at most every REPEAT_S while it repeats.

A failure that no tick can get past (a stored row this llmgw cannot read, a database
down for an hour) was logged at every tick: on a standby, one line per reload, every
few tenths of a second to seconds, which buries whatever else the log says. The
first line says all there is to say; a repeat every few minutes, with how many ticks
failed meanwhile, says it still holds. A different failure is said at once.
"""

from __future__ import annotations

import logging

from llmgw.runtime.logs import kv

log = logging.getLogger(__name__)

# Seconds between two lines for the same failure.
REPEAT_S = 300.0


class FailureLog:
    """Decides which failed ticks are logged; `now` is the loop's monotonic clock."""

    def __init__(self, *, repeat_s: float = REPEAT_S) -> None:
        self._repeat_s = repeat_s
        # The last failure logged and when; None: none yet.
        self._said: str | None = None
        self._said_at = 0.0
        # Ticks failed since that line, the next line's included.
        self._since = 0

    def failed(self, message: str, *, now: float) -> None:
        self._since += 1
        if message == self._said and now - self._said_at < self._repeat_s:
            return
        if message == self._said:
            log.warning(kv("tick failed", error=message, ticks_failed=self._since))
        else:
            log.warning(kv("tick failed", error=message))
        self._said, self._said_at, self._since = message, now, 0
