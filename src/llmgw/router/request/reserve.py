"""The critical reserve: room a model keeps for its `critical` band at saturation, and how
much.

At saturation a slot that frees up is taken at once by the backlog, so a `critical`
request that arrives finds none and waits for the next release. Once a critical request
has met a model's replicas with no more room than the reserve, that room is kept for
the critical band for `RESERVE_FOR_S` after each such request (`keep`): `standard` and
`batch` requests are held while the replicas have no room beyond it (flowgate.py).

**Its size.** A reserve of one slot is gone after one critical arrival until the next
release refills it; an arrival in between waits. Releases refill the reserve first
(strict priority), so the reserve behaves as a buffer that critical arrivals drain at
their rate and the model's releases refill at theirs: with `ratio` = critical arrivals
over releases, an arrival finds all of `n` reserved slots taken about `ratio ** n` of the
time. So the reserve is the smallest `n` that makes that at most `MISS_SHARE`, from both
rates as this router sees them at saturation (decayed over `RATE_S`): a band that is a
tenth of the model's traffic gets two slots, a fifth three, a half seven. Never below
the configured `critical_reserve` (the floor; 0 turns the reserve off), and never more
than a tenth of the slots of the model's live replicas, since every reserved slot is a
slot the other bands do not use while no critical request needs it.

**Workers.** A reserve one worker keeps, every worker keeps (flowpeers.py); each sizes
it from the arrivals and releases it sees, whose ratio is the router's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot
from llmgw.router.request.flowpeers import SharedQueues
from llmgw.router.routing.scheduler import SchedulerConfig
from llmgw.runtime.clock import Clock

# How long a model's critical reserve is kept after the last critical request that
# needed it (met the replicas with no more room than the reserve).
RESERVE_FOR_S: Final = 10.0
# How often a critical arrival may find the whole reserve taken (module doc).
MISS_SHARE: Final = 0.01
# The time over which arrivals and releases are counted (exponential decay).
RATE_S: Final = 10.0
# Releases counted before the ratio is trusted: until then the reserve is the floor.
MIN_RELEASES: Final = 20.0
# The most of a model's slots the reserve may take.
MOST_SHARE: Final = 0.1


class _Rates:
    """Critical arrivals and releases of one model, each decayed over RATE_S."""

    __slots__ = ("arrivals", "at", "releases")

    def __init__(self, now: float) -> None:
        self.arrivals = 0.0
        self.releases = 0.0
        self.at = now

    def decay(self, now: float) -> None:
        if now > self.at:
            k = math.exp((self.at - now) / RATE_S)
            self.arrivals *= k
            self.releases *= k
            self.at = now


def reserve_for(ratio: float, floor: int, most: int) -> int:
    """The reserve for critical arrivals at `ratio` of the releases (module doc), between
    `floor` and `most` (`most` below `floor`: the floor)."""
    if floor <= 0:
        return 0
    if ratio <= 0.0:
        return floor
    n = most if ratio >= 1.0 else math.ceil(math.log(MISS_SHARE) / math.log(ratio) - 1e-9)
    return max(floor, min(n, most))


class CriticalReserve:
    """Which models keep a critical reserve now, and how large each is."""

    def __init__(
        self,
        floor: int,
        *,
        clock: Clock,
        scheduler: SchedulerConfig,
        shared: SharedQueues | None = None,
    ) -> None:
        # The configured `critical_reserve`: the least a kept reserve is; 0: none.
        self.floor = floor
        self._clock = clock
        self._cfg = scheduler
        self._shared = shared
        # Model → when a critical request last needed its reserve (monotonic seconds);
        # only models whose reserve is kept. Read by the proxy on every release.
        self.kept: dict[str, float] = {}
        self._rates: dict[str, _Rates] = {}

    def keep(self, model: str) -> None:
        """A critical request needed `model`'s reserve now: kept here, and told to the
        other workers (once a second at most), which keep it too (`kept_for`)."""
        now = self._clock.monotonic()
        self.kept[model] = now
        if self._shared is not None:
            self._shared.keep_reserve(model, now)

    def kept_for(self, model: str) -> bool:
        """Whether `model`'s reserve is kept now, here or by another worker (a reserve
        another worker keeps is kept here too, until it lapses)."""
        if self.kept:
            self._lapse()
        if model in self.kept:
            return True
        shared = self._shared
        if shared is None:
            return False
        # A stamp is the second after the need: within RESERVE_FOR_S plus one of now.
        stamp = shared.reserved_elsewhere(model)
        if stamp == 0 or stamp < self._clock.monotonic() - RESERVE_FOR_S:
            return False
        self.kept[model] = float(stamp)
        return True

    def _lapse(self) -> None:
        """Drop the reserves no critical request has needed for `RESERVE_FOR_S`."""
        since = self._clock.monotonic() - RESERVE_FOR_S
        for model in [m for m, at in self.kept.items() if at < since]:
            del self.kept[model]
            self._rates.pop(model, None)

    def arrived(self, model: str) -> None:
        """A critical request of `model` met flow control (at saturation, or while a
        reserve is kept)."""
        self._of(model).arrivals += 1.0

    def released(self, model: str) -> None:
        """A request of `model` released its replica while a reserve is kept somewhere."""
        self._of(model).releases += 1.0

    def _of(self, model: str) -> _Rates:
        now = self._clock.monotonic()
        r = self._rates.get(model)
        if r is None:
            r = self._rates[model] = _Rates(now)
        else:
            r.decay(now)
        return r

    def size(self, model: str, snaps: Sequence[Snapshot]) -> int:
        """The reserve `model` keeps over its replicas `snaps` (module doc)."""
        floor = self.floor
        r = self._rates.get(model)
        if floor <= 0 or r is None:
            return floor
        r.decay(self._clock.monotonic())
        if r.releases < MIN_RELEASES:
            return floor
        least = self._cfg.default_capacity
        slots = sum(
            max(s.running_capacity, least) for s in snaps if s.breaker is not BreakerState.OPEN
        )
        return reserve_for(r.arrivals / r.releases, floor, int(slots * MOST_SHARE))
