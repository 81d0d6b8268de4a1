"""This router's lease of the controller's limited keys: demand out, shares in.

With every usage report the router says, per limited key, what it was asked for
(requests and estimated tokens per minute, smoothed over a few reports) and the
share it enforces now; the answer leases it new shares (controller/leasebook.py
decides them). `Tenants` (request/tenants.py) enforces whatever `shares()` last
returned, locally: no call to anyone on a request's way.

Cut off from the controller, the router keeps its last shares for the lease's
`lease_s`, then falls back to min(share, limit / routers), `routers` as the
last answer counted them: never the whole limit, never unlimited. The next
answer replaces the fallback.

A controller that answers a report without a body (one from before leases) leases
nothing: `leasing` turns False and the router enforces every key's whole limit,
as it did before leases.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

from prometheus_client.core import GaugeMetricFamily, Metric

from llmgw.runtime.clock import Clock
from llmgw.runtime.logs import kv
from llmgw.wire.keys import ClientKey
from llmgw.wire.leases import KeyDemand, LeaseAnswer

log: Final = logging.getLogger(__name__)

# Time constant of the smoothed demand (seconds), whatever the report interval: a
# burst shows within a report or two, and a router that went quiet lets its share
# go within about three of these.
DEMAND_TAU_S = 5.0
# (rpm, tpm) per minute, as request/tenants.py's Share.
Share = tuple[float, float]


class LeaseKeeper:
    """Smoothed demand per key, the last lease, and its fallback once it expires."""

    def __init__(self, *, clock: Clock) -> None:
        self._clock = clock
        # sha256 → smoothed (requests, tokens) per minute.
        self._demand: dict[str, tuple[float, float]] = {}
        self._last_at = clock.monotonic()
        self._shares: dict[str, Share] = {}
        # When the last lease runs out (monotonic); None: no lease yet.
        self._until: float | None = None
        self._fallen_back = False
        # From the last answer: routers counted (the fallback's divisor), whole limits.
        self._routers = 1
        self._limits: dict[str, Share] = {}
        # sha256 → (budget tokens this process may spend, what the rest of the fleet holds).
        self._allowances: dict[str, tuple[float, float]] = {}
        # None: no answer yet; False: the controller leases nothing. With workers
        # (--workers N) each keeps its own, and their supervisor adds their demands up
        # (add_demand); they spend one bucket and one allowance per key, the router's
        # whole share of each (request/tenants.py).
        self.leasing: bool | None = None

    def demand(self, asked: dict[str, tuple[int, int, float | None]]) -> list[KeyDemand]:
        """What to report: each key asked of or leased to this router, sorted."""
        now = self._clock.monotonic()
        elapsed_s = max(now - self._last_at, 1e-3)
        per_min = 60.0 / elapsed_s
        weight = 1.0 - math.exp(-elapsed_s / DEMAND_TAU_S)
        self._last_at = now
        keys = sorted(set(asked) | set(self._demand) | set(self._shares))
        out: list[KeyDemand] = []
        for digest in keys:
            got = asked.get(digest, (0, 0, None))
            old = self._demand.get(digest, (0.0, 0.0))
            req = old[0] + weight * (got[0] * per_min - old[0])
            tok = old[1] + weight * (got[1] * per_min - old[1])
            if req < 1e-6 and tok < 1e-6:
                self._demand.pop(digest, None)
            else:
                self._demand[digest] = (req, tok)
            held = self._shares.get(digest)
            out.append(
                KeyDemand(
                    sha256=digest,
                    requests=round(req, 6),
                    tokens=round(tok, 6),
                    rpm_held=None if held is None else held[0],
                    tpm_held=None if held is None else held[1],
                    budget_held=None if got[2] is None else max(0.0, got[2]),
                )
            )
        return out

    def answer(self, got: LeaseAnswer | None) -> dict[str, Share]:
        """The controller's answer to a report (None: it answered without a body)."""
        if got is None:
            self.leasing = False
            self._shares, self._allowances = {}, {}
            return self._shares
        if self._fallen_back:
            log.info(kv("lease renewed", keys=len(got.leases)))
        self.leasing = True
        self._fallen_back = False
        self._until = self._clock.monotonic() + got.lease_s
        self._routers = max(1, got.routers)
        self._limits = {
            ls.sha256.lower(): (float(ls.rpm_limit or 0), float(ls.tpm_limit or 0))
            for ls in got.leases
        }
        self._shares = {ls.sha256.lower(): (ls.rpm or 0.0, ls.tpm or 0.0) for ls in got.leases}
        self._allowances = {
            ls.sha256.lower(): (ls.budget, max(0.0, (ls.budget_left or 0.0) - ls.budget))
            for ls in got.leases
            if ls.budget is not None
        }
        return self._shares

    def expire(self) -> dict[str, Share] | None:
        """The fallback shares when the lease has just run out; None: nothing changes."""
        if self._until is None or self._fallen_back or self._clock.monotonic() < self._until:
            return None
        self._fallen_back = True
        n = self._routers
        self._shares = {
            d: (min(s[0], self._limits[d][0] / n), min(s[1], self._limits[d][1] / n))
            for d, s in self._shares.items()
        }
        log.warning(
            kv("lease expired, enforcing limit / routers", routers=n, keys=len(self._shares))
        )
        return self._shares

    def shares(self) -> dict[str, Share]:
        return self._shares

    def allowances(self) -> dict[str, tuple[float, float]]:
        """The last lease's budget allowances; a cut-off router keeps spending them
        down and gets no more (they never fall back: they only shrink)."""
        return self._allowances


def add_demand(a: KeyDemand, b: KeyDemand) -> KeyDemand:
    """Two workers' demand of one key as their router's: asks and budgets added up (a
    key's shared allowance is said by one worker alone, keytable.KeyRow.cut); the RPM
    and TPM held are the router's share, which each worker holds whole (the larger:
    one worker may have its lease a moment before the other)."""
    return KeyDemand(
        sha256=a.sha256,
        requests=a.requests + b.requests,
        tokens=a.tokens + b.tokens,
        rpm_held=_most(a.rpm_held, b.rpm_held),
        tpm_held=_most(a.tpm_held, b.tpm_held),
        budget_held=_add(a.budget_held, b.budget_held),
    )


def _most(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return b if a is None else a
    return max(a, b)


def _add(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return b if a is None else a
    return a + b


class ShareMetrics:
    """This router's shares on /metrics, summed per team, never per key (a fleet may
    have thousands of keys; docs/metrics.md). Every worker shows the router's whole
    shares: the workers' pages merge by the highest (workers/metricsmerge.py)."""

    def __init__(
        self,
        shares: Callable[[], Mapping[str, Share]],
        keys: Callable[[], Iterable[ClientKey]],
    ) -> None:
        self._shares = shares
        self._keys = keys

    def collect(self) -> Iterator[Metric]:
        rpm = GaugeMetricFamily(
            "llmgw_router_team_rpm_share",
            "Requests per minute this router may admit of the team's keys: the sum of "
            "its leased shares of their rpm limits.",
            labels=["team"],
        )
        tpm = GaugeMetricFamily(
            "llmgw_router_team_tpm_share",
            "Tokens per minute this router may admit of the team's keys: the sum of its "
            "leased shares of their tpm limits.",
            labels=["team"],
        )
        shares = self._shares()
        by_team: dict[str, list[float]] = {}
        for k in self._keys():
            got = shares.get(k.sha256.lower())
            if got is None:
                continue
            sums = by_team.setdefault(k.team, [0.0, 0.0, 0.0, 0.0])
            if k.rpm is not None:
                sums[0] += got[0]
                sums[2] = 1.0
            if k.tpm is not None:
                sums[1] += got[1]
                sums[3] = 1.0
        for team in sorted(by_team):
            r, t, has_rpm, has_tpm = by_team[team]
            if has_rpm:
                rpm.add_metric([team], r)
            if has_tpm:
                tpm.add_metric([team], t)
        yield rpm
        yield tpm
