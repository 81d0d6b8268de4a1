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

What a report costs does not grow with the routers (it runs on the controller's
event loop, once per router per report interval). Each key keeps the sum of every
router's out(j), changed in place when one reports, so `limit - others` is one
subtraction, not a walk over the routers. The targets (the split, which needs every
router's demand) are kept per key and made again only when they may have moved: a
router's ask moved by more than `resplit_frac` of the limit since they were made (at
most once per `resplit_gap_s`), a budget's remainder moved as much, the routers
heard from changed, or `resplit_s` passed. A stale target can only make a split
less fair for a while, never let it pass the limit: safety is the hand-off rule's
alone, and it always runs on the current sums. And a key none of whose inputs
moved since this router's last answer (its report, the limits, the sums, the
targets) gets that answer again, so an idle key costs a few lookups.

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

import math
from collections.abc import Iterable, Mapping

from llmgw.controller.leases import FLOOR_FRACTION, fair_shares
from llmgw.runtime.clock import Clock
from llmgw.wire.keys import ClientKey
from llmgw.wire.leases import KeyDemand, KeyLease, LeaseAnswer

# Seconds a lease holds without a newer answer (the router's side of it).
LEASE_S = 15.0
# Seconds of silence after which a router's shares are given to the others.
FORGET_S = 60.0
# A router's ask moving by less than this part of the limit since a key's split was
# made moves no router's target by more than about that much: the split stands.
RESPLIT_FRAC = 0.02
# Seconds after which a key's split is made again whatever moved (each key's own
# period is spread over half to one and a half of it, so they do not all fall due
# in one report).
RESPLIT_S = 30.0
# Seconds a key's split waits at least before it is made again for a moved ask (a
# change of routers does not wait): what a report costs stays bounded when every
# key's demand moves at once, whatever the number of routers.
RESPLIT_GAP_S = 1.0

# (rpm, tpm, budget tokens): one value per limit of a key; 0.0 where it has none.
Triple = tuple[float, float, float]
_NONE: Triple = (0.0, 0.0, 0.0)
# (rpm, tpm, what is left of the budget); None: no such limit.
Limits = tuple[float | None, float | None, float | None]
# (requests, tokens) per minute a router was asked for.
Wants = tuple[float, float]
_NO_WANTS: Wants = (0.0, 0.0)
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


class _Part:
    """One router's part of one key: what it said last, and what is out to it."""

    __slots__ = ("demand", "granted", "lease", "limits", "out", "version", "wants")

    def __init__(self) -> None:
        # Its last report of the key (None: it did not name it), and the answer to it.
        self.demand: KeyDemand | None = None
        self.lease: KeyLease | None = None
        # The key's limits and the split's version that answer was made from.
        self.limits: Limits = (None, None, None)
        self.version = -1
        # Granted in that answer, per limit.
        self.granted: Triple = _NONE
        # max(granted, held as it last reported), per limit: what it may enforce.
        self.out: Triple = _NONE
        # (requests, tokens) per minute it was asked for, as it last reported.
        self.wants: Wants = _NO_WANTS


class _Split:
    """One key: every router's part, the sum of what is out, and the last targets."""

    __slots__ = (
        "due",
        "epoch",
        "limits",
        "made",
        "out",
        "parts",
        "slack",
        "targets",
        "version",
        "wants",
    )

    def __init__(self) -> None:
        self.parts: dict[str, _Part] = {}
        # Sum over parts of their out, per limit (kept in step with the parts).
        self.out: list[float] = [0.0, 0.0, 0.0]
        # Bumped whenever out or the targets change: an answer made at the same
        # version, to the same report, is the same answer.
        self.version = 0
        # Router → target per limit, and what they were made from: the limits and
        # each live router's wants (a part absent asked for nothing).
        self.targets: dict[str, Triple] = {}
        self.limits: Limits = (None, None, None)
        self.wants: dict[str, Wants] = {}
        # How far a router's (requests, tokens) may move before the targets are stale.
        self.slack: Wants = (math.inf, math.inf)
        # The book's epoch (set of live routers) they were made in; -1: never made.
        self.epoch = -1
        # Monotonic times they were made, and after which they are made again
        # whatever moved.
        self.made = -math.inf
        self.due = -math.inf


class LeaseBook:
    """Every router's shares of every limited key, kept in memory."""

    def __init__(
        self,
        *,
        clock: Clock,
        lease_s: float = LEASE_S,
        forget_s: float = FORGET_S,
        floor_frac: float = FLOOR_FRACTION,
        resplit_frac: float = RESPLIT_FRAC,
        resplit_s: float = RESPLIT_S,
        resplit_gap_s: float = RESPLIT_GAP_S,
    ) -> None:
        self._clock = clock
        self.lease_s = lease_s
        self.forget_s = forget_s
        self.floor_frac = floor_frac
        self.resplit_frac = resplit_frac
        self.resplit_s = resplit_s
        self.resplit_gap_s = resplit_gap_s
        # Router → monotonic time of its last report.
        self._seen: dict[str, float] = {}
        # sha256 → the key's split.
        self._splits: dict[str, _Split] = {}
        # Routers heard from within lease_s, and a count bumped whenever that set
        # changes or a router is forgotten: every split made before is stale.
        self._live: frozenset[str] = frozenset()
        self._live_sorted: tuple[str, ...] = ()
        self._epoch = 0
        self._started = clock.monotonic()
        self._warming = True
        self._spread = 0.0

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
        warming = now - self._started < self.lease_s
        if self._warming and not warming:
            # Answers made while warming were capped at what routers held: stale now.
            self._warming = False
            self._epoch += 1
        self._see(router_id, now)
        asked = {d.sha256.lower(): d for d in demand}
        leases: list[KeyLease] = []
        splits, epoch = self._splits, self._epoch
        for key in keys:
            if not key.limited:
                continue
            digest = key.sha256.lower()
            left = None
            if key.budget is not None:
                left = float(max(0, key.budget.tokens - spent.get(key.name, 0)))
            limits: Limits = (key.rpm, key.tpm, left)
            d = asked.get(digest)
            sp = splits.get(digest)
            if sp is None:
                sp = splits[digest] = _Split()
            part = sp.parts.get(router_id)
            if part is None:
                part = sp.parts[router_id] = _Part()
            if (
                part.lease is not None
                and part.version == sp.version
                and sp.epoch == epoch
                and now < sp.due
                and limits == part.limits
                and (d == part.demand or self._only_asks_moved(sp, router_id, d))
            ):
                # Nothing the answer depends on moved since the last one: the same answer.
                leases.append(part.lease)
                continue
            leases.append(
                self._lease(
                    router_id,
                    (digest, sp, part),
                    d,
                    key=key,
                    limits=limits,
                    now=now,
                    warming=warming,
                )
            )
        if len(self._splits) > len(leases):
            # A key revoked or no longer limited: forget its split.
            for gone in self._splits.keys() - {ls.sha256 for ls in leases}:
                del self._splits[gone]
        return LeaseAnswer(leases=leases, lease_s=self.lease_s, routers=len(self._live))

    def _see(self, router_id: str, now: float) -> None:
        """Note a report; forget routers silent past forget_s; mark every split stale
        when the set of live routers changed (they split among the live ones)."""
        for gone in [r for r, at in self._seen.items() if now - at > self.forget_s]:
            del self._seen[gone]
            for sp in self._splits.values():
                part = sp.parts.pop(gone, None)
                if part is not None:
                    sp.out = [sp.out[i] - part.out[i] for i in range(3)]
            self._epoch += 1
        self._seen[router_id] = now
        live = frozenset(r for r, at in self._seen.items() if now - at <= self.lease_s)
        if live != self._live:
            self._live, self._live_sorted = live, tuple(sorted(live))
            self._epoch += 1

    def _lease(
        self,
        router_id: str,
        where: tuple[str, _Split, _Part],
        d: KeyDemand | None,
        *,
        key: ClientKey,
        limits: Limits,
        now: float,
        warming: bool,
    ) -> KeyLease:
        """This router's new shares of one key's limits (`where`: its digest, split
        and part), taking its report into the part and the split's sums."""
        digest, sp, part = where
        held: Triple = _NONE
        part.wants = _NO_WANTS
        if d is not None:
            part.wants = (d.requests, d.tokens)
            held = (d.rpm_held or 0.0, d.tpm_held or 0.0, d.budget_held or 0.0)
        stale = sp.epoch != self._epoch or now >= sp.due
        if not stale and self._moved(sp, router_id, limits):
            # Made again for a moved ask at most once a gap; until then it stands.
            stale = now >= sp.made + self.resplit_gap_s
            sp.due = min(sp.due, sp.made + self.resplit_gap_s)
        if stale:
            self._resplit(sp, limits, now)
        t, out, mine = sp.targets.get(router_id, _NONE), sp.out, part.out
        # others = out - mine: what the other routers may enforce, without a walk over them.
        rpm = tpm = budget = None
        if limits[0] is not None:
            rpm = _give(t[0], limits[0] - (out[0] - mine[0]), held[0], warming)
        if limits[1] is not None:
            tpm = _give(t[1], limits[1] - (out[1] - mine[1]), held[1], warming)
        if limits[2] is not None:
            budget = _give(t[2], limits[2] - (out[2] - mine[2]), held[2], warming)
        grants = (rpm or 0.0, tpm or 0.0, budget or 0.0)
        now_out = (max(grants[0], held[0]), max(grants[1], held[1]), max(grants[2], held[2]))
        if now_out != mine:
            out[0] += now_out[0] - mine[0]
            out[1] += now_out[1] - mine[1]
            out[2] += now_out[2] - mine[2]
            part.out = now_out
            sp.version += 1
        part.granted = grants
        part.demand, part.limits, part.version = d, limits, sp.version
        part.lease = KeyLease(
            sha256=digest,
            rpm=rpm,
            tpm=tpm,
            rpm_limit=key.rpm,
            tpm_limit=key.tpm,
            budget=budget,
            budget_left=limits[2],
        )
        return part.lease

    def _only_asks_moved(self, sp: _Split, router_id: str, d: KeyDemand | None) -> bool:
        """Whether this report differs from the router's last only in its asks, and by
        too little to make the split again: its answer is then the last one. Takes
        the report in when so."""
        part = sp.parts[router_id]
        was = part.demand
        if d is None or was is None:
            return False
        if (d.rpm_held, d.tpm_held, d.budget_held) != (
            was.rpm_held,
            was.tpm_held,
            was.budget_held,
        ):
            return False
        old = sp.wants.get(router_id, _NO_WANTS)
        if abs(d.requests - old[0]) > sp.slack[0] or abs(d.tokens - old[1]) > sp.slack[1]:
            return False
        part.demand, part.wants = d, (d.requests, d.tokens)
        return True

    def _moved(self, sp: _Split, router_id: str, limits: Limits) -> bool:
        """Whether a limit, or this router's ask, moved enough since the split was made
        to make it again (the other routers' asks are checked when they report)."""
        then = sp.limits
        if limits[0] != then[0] or limits[1] != then[1]:
            return True
        left, was = limits[2], then[2]
        if left is None or was is None:
            if (left is None) != (was is None):
                return True
        elif abs(left - was) > self.resplit_frac * max(left, was):
            return True
        old = sp.wants.get(router_id, _NO_WANTS)
        new = sp.parts[router_id].wants
        return abs(new[0] - old[0]) > sp.slack[0] or abs(new[1] - old[1]) > sp.slack[1]

    def _resplit(self, sp: _Split, limits: Limits, now: float) -> None:
        """Make a key's targets again from every live router's ask: max-min fair over
        what the silent ones (still holding shares, cut off) leave of each limit."""
        live = self._live
        # What every router may enforce, and what the silent ones hold (reserved),
        # summed afresh: the running sums drift by a rounding per report.
        o0 = o1 = o2 = r0 = r1 = r2 = 0.0
        for rid, p in sp.parts.items():
            a, b, c = p.out
            o0, o1, o2 = o0 + a, o1 + b, o2 + c
            if rid not in live:
                r0, r1, r2 = r0 + a, r1 + b, r2 + c
        sp.out = [o0, o1, o2]
        parts = sp.parts
        wants = {r: parts[r].wants if r in parts else _NO_WANTS for r in self._live_sorted}
        rpm, tpm, left = limits
        frac = self.floor_frac
        split0 = split1 = split2 = None
        if rpm is not None:
            split0 = fair_shares(
                max(0.0, rpm - r0), {r: w[0] for r, w in wants.items()}, floor_frac=frac
            )
        if tpm is not None or left is not None:
            tokens = {r: w[1] for r, w in wants.items()}
            if tpm is not None:
                split1 = fair_shares(max(0.0, tpm - r1), tokens, floor_frac=frac)
            if left is not None:
                split2 = fair_shares(max(0.0, left - r2), tokens, floor_frac=frac)
        targets = {
            r: (
                0.0 if split0 is None else split0[r],
                0.0 if split1 is None else split1[r],
                0.0 if split2 is None else split2[r],
            )
            for r in wants
        }
        if targets != sp.targets:
            # Answers made before are stale; the same targets keep them (a steady key
            # stays on the fast path; the sums above moved by a rounding at most).
            sp.targets = targets
            sp.version += 1
        sp.limits, sp.wants, sp.slack = limits, wants, self._slack(limits)
        sp.epoch, sp.made = self._epoch, now
        # Spread over half to one and a half resplit_s (a golden-ratio walk: even, and
        # not bunched however the keys were made): keys made in one report fall due apart.
        self._spread = (self._spread + _GOLDEN) % 1.0
        sp.due = now + self.resplit_s * (0.5 + self._spread)

    def _slack(self, limits: Limits) -> Wants:
        """How far an ask may move, in requests and in tokens, before a split made
        for these limits is stale: resplit_frac of the smallest limit it is split from."""
        rpm, tpm, left = limits
        toks = [x for x in (tpm, left) if x is not None and x > 0.0]
        return (
            math.inf if rpm is None else self.resplit_frac * rpm,
            min(toks) * self.resplit_frac if toks else math.inf,
        )

    def held(self) -> dict[str, dict[str, Triple]]:
        """Router → sha256 → (rpm, tpm, budget) granted, sorted: what the book thinks is out."""
        out: dict[str, dict[str, Triple]] = {r: {} for r in sorted(self._seen)}
        for digest in sorted(self._splits):
            for rid, part in self._splits[digest].parts.items():
                out[rid][digest] = part.granted
        return out

    def by_key(self) -> dict[str, dict[str, Triple]]:
        """sha256 → router → (rpm, tpm, budget) granted in its last answer, sorted; a
        key no router has reported since the controller started is absent."""
        return {
            digest: {r: sp.parts[r].granted for r in sorted(sp.parts)}
            for digest, sp in sorted(self._splits.items())
            if sp.parts
        }


def _give(target: float, room: float, held: float, warming: bool) -> float:
    """A share: the target, within the room the other routers leave; while the book
    is warming, never above what the router holds already."""
    got = max(0.0, min(target, room))
    return min(got, held) if warming else got
