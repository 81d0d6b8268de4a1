"""Per-endpoint circuit breaker with LLM-aware failure classes.

Closed → open after `failure_threshold` consecutive endpoint failures → after a
cooldown, half-open, admitting exactly one probe → closed on success, or open
again with the cooldown doubled (capped at `max_cooldown_s`) if the probe fails.

What counts as a failure is the other half of a breaker, and for LLM serving the
usual "any 4xx/5xx" is wrong: a prompt that is too long or a malformed tool
schema is refused by every replica alike, so counting it would let one client's
bad requests open the breakers of a healthy fleet. `classify_status` draws that
line once; the proxy passes transport failures (connect errors, timeouts, a
stream that breaks mid-way) straight as `Outcome.ENDPOINT_FAILURE`.

Not thread-safe: the router runs it from one asyncio thread (see registry.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from llmgw.runtime.clock import SYSTEM_CLOCK, Clock


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerConfig:
    # Consecutive endpoint failures that open the breaker.
    failure_threshold: int = 5
    # First wait before a probe is admitted; doubles on each failed probe.
    cooldown_s: float = 10.0
    # Ceiling of the doubled cooldown: a replica that comes back is found within this.
    max_cooldown_s: float = 120.0


DEFAULT_BREAKER_CONFIG: Final = BreakerConfig()


class Outcome(enum.Enum):
    """How one dispatched request ended, from the endpoint's point of view."""

    # The endpoint answered properly.
    OK = enum.auto()
    # The endpoint is at fault: connect error, timeout, broken stream, 5xx, 408, 429.
    ENDPOINT_FAILURE = enum.auto()
    # The request was refused for what it is (400, 404, 413, 422 ...): the endpoint
    # answered, so for the breaker this is a success.
    CLIENT_ERROR = enum.auto()
    # No verdict: the client went away (or the request was cancelled) before the
    # endpoint said anything either way. Neither success nor failure; it only
    # returns a half-open probe so that the next request can be the probe.
    ABANDONED = enum.auto()


# 4xx statuses that are the endpoint's fault, not the request's:
# 408 the engine timed out; 429 it is overloaded; 424 is TGI's generation error;
# 401/403 the router already authenticated the client, so an engine refusing us is
# that replica's misconfiguration, and another replica may well accept.
_ENDPOINT_4XX: Final = frozenset({401, 403, 408, 424, 429})


def classify_status(status: int) -> Outcome:
    """The breaker's reading of an upstream HTTP status.

    2xx/3xx → OK; 5xx and the statuses in `_ENDPOINT_4XX` → ENDPOINT_FAILURE;
    every other 4xx (400 bad input, 404 unknown model/adapter, 413 too large,
    422 validation, prompt longer than the context) → CLIENT_ERROR. Transport
    failures have no status: the proxy reports them as ENDPOINT_FAILURE directly.
    """
    if status < 400:
        return Outcome.OK
    if status >= 500 or status in _ENDPOINT_4XX:
        return Outcome.ENDPOINT_FAILURE
    return Outcome.CLIENT_ERROR


class Breaker:
    """One endpoint's breaker. `state()` reads; only `allow()` admits the probe."""

    __slots__ = (
        "_cfg",
        "_clock",
        "_cooldown_s",
        "_failures",
        "_opened_at",
        "_opened_total",
        "_probe_out",
        "_state",
    )

    def __init__(
        self, cfg: BreakerConfig = DEFAULT_BREAKER_CONFIG, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._cfg = cfg
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0  # consecutive, while closed
        self._cooldown_s = cfg.cooldown_s  # current, doubled by failed probes
        self._opened_at = 0.0  # monotonic; meaningful only while open
        self._probe_out = False  # half-open: the one probe has been admitted
        self._opened_total = 0

    @property
    def opened_total(self) -> int:
        """Times this breaker has opened (including re-opens after a failed probe)."""
        return self._opened_total

    @property
    def cooldown_s(self) -> float:
        """The cooldown the breaker waits (or would wait) before its next probe."""
        return self._cooldown_s

    def probe_in_s(self) -> float | None:
        """Seconds until an open breaker admits its probe (0: it would now); None unless open."""
        if self._state is not BreakerState.OPEN:
            return None
        return max(0.0, self._opened_at + self._cooldown_s - self._clock.monotonic())

    def state(self) -> BreakerState:
        """The current state, without side effects: open reads as half-open once the
        cooldown has passed, although the transition happens only in `allow()`."""
        if self._state is BreakerState.OPEN and self._cooled_down():
            return BreakerState.HALF_OPEN
        return self._state

    def admits(self) -> bool:
        """Whether `allow()` would say yes now, read without taking the probe: no while
        half-open with its probe out, though `state()` reads half-open then too."""
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            return self._cooled_down()
        return not self._probe_out

    def allow(self) -> bool:
        """Whether a request may go to this endpoint now; consumes the half-open probe."""
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            if not self._cooled_down():
                return False
            self._state = BreakerState.HALF_OPEN
            self._probe_out = False
        if self._probe_out:
            return False
        self._probe_out = True
        return True

    def success(self) -> None:
        """The endpoint answered: close, and forget past failures and backoff."""
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._cooldown_s = self._cfg.cooldown_s
        self._probe_out = False

    def failure(self) -> None:
        """The endpoint failed a request."""
        if self._state is BreakerState.HALF_OPEN:
            # The probe failed: back off harder before the next one.
            self._cooldown_s = min(self._cooldown_s * 2.0, self._cfg.max_cooldown_s)
            self._open()
        elif self._state is BreakerState.CLOSED:
            self._failures += 1
            if self._failures >= self._cfg.failure_threshold:
                self._open()
        # Already open: requests admitted before it opened are still failing. They
        # say nothing new, and extending the cooldown for them would punish an
        # endpoint for the length of its in-flight streams.

    def abandon(self) -> None:
        """The probe ended without a verdict: let the next request be the probe.

        Only the holder of the probe calls this (the registry's release knows);
        a request admitted while closed that is abandoned says nothing at all.
        """
        if self._state is BreakerState.HALF_OPEN:
            self._probe_out = False

    def record(self, outcome: Outcome, *, probe: bool = False) -> None:
        """Apply one request's outcome; `probe`: this request was the half-open probe.

        Any request's success closes the breaker and any failure while half-open
        re-opens it: both are evidence about the endpoint, probe or not.
        """
        if outcome is Outcome.ENDPOINT_FAILURE:
            self.failure()
        elif outcome is Outcome.ABANDONED:
            if probe:
                self.abandon()
        else:
            self.success()

    def _open(self) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._clock.monotonic()
        self._failures = 0
        self._probe_out = False
        self._opened_total += 1

    def _cooled_down(self) -> bool:
        return self._clock.monotonic() - self._opened_at >= self._cooldown_s
