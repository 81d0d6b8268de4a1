"""Flow control's queues: priority bands, fair queueing among tenants, bounds (pure).

When every replica that could serve a model is at its learned capacity the
router holds new requests here instead of piling them onto the engines' own
queues, where they would all wait alike (docs/tenants.md#flow-control). One
`FlowQueue` per model; flowgate.py does the waiting and the waking.

- **Bands** are served in strict priority: nothing of `standard` is granted
  while a `critical` request waits, nothing of `batch` while either does.
- **Tenants** inside a band share it by weighted fair queueing: each request
  gets a virtual finish tag, `max(band's virtual time, tenant's last tag) +
  1/weight`, and the smallest tag goes first. A tenant sending three times its
  share waits behind its own backlog; one that goes quiet gets no credit for
  the idle time (its tag starts at the band's virtual time), so it cannot
  come back and starve the others with a burst.
- **Bounds**: each band holds at most `max_queued`. A request arriving at a
  full band pushes out the newest request of the tenant with the most queued
  when that tenant has more queued than the arrival's own (longest-queue drop),
  so a flooding tenant cannot fill the band and lock out a quiet one; otherwise
  the arrival itself is refused. So is one whose expected wait (`expected_wait_s`,
  at the rate grants are made) is past `max_wait_s`, or past `max_wait_turnovers`
  of the time the requests running now take to finish (`wait_bound_s`): told now,
  not after the wait.
  Waiting longer than `max_wait_s` all the same is the gate's to enforce (it owns
  the timers).

- **Homes**: a ticket may name its request's prefix holders (`home`). Granting a
  slot, `pop` is told which replicas have room; when the tenant the fair order picks
  has a request whose holder has room among its first `HOME_DEPTH`, and the one at
  its head has none, that request goes first and takes the head's tags (each one
  passed over takes the next one's), so the tenant's share and every other tenant's
  are as before, and the prefix cache is hit instead of missed. A request is passed
  over at most `MAX_PASSED` times.

Tickets are removed lazily (`remove` marks; a queue drops the tickets at its front
that no longer wait), so a client that goes away costs no walk of its tenant's queue.
What a grant or an arrival asks of all the band's tenants at once (the first in the
fair order, the one with most queued, the turns ahead) is kept indexed
(flowtenants.py), so neither walks every tenant.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Final

from llmgw.router.request.flowtenants import TenantIndex

# Strict priority, first served first: the keys' `priority` (wire/keys.py).
BANDS: Final = ("critical", "standard", "batch")
# The band of a request without a key, and of a key whose band is unknown here.
DEFAULT_BAND: Final = "standard"
# The tenant of requests without a key: one for all of them.
ANONYMOUS: Final = ""
# Retry-After bounds (whole seconds) when the queue's drain rate is known.
RETRY_MIN_S: Final = 1
RETRY_MAX_S: Final = 60
# A claim's low 24 bits (`FlowQueue.claim`): the first ticket's tenant's requests
# queued, inverted (up to CLAIM_QUEUED), then how long that ticket has waited, in ms
# (up to CLAIM_AGE).
CLAIM_QUEUED: Final = 255
CLAIM_AGE: Final = (1 << 16) - 1
# How deep into a tenant's queue a grant looks for a request whose home has room.
HOME_DEPTH: Final = 8
# How many times a request may be passed over for one whose home has room.
MAX_PASSED: Final = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class BandLimits:
    # Requests one model's band may hold; 0: none (the band is refused at saturation).
    max_queued: int
    # Seconds a request may wait in the band before it is answered 503.
    max_wait_s: float
    # Turnovers (the time the requests running now take to finish, `turnover_s`) an
    # arrival may expect to wait before it is refused at once; 0: no such bound.
    max_wait_turnovers: float = 0.0


# Ticket states.
WAITING: Final = 0
GRANTED: Final = 1
GONE: Final = 2  # removed by its waiter (gave up, went away)
PUSHED_OUT: Final = 3  # dropped for a quieter tenant's arrival (longest-queue drop)


class Ticket:
    """One queued request: its band, tenant, tags and state."""

    __slots__ = (
        "band",
        "finish",
        "home",
        "passed",
        "queued_at",
        "start",
        "state",
        "tenant",
        "waker",
    )

    def __init__(
        self,
        band: str,
        tenant: str,
        start: float,
        finish: float,
        now: float,
        *,
        home: tuple[str, ...] = (),
    ) -> None:
        self.band = band
        self.tenant = tenant
        self.start = start
        self.finish = finish
        # Monotonic seconds when it was queued.
        self.queued_at = now
        self.state = WAITING
        # The gate's handle to wake its waiter (flowgate.py); None in pure use.
        self.waker: object = None
        # The replicas holding its prompt's prefix (beyond what all hold); () none.
        self.home = home
        # Times a later request of its tenant was granted first (module docstring).
        self.passed = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why a request was not queued: the band is full of requests no noisier than its
    own, or (`wait_s` given) it would wait past the band's max_wait_s."""

    band: str
    retry_after_s: int
    # The wait it would have had, at the rate grants are made; None: the band was full.
    wait_s: float | None = None


class _Band:
    """One band's queues per tenant, their index and its virtual time.

    Each tenant's queue starts with a waiting ticket (those before it that no longer
    wait are dropped as they come to the front), and a tenant with none waiting has no
    queue; `index` knows each tenant's count and first finish tag (`settle`)."""

    __slots__ = ("counts", "forget_above", "index", "last_finish", "limits", "queues", "vtime")

    def __init__(self, limits: BandLimits) -> None:
        self.limits = limits
        self.queues: dict[str, deque[Ticket]] = {}
        # Tickets waiting (not removed), in all and per tenant; who goes first.
        self.index = TenantIndex()
        # The index's counts per tenant (the same dict, read here often).
        self.counts = self.index.counts
        # Each tenant's last finish tag; a tenant missing is at the band's virtual time.
        self.last_finish: dict[str, float] = {}
        # last_finish is swept of tenants behind the virtual time only past this size
        # (twice what the last sweep kept): tenants with nothing queued whose tags are
        # still ahead of it (one request each, the virtual time standing still) would
        # otherwise be walked at every grant and none forgotten.
        self.forget_above = 0
        self.vtime = 0.0

    def head(self) -> Ticket | None:
        """The waiting ticket with the smallest finish tag (ties: the tenant with fewer
        queued, whose request a backlog must not delay, then the lower name)."""
        tenant = self.index.first()
        return None if tenant is None else self.queues[tenant][0]

    def settle(self, tenant: str, delta: int) -> None:
        """`tenant`'s waiting tickets changed by `delta`: its queue's front cleared of
        tickets no longer waiting, and the index told its count and first tag."""
        q = self.queues.get(tenant)
        head: float | None = None
        if q is not None:
            while q and q[0].state != WAITING:
                q.popleft()
            if q:
                head = q[0].finish
            else:
                del self.queues[tenant]
        self.index.changed(tenant, delta, head)


class FlowQueue:
    """One model's queued requests, by band and tenant."""

    def __init__(self, limits: Mapping[str, BandLimits]) -> None:
        self._bands = {b: _Band(limits[b]) for b in BANDS}
        self._count = 0
        # Mean seconds between grants (exponentially weighted), for Retry-After;
        # None until two grants were seen.
        self._interval_s: float | None = None
        self._last_grant: float | None = None

    def __len__(self) -> int:
        return self._count

    def push(
        self,
        band: str,
        tenant: str,
        now: float,
        *,
        weight: float = 1.0,
        running: int = 0,
        home: tuple[str, ...] = (),
    ) -> tuple[Ticket, Ticket | None] | Refusal:
        """Queue a request of `tenant` in `band`: its ticket and the ticket it pushed
        out (None: none), or a Refusal when the band is full or the request would wait
        past `wait_bound_s(band, running)`; `running`: the requests in flight at the
        model's replicas."""
        b = self._bands[band]
        wait_s = self.expected_wait_s(band, tenant)
        if wait_s is not None and wait_s > self.wait_bound_s(band, running, tenant):
            return Refusal(band=band, retry_after_s=self.retry_after_s(band), wait_s=wait_s)
        pushed: Ticket | None = None
        if b.index.count >= b.limits.max_queued:
            pushed = self._push_out(b, tenant)
            if pushed is None:
                return Refusal(band=band, retry_after_s=self.retry_after_s(band))
        start = max(b.vtime, b.last_finish.get(tenant, b.vtime))
        finish = start + 1.0 / (weight if weight > 0 else 1.0)
        b.last_finish[tenant] = finish
        t = Ticket(band, tenant, start, finish, now, home=home)
        q = b.queues.get(tenant)
        if q is None:
            q = b.queues[tenant] = deque()
        q.append(t)
        b.index.changed(tenant, 1, q[0].finish)  # its front waits (_Band)
        self._count += 1
        return t, pushed

    def _push_out(self, b: _Band, tenant: str) -> Ticket | None:
        """The newest ticket of the tenant with the most queued, taken out, when that
        tenant has more queued than `tenant` would after its arrival; else None."""
        most = b.index.most()
        if most is None or most[1] <= b.counts.get(tenant, 0) + 1:
            return None
        q = b.queues[most[0]]
        for i in range(len(q) - 1, -1, -1):
            t = q[i]
            if t.state == WAITING:
                del q[i]
                t.state = PUSHED_OUT
                b.settle(t.tenant, -1)
                self._count -= 1
                # Its finish tag is given back: the tenant's next request takes its place.
                b.last_finish[t.tenant] = t.start
                return t
        return None  # pragma: no cover - counts say a waiting ticket exists

    def pop(self, now: float, room: Collection[str] = ()) -> Ticket | None:
        """Grant the next ticket: the first band with one waiting, the smallest finish
        tag in it, or a later one of its tenant whose home is in `room` (the replicas
        with room now; module docstring). None when nothing waits."""
        for band in BANDS:
            b = self._bands[band]
            if not b.index.count:
                continue
            t = b.head()
            assert t is not None  # count > 0: a waiting ticket is queued
            t = _take(b.queues[t.tenant], room)
            t.state = GRANTED
            b.vtime = max(b.vtime, t.start)
            b.settle(t.tenant, -1)
            self._count -= 1
            self._granted(now)
            n = len(b.last_finish)
            if n > 2 * len(b.counts) + 64 and n > b.forget_above:
                # Tenants at or behind the virtual time lose nothing by being forgotten.
                b.last_finish = {k: v for k, v in b.last_finish.items() if v > b.vtime}
                b.forget_above = 2 * len(b.last_finish)
            return t
        return None

    def peek(self) -> Ticket | None:
        """The ticket `pop` would grant without a `room`, left queued."""
        for band in BANDS:
            b = self._bands[band]
            if b.index.count:
                return b.head()
        return None

    def claim(self, now: float, queued: Callable[[str, str], int] | None = None) -> int:
        """How strongly this queue asks for a freed slot, against another worker's
        queue for the same replicas (flowpeers.py), by the ticket `pop` would grant
        first: its band; then the fewer its tenant has queued, the stronger (a quiet
        tenant's request before a backlog's, as the fair order does inside one queue;
        `queued(band, tenant)`: the count over every worker, else this queue's); then
        the longer it has waited (one tenant's requests go first come, first served,
        whichever worker holds them); 0 when nothing waits."""
        for i, band in enumerate(BANDS):
            b = self._bands[band]
            if b.index.count:
                t = b.head()
                assert t is not None  # count > 0: a waiting ticket is queued
                n = b.counts.get(t.tenant, 1) if queued is None else queued(band, t.tenant)
                fewer = CLAIM_QUEUED - min(max(n, 1), CLAIM_QUEUED)
                age = min(max(0, int((now - t.queued_at) * 1000)), CLAIM_AGE)
                return ((len(BANDS) - i) << 24) | (fewer << 16) | age
        return 0

    def remove(self, t: Ticket) -> None:
        """Its waiter leaves (gave up, went away): a no-op unless it still waits."""
        if t.state != WAITING:
            return
        t.state = GONE
        self._bands[t.band].settle(t.tenant, -1)
        self._count -= 1

    def _granted(self, now: float) -> None:
        if self._last_grant is not None:
            gap = now - self._last_grant
            prev = self._interval_s
            self._interval_s = gap if prev is None else 0.8 * prev + 0.2 * gap
        self._last_grant = now

    def expected_wait_s(self, band: str, tenant: str) -> float | None:
        """Seconds a new request of `tenant` in `band` would wait, at the rate grants are
        made: the higher bands' requests, then one turn of every tenant of its band for
        each of its own ahead of it. None until the rate is known.

        So a tenant far over its share is told at once (429, Retry-After) instead of
        waiting out max_wait_s for a 503, and a quiet tenant, with nothing of its own
        ahead, is never refused for another's backlog."""
        interval = self._interval_s
        if interval is None:
            return None
        ahead = 0
        for name in BANDS:
            if name == band:
                break
            ahead += self._bands[name].index.count
        b = self._bands[band]
        own = b.counts.get(tenant, 0)
        # Itself, and min(queued, own + 1) of every tenant's: its own `own` ahead of it
        # and one turn of each other tenant for each of those and for itself.
        ahead += 1 + b.index.turns(own + 1)
        return ahead * interval

    def turnover_s(self, running: int) -> float | None:
        """Seconds until `running` requests in flight have finished, at the rate grants
        are made (Little's law: a grant follows a finish while requests wait); None
        until the rate is known or with nothing running."""
        interval = self._interval_s
        if interval is None or running <= 0:
            return None
        return running * interval

    def wait_bound_s(self, band: str, running: int, tenant: str | None = None) -> float:
        """The longest expected wait an arrival in `band` (of `tenant`) is queued for:
        its max_wait_s, or its max_wait_turnovers of `turnover_s(running)` if sooner
        and the tenant has requests of its own queued in the band already.

        A queue longer than the fleet's turnover adds wait and no throughput: one
        request waiting per slot is enough to fill every slot as it frees. A tenant
        whose backlog is past that is refused at once, so the requests it is served
        wait about one turnover instead of max_wait_s each. A tenant with nothing
        queued is within its share whatever the others' backlogs: only max_wait_s
        bounds its wait (a burst that drew out the grants must not refuse it)."""
        b = self._bands[band]
        bound = b.limits.max_wait_s
        if tenant is not None and not b.counts.get(tenant, 0):
            return bound
        turns = b.limits.max_wait_turnovers
        turnover = self.turnover_s(running)
        if turns > 0 and turnover is not None and turns * turnover < bound:
            bound = turns * turnover
        return bound

    def retry_after_s(self, band: str) -> int:
        """Whole seconds until the requests queued in and above `band` are likely
        granted, at the rate grants were made; RETRY_MIN_S..RETRY_MAX_S."""
        ahead = 0
        for b in BANDS:
            ahead += self._bands[b].index.count
            if b == band:
                break
        interval = self._interval_s
        if interval is None:
            return RETRY_MIN_S
        return max(RETRY_MIN_S, min(RETRY_MAX_S, math.ceil(ahead * interval)))

    def depth(self) -> dict[tuple[str, str], int]:
        """(band, tenant) → requests waiting; only those with any."""
        return {(band, t): n for band in BANDS for t, n in self._bands[band].counts.items()}

    def queued_of(self, band: str, tenant: str) -> int:
        """Requests of `tenant` waiting in `band`."""
        return self._bands[band].counts.get(tenant, 0)

    def waiting_in(self, band: str) -> int:
        return self._bands[band].index.count


def _take(q: deque[Ticket], room: Collection[str]) -> Ticket:
    """Take the ticket to grant out of a tenant's queue, whose head is waiting: the
    head, unless its home has no room and one among its first `HOME_DEPTH` has (module
    docstring); that one then takes the head's tags, and each passed over the next's."""
    head = q[0]
    if not room or head.passed >= MAX_PASSED or _at_home(head, room):
        return q.popleft()
    for i in range(1, min(len(q), HOME_DEPTH)):
        t = q[i]
        if t.state == WAITING and _at_home(t, room):
            passed = [w for w in itertools.islice(q, 0, i) if w.state == WAITING]
            tags = [(w.start, w.finish) for w in passed] + [(t.start, t.finish)]
            t.start, t.finish = tags[0]
            for w, tag in zip(passed, tags[1:], strict=True):
                w.start, w.finish = tag
                w.passed += 1
            del q[i]
            return t
    return q.popleft()


def _at_home(t: Ticket, room: Collection[str]) -> bool:
    """Whether a replica holding `t`'s prefix has room now."""
    return any(h in room for h in t.home)
