"""Which share of each limited key every router holds, and the next one it gets.

Routers report, per limited key, what they were asked for and the share they
enforce (`KeyDemand`, with each usage report); the answer to that report leases
the router its new shares (`LeaseAnswer`). The targets are max-min fair by
demand (leases.py); what keeps the fleet under each limit is the hand-off rule:

    grant(r) = min(target(r), limit - sum over other routers j of out(j))
    out(j)   = max(granted to j, held by j as it last reported)

A router whose share shrinks keeps counting at its old share until its next
report says it enforces the new one, so capacity moves from one router to
another only once the first has let go of it: the shares routers enforce never
sum above the limit, whatever order reports and answers arrive in. Moving
capacity takes two report intervals (let go, then taken).

A router silent for longer than `lease_s` keeps its share reserved (it keeps
enforcing it, cut off) until `forget_s`; then the book forgets it and its share
goes to the others. A router still alive but cut off for that long enforces at
most limit / routers, which is the bound's one excess (docs/tenants.md).

Budgets go the same way in tokens: the "limit" is what is left of the period's
budget after what every router has reported spending (`spent`, from the store),
and a router's allowance is what it may spend until its next answer; it reports
what it has not spent (`budget_held`), so allowances out plus what was spent
never pass the budget.

The book lives in memory. A controller that restarts learns the shares back from
what routers say they hold; for its first `lease_s` it grants no router more than
it holds, since routers it has not heard from yet may hold the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llmgw.controller.leases import FLOOR_FRACTION, fair_shares
from llmgw.runtime.clock import Clock
from llmgw.wire.keys import ClientKey
from llmgw.wire.leases import KeyDemand, KeyLease, LeaseAnswer

# Seconds a lease holds without a newer answer (the router's side of it).
LEASE_S = 15.0
# Seconds of silence after which a router's shares are given to the others.
FORGET_S = 60.0


@dataclass
class _Router:
    last_seen: float
    # sha256 → what it said in its last report.
    demand: dict[str, KeyDemand] = field(default_factory=dict)
    # sha256 → (rpm, tpm, budget tokens) granted in the answer to its last report.
    granted: dict[str, tuple[float, float, float]] = field(default_factory=dict)


class LeaseBook:
    """Every router's shares of every limited key, kept in memory."""

    def __init__(
        self,
        *,
        clock: Clock,
        lease_s: float = LEASE_S,
        forget_s: float = FORGET_S,
        floor_frac: float = FLOOR_FRACTION,
    ) -> None:
        self._clock = clock
        self.lease_s = lease_s
        self.forget_s = forget_s
        self.floor_frac = floor_frac
        self._routers: dict[str, _Router] = {}
        self._started = clock.monotonic()

    def report(
        self,
        router_id: str,
        demand: Iterable[KeyDemand],
        keys: Iterable[ClientKey],
        spent: Mapping[str, int] | None = None,
    ) -> LeaseAnswer:
        """Take a router's demand; answer its shares of every key with a limit.

        `spent`: key name → tokens used this budget period, fleet-wide, as reported
        so far (this report's rows included); a key absent has used none.
        """
        spent = spent or {}
        now = self._clock.monotonic()
        for gone in [r for r, s in self._routers.items() if now - s.last_seen > self.forget_s]:
            del self._routers[gone]
        me = self._routers.setdefault(router_id, _Router(last_seen=now))
        me.last_seen = now
        me.demand = {d.sha256.lower(): d for d in demand}
        limited = [k for k in keys if k.limited]
        digests = {k.sha256.lower() for k in limited}
        live = sorted(r for r, s in self._routers.items() if now - s.last_seen <= self.lease_s)
        warming = now - self._started < self.lease_s
        leases: list[KeyLease] = []
        granted: dict[str, tuple[float, float, float]] = {}
        for key in limited:
            digest = key.sha256.lower()
            rpm = self._grant(router_id, digest, 0, key.rpm, live, warming)
            tpm = self._grant(router_id, digest, 1, key.tpm, live, warming)
            left = None
            if key.budget is not None:
                left = float(max(0, key.budget.tokens - spent.get(key.name, 0)))
            budget = self._grant(router_id, digest, 2, left, live, warming)
            granted[digest] = (rpm or 0.0, tpm or 0.0, budget or 0.0)
            leases.append(
                KeyLease(
                    sha256=digest,
                    rpm=rpm,
                    tpm=tpm,
                    rpm_limit=key.rpm,
                    tpm_limit=key.tpm,
                    budget=budget,
                    budget_left=left,
                )
            )
        me.granted = granted
        for other in self._routers.values():
            for old in [d for d in other.granted if d not in digests]:
                del other.granted[old]
        return LeaseAnswer(leases=leases, lease_s=self.lease_s, routers=len(live))

    def _grant(
        self,
        router_id: str,
        digest: str,
        which: int,
        limit: float | None,
        live: list[str],
        warming: bool,
    ) -> float | None:
        """This router's new share of one limit (`which`: 0 rpm, 1 tpm, 2 what is left
        of the budget, in tokens); None: no limit."""
        if limit is None:
            return None
        wants: dict[str, float] = {}
        reserved = 0.0
        others = 0.0
        for rid, r in self._routers.items():
            d = r.demand.get(digest)
            if rid in live:
                wants[rid] = _want(d, which)
            if rid == router_id:
                continue
            out = max(r.granted.get(digest, (0.0, 0.0, 0.0))[which], _held(d, which))
            others += out
            if rid not in live:
                reserved += out
        target = fair_shares(max(0.0, limit - reserved), wants, floor_frac=self.floor_frac)
        grant = max(0.0, min(target.get(router_id, 0.0), limit - others))
        if warming:
            grant = min(grant, _held(self._routers[router_id].demand.get(digest), which))
        return grant

    def held(self) -> dict[str, dict[str, tuple[float, float, float]]]:
        """Router → sha256 → (rpm, tpm, budget) granted, sorted: what the book thinks is out."""
        return {
            rid: dict(sorted(self._routers[rid].granted.items())) for rid in sorted(self._routers)
        }


def _want(d: KeyDemand | None, which: int) -> float:
    """Requests per minute for rpm; tokens per minute for tpm and the budget."""
    if d is None:
        return 0.0
    return d.requests if which == 0 else d.tokens


def _held(d: KeyDemand | None, which: int) -> float:
    if d is None:
        return 0.0
    got = (d.rpm_held, d.tpm_held, d.budget_held)[which]
    return 0.0 if got is None else got
