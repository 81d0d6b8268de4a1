"""Flow control's waiting and waking: one `FlowQueue` per model (flow.py), on the loop.

The proxy asks `FlowGate.saturated` after the policy chose (cheap: the decision's
least total against the threshold), and only then `wait_turn`. A waiting
request is granted its turn by:

- `freed(model, …)`, which the proxy calls when a request of a model with
  waiters releases its replica: one release frees one slot, so it grants at
  most one waiter, and only if a replica is below capacity now;
- the poller: the one waiter per model (the first in line) that looks again
  every `POLL_S`, because capacity also comes back without a release here (an
  engine drains requests of another router, a replica is added). Only one,
  so a thousand waiters do not make a thousand timers a tick.

A model whose every replica left the list lets all its waiters go (`_may_grant`):
nothing frees up for them, and they are held for a replica (holding.py) instead.

**The critical reserve** (reserve.py: when it is kept, and its size). Once a
`critical` request has met a model's replicas with no more room than the reserve, that
room is kept for the critical band: a `standard` or `batch` request is held (and
granted) only while the replicas have room for more than the reserve, so the next
critical request finds a slot at once instead of waiting for a release behind a
backlog that fills every slot the moment it frees. No critical demand at saturation,
no reserve: a fleet without critical keys never loses a slot to it. While a reserve is
kept the proxy asks the gate about every request (`saturated_load` is 0), so critical
requests keep it alive only while they come, and tells it of every release (`freed`),
from which the reserve is sized.

**Workers.** With `--workers N` each worker has its own queues, and they act as one
through the memory the workers share (`Peers`): a worker publishes its queue's claim
per model, and a slot goes to the worker whose claim is strongest (`_ours`); a request
meeting another worker's waiters for its replicas waits behind them, as it would here;
and a critical reserve one worker keeps, every worker keeps.

A granted request chooses again (so it goes to the replica that freed up, or to
its prefix home if that is within the policy's bound) and is dispatched even if
the choice looks saturated by then: it holds the slot a release gave it.

"Learned capacity" is the policy's (scheduler.py: the most requests an engine was
seen running, at least `default_capacity`); a replica counts as saturated here only
once its engine has been seen with requests waiting (`capacity_shown`). Until then
its capacity is a floor, not a limit: holding requests at it would keep an engine
that can run 64 at once at 8 forever, since it would never be seen running more.

Cancellation: a waiter that is cancelled (its client left) removes its ticket; one
cancelled just after it was granted passes its grant on, so no slot is lost.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Collection, Sequence
from typing import Final

from llmgw.router.errors import FlowRefused
from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot
from llmgw.router.request.flow import (
    BANDS,
    DEFAULT_BAND,
    GRANTED,
    PUSHED_OUT,
    BandLimits,
    FlowQueue,
    Refusal,
    Ticket,
)
from llmgw.router.request.flowpeers import Peers, SharedQueues
from llmgw.router.request.holdpoint import HoldPoints
from llmgw.router.request.reserve import CriticalReserve
from llmgw.router.routing.scheduler import DEFAULT_CONFIG, SchedulerConfig, load_of
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock

# How often the first waiter of a model looks at the replicas without a release.
POLL_S: Final = 0.1
# The same with several workers: a slot freed by a worker whose waiters have a weaker
# claim than another's is left for that worker, which finds it by looking.
SHARED_POLL_S: Final = 0.02
# What a waiter's future is set to (its ticket's state says whether it was granted).
_GRANT: Final = 1
_PUSHED: Final = 2
_POLL: Final = 3  # you are the poller now


def capacity_shown(snaps: Sequence[Snapshot], shown: Callable[[str], bool]) -> bool:
    """Whether every replica a request could go to has been seen with requests waiting
    at its engine (`shown`: Registry.capacity_shown), so its learned capacity is a limit."""
    return all(s.breaker is BreakerState.OPEN or shown(s.id) for s in snaps)


def queue_at_engine(s: Snapshot) -> bool:
    """Whether `s`'s engine has requests waiting now: it had a queue at the last scrape,
    and fewer of our requests have finished there since than were waiting."""
    st = s.stats
    return (
        st is not None
        and not s.stale
        and st.waiting > 0
        and st.waiting + s.inflight - s.inflight_at_scrape > 0
    )


class _Model:
    __slots__ = ("left_to_others", "name", "poller", "queue")

    def __init__(self, name: str, queue: FlowQueue) -> None:
        self.name = name
        self.queue = queue
        self.poller: Ticket | None = None
        # Room its poller saw at its last poll but left to another worker's claim.
        self.left_to_others = False


class FlowGate:
    """The router's flow control: queues per model, band and tenant; bounds; wakers."""

    def __init__(
        self,
        limits: dict[str, BandLimits],
        *,
        enabled: bool = True,
        shown: Callable[[str], bool] = lambda _id: True,
        scheduler: SchedulerConfig = DEFAULT_CONFIG,
        clock: Clock = SYSTEM_CLOCK,
        peers: Peers | None = None,
        critical_reserve: int = 1,
    ) -> None:
        self.enabled = enabled
        self.limits = limits
        # How the policy computes a replica's total (1.0: a full batch).
        self.scheduler = scheduler
        # Each replica's total at or above which it counts as full (holdpoint.py).
        self._points = HoldPoints(scheduler=scheduler)
        # The lowest of them: a request whose policy found a total below it for some
        # replica is not held, with no further look (the proxy's one comparison, a
        # plain attribute: it is read for every request). Kept by `_point`.
        self.saturated_load = self._points.lowest
        self._clock = clock
        self._models: dict[str, _Model] = {}
        # Requests waiting, over every model: the proxy's one check on its way out.
        self.waiting = 0
        # Whether a replica's engine was seen queueing (Registry.capacity_shown).
        self._shown = shown
        # With several workers, one queue in effect (module doc, "Workers").
        self._shared = None if peers is None else SharedQueues(peers)
        self.poll_s = POLL_S if peers is None else SHARED_POLL_S
        # The room each model keeps for its critical band while in use (module doc).
        self.reserve = CriticalReserve(
            critical_reserve, clock=clock, scheduler=scheduler, shared=self._shared
        )
        # The models keeping a reserve (the same dict): the proxy's check on its way out.
        self.reserved = self.reserve.kept

    def must_wait(
        self, least: float | None, snaps: Sequence[Snapshot], *, model: str, band: str
    ) -> bool:
        """Whether a request of `model` and `band` waits in its queue: others of the
        model already wait there (it must not pass them), or `saturated`. A critical
        request that finds no room beyond the reserve keeps the reserve (module doc).
        Never while `model` has no replica at all: nothing frees up to wait for, and
        the request is held for one (holding.py) as the demand a start answers."""
        if not snaps:
            return False
        if band == BANDS[0] and self.reserve.floor > 0:
            self._critical_met(model, snaps)
        if self.queued(model):
            return True
        shared = self._shared
        if shared is not None and shared.peers.claimed_elsewhere(model):
            # Another worker's requests wait for these replicas: behind them, as here.
            return True
        return self.saturated(least, snaps, model=model, band=band)

    def _critical_met(self, model: str, snaps: Sequence[Snapshot]) -> None:
        """A critical request met flow control: the reserve kept if the replicas have no
        room beyond it, and the arrival counted while it is kept (reserve.py)."""
        reserve = self.reserve
        if not self._room(snaps, 1 + reserve.size(model, snaps)):
            reserve.keep(model)
            self.saturated_load = 0.0
        if self.reserving(model):
            reserve.arrived(model)

    def saturated(
        self,
        least: float | None,
        snaps: Sequence[Snapshot],
        *,
        model: str = "",
        band: str = DEFAULT_BAND,
    ) -> bool:
        """Whether a request of `model` and `band` whose policy found `least` as the
        lowest total among its replicas `snaps` must wait (None: the policy keeps no
        totals: never): every replica is at or above its hold point, and has shown
        its capacity; below the critical band, also when the replicas have no room
        beyond the model's critical reserve while it is kept."""
        if least is None:
            return False
        if band != BANDS[0] and self.reserving(model):
            return not self._room(snaps, 1 + self.reserve.size(model, snaps))
        if least < self._points.lowest:
            return False
        # Capacity shown first: one lookup a replica, and what decides under load on
        # engines that never queue (their learned capacity is a floor, and a replica
        # that never queued has no hold point below the ceiling to learn).
        if not capacity_shown(snaps, self._shown):
            return False
        cfg = self.scheduler
        for s in snaps:
            if s.breaker is BreakerState.OPEN:
                continue
            if load_of(s, cfg) < self._point(s):
                return False
        return True

    def _point(self, s: Snapshot) -> float:
        """`s`'s hold point, learning from its scrape if new; saturated_load follows."""
        point = self._points.point(s)
        self.saturated_load = 0.0 if self.reserve.kept else self._points.lowest
        return point

    def learn(self, s: Snapshot) -> None:
        """A new scrape of `s`: its hold point learns from it (Router.observed)."""
        self._point(s)

    def retain(self, ids: Collection[str]) -> None:
        """The endpoint list is now `ids`: the hold points of replicas that left are
        forgotten (holdpoint.py), and saturated_load follows."""
        self._points.retain(ids)
        self.saturated_load = 0.0 if self.reserve.kept else self._points.lowest

    def reserving(self, model: str) -> bool:
        """Whether `model`'s critical reserve is kept now, here or by another worker
        (reserve.py); `saturated_load` follows."""
        kept = self.reserve.kept_for(model)
        self.saturated_load = 0.0 if self.reserve.kept else self._points.lowest
        return kept

    def below_capacity(self, snaps: Sequence[Snapshot]) -> bool:
        """Whether a replica in `snaps` can take a request now without it waiting there:
        below capacity by the scheduler's totals, and no queue at its engine by the last
        scrape and our requests since.

        Not the policy's choose(): that records a dispatch in the prefix index."""
        return self._room(snaps, 1)

    def _room(self, snaps: Sequence[Snapshot], need: int) -> bool:
        """Whether the replicas `snaps` can take `need` requests now, together, without
        one waiting at its engine (`_slots`)."""
        free = 0
        for s in snaps:
            if s.breaker is not BreakerState.OPEN:
                free += self._slots(s, need)
                if free >= need:
                    return True
        return False

    def _may_grant(self, m: _Model, snaps: Sequence[Snapshot], granted: int = 0) -> bool:
        """Whether the first in `m`'s line may go now: room for one beside the `granted`
        just let go (not yet sent, so not yet in `snaps`), and for a request below the
        critical band room beyond the model's reserve while it is kept. With no replica
        left at all (every one left the list) all go: they are held for one as any
        request of a model without a replica is (holding.py), counted as its demand and
        woken when one comes, instead of waiting here for a release that cannot come
        and being refused at their band's max_wait_s while the model starts."""
        head = m.queue.peek()
        if head is None:
            return False
        if not snaps:
            return True
        if head.band != BANDS[0] and self.reserving(m.name):
            return self._room(snaps, granted + 1 + self.reserve.size(m.name, snaps))
        return self._room(snaps, granted + 1)

    def _has_room(self, s: Snapshot) -> bool:
        """Whether `s` (its breaker not open) can take a request now without it waiting
        there (`below_capacity`)."""
        return self._slots(s, 1) > 0

    def _slots(self, s: Snapshot, most: int) -> int:
        """How many requests `s` (its breaker not open) can take now without one
        waiting at its engine, counting to `most` at most."""
        if not self._shown(s.id):
            return most
        # Without the stale penalty: it ranks replicas, and a replica whose metrics
        # port broke would otherwise count as full for ever and hold every request.
        load = load_of(s, self.scheduler)
        point = self._point(s)
        if load >= point:
            return 0
        # A queue at its engine: it is full now, whatever its learned capacity says (an
        # engine short of KV cache runs fewer than it once did). A request sent now
        # would wait there, first come first served, not here by band and tenant.
        if queue_at_engine(s):
            return 0
        # Each request adds one step of load; the last one may start below the point.
        n = math.ceil((point - load) / self._points.step(s) - 1e-9)
        return min(most, max(1, n))

    def exclude_for(
        self,
        band: str,
        snaps: Sequence[Snapshot],
        tried: Collection[str],
        home: Collection[str] = (),
        ordered: Collection[str] = (),
    ) -> Collection[str]:
        """What the choice of a granted request of `band` leaves out: `tried`, and for
        the first band (critical) every replica but those `_critical_goes` to."""
        if band != BANDS[0]:
            return tried
        out = set(tried)
        keep = self._critical_goes([s for s in snaps if s.id not in out], home, ordered)
        if keep:
            out.update(s.id for s in snaps if s.id not in keep)
        return out

    def _critical_goes(
        self, snaps: Sequence[Snapshot], home: Collection[str], ordered: Collection[str]
    ) -> set[str]:
        """Where a critical request at saturation may go ({}: wherever the policy says).

        It goes where it starts soonest. First its `home` (waits.home_of: the replicas
        holding most of its prefix, where its prefill is a few blocks, not the whole
        prompt): the homes with room now (`below_capacity`), else those at their hold
        point whose engine orders its queue by priority (`ordered`: it starts there
        ahead of every request of a lower band) and has none waiting (else it would
        wait there for a request to finish). Else the replicas with room, of those the
        ones where none of ours awaits its first token (`Snapshot.pending`: its prefill
        then shares the engine's next step with no other) if any. No room anywhere:
        wherever, holding the slot a release gave it.

        The other bands keep the policy's choice: the fleet's hit rate, and so its
        throughput, rests on their locality."""
        live = [s for s in snaps if s.breaker is not BreakerState.OPEN]
        room = [s for s in live if self._has_room(s)]
        room_ids = {s.id for s in room}
        roomy_homes = room_ids.intersection(home)
        if roomy_homes:
            return roomy_homes
        first = {s.id for s in live if s.id in home and s.id in ordered and not queue_at_engine(s)}
        if first:
            return first
        idle = {s.id for s in room if s.pending == 0}
        return idle or room_ids

    def queued(self, model: str) -> bool:
        m = self._models.get(model)
        return m is not None and len(m.queue) > 0

    def backlogged(self, model: str, band: str, tenant: str) -> bool:
        """Whether `tenant` has requests for `model` waiting in `band` here."""
        m = self._models.get(model)
        return m is not None and m.queue.queued_of(band, tenant) > 0

    def _model(self, model: str) -> _Model:
        m = self._models.get(model)
        if m is None:
            m = self._models[model] = _Model(model, FlowQueue(self.limits))
        return m

    async def wait_turn(
        self,
        model: str,
        band: str,
        tenant: str,
        *,
        deadline: float,
        snapshots: Callable[[], Sequence[Snapshot]],
        running: int = 0,
        home: tuple[str, ...] = (),
    ) -> None:
        """Wait in `model`'s queue until granted; FlowRefused when the band is full, the
        request would wait past its band's bound (flow.py, `wait_bound_s`) or is pushed
        out, or it waited its band's `max_wait_s` (or to `deadline`). `snapshots`: the
        model's replicas now, which the poller looks at; `running`: the requests in
        flight at them, for the bound; `home`: the replicas holding its prefix (a slot
        freed there goes to it before its tenant's earlier requests: flow.py)."""
        m = self._model(model)
        clock = self._clock
        now = clock.monotonic()
        ticket = self._enter(m, model, band, tenant, now=now, running=running, home=home)
        until = min(deadline, now + self.limits[band].max_wait_s)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        ticket.waker = fut
        if m.poller is None:
            m.poller = ticket
        snaps = snapshots()
        if self._may_grant(m, snaps) and self._ours(m):
            # Capacity came back between the choice and the queue (or the queue had
            # waiters when this one arrived below capacity): the first in line goes.
            self._grant(m, snaps)
        try:
            while True:
                # The ticket's state is the word; the future only wakes its waiter.
                if ticket.state == GRANTED:
                    return
                if ticket.state == PUSHED_OUT:
                    raise _pushed_out(model, band, m.queue.retry_after_s(band))
                if fut.done():  # _POLL: this one is the poller now
                    fut = loop.create_future()
                    ticket.waker = fut
                    m.poller = ticket
                left = until - clock.monotonic()
                if left <= 0:
                    waited = clock.monotonic() - ticket.queued_at
                    raise _waited_out(model, band, waited, m.queue.retry_after_s(band))
                poll = m.poller is ticket
                await asyncio.wait((fut,), timeout=min(left, self.poll_s) if poll else left)
                if not fut.done() and poll:
                    self._polled(m, snapshots())
        except asyncio.CancelledError:
            if ticket.state == GRANTED:
                # Granted, then cancelled before it could use the slot: the next one goes.
                self._grant(m)
            raise
        finally:
            self._leave(model, m, ticket)

    def _polled(self, m: _Model, snaps: Sequence[Snapshot]) -> None:
        """`m`'s poller looked at `snaps`: while there is room, the first in line goes,
        unless another worker's queue claims it more strongly; not twice in a row (that
        worker had a poll to take it). Several may go at one poll: slots freed since the
        last one by another worker's requests were left for this worker's claim."""
        left, m.left_to_others = m.left_to_others, False
        granted = 0
        while self._may_grant(m, snaps, granted):
            if not (left or self._ours(m)):
                m.left_to_others = granted == 0
                return
            self._grant(m, snaps)
            granted += 1

    def _enter(
        self,
        m: _Model,
        model: str,
        band: str,
        tenant: str,
        *,
        now: float,
        running: int,
        home: tuple[str, ...],
    ) -> Ticket:
        """A ticket in `m`'s queue (one pushed out for it is woken); FlowRefused when
        the band is full or the wait would pass its bound."""
        got = m.queue.push(band, tenant, now, running=running, home=home)
        if isinstance(got, Refusal):
            n = m.queue.waiting_in(band)
            why = f"the {band} band's queue is full ({n} waiting)"
            if got.wait_s is not None:
                limit = m.queue.wait_bound_s(band, running, tenant)
                why = (
                    f"it would wait about {got.wait_s:.1f}s in the {band} band's queue "
                    f"({n} waiting), past its {limit:.1f}s"
                )
            raise FlowRefused(
                model,
                why,
                status=429,
                code="flow_queue_full",
                retry_after_s=got.retry_after_s,
            )
        ticket, pushed = got
        self.waiting += 1
        self._counted(m, ticket, 1)
        if pushed is not None:
            self.waiting -= 1
            self._counted(m, pushed, -1)
            self._wake(pushed, _PUSHED)
        self._publish(m)
        return ticket

    def _leave(self, model: str, m: _Model, ticket: Ticket) -> None:
        """`ticket` is done waiting, however: out of the queue, the poller's part handed
        to the next in line, and the model's entry dropped once nothing waits."""
        if ticket.state != GRANTED and ticket.state != PUSHED_OUT:
            m.queue.remove(ticket)
            self.waiting -= 1
            self._counted(m, ticket, -1)
            self._publish(m)
        if m.poller is ticket:
            m.poller = None
            nxt = m.queue.peek()
            if nxt is not None:
                m.poller = nxt
                self._wake(nxt, _POLL)
        if not len(m.queue) and m.poller is None and self._models.get(model) is m:
            del self._models[model]

    def freed(self, model: str, snapshots: Callable[[str], Sequence[Snapshot]]) -> None:
        """A request of `model` released its replica (the proxy tells while requests
        wait or a reserve is kept); grant the next waiter if the replicas
        (`snapshots(model)`) have room for it now (`_may_grant`)."""
        if self.reserved:
            self.reserve.released(model)
        m = self._models.get(model)
        if m is None or not len(m.queue):
            return
        snaps = snapshots(model)
        if self._may_grant(m, snaps) and self._ours(m):
            self._grant(m, snaps)

    def _grant(self, m: _Model, snaps: Sequence[Snapshot] | None = None) -> None:
        """The next in `m`'s line goes: told the replicas in `snaps` with room, so a
        request whose prefix holder has room may go before its tenant's earlier ones."""
        room: frozenset[str] = frozenset()
        if snaps is not None:
            is_open = BreakerState.OPEN
            room = frozenset(s.id for s in snaps if s.breaker is not is_open and self._has_room(s))
        t = m.queue.pop(self._clock.monotonic(), room)
        if t is not None:
            self.waiting -= 1
            self._counted(m, t, -1)
            self._wake(t, _GRANT)
            self._publish(m)

    def _ours(self, m: _Model) -> bool:
        """Whether a slot for `m`'s model goes to this worker's queue (flowpeers.py)."""
        shared = self._shared
        return shared is None or shared.ours(m.name, m.queue, self._clock.monotonic())

    def _counted(self, m: _Model, t: Ticket, delta: int) -> None:
        if self._shared is not None:
            self._shared.counted(m.name, t.band, t.tenant, delta)

    def _publish(self, m: _Model) -> None:
        """Tell the other workers `m`'s claim, when it changed (flowpeers.py)."""
        if self._shared is not None:
            self._shared.publish(m.name, m.queue, self._clock.monotonic())

    @staticmethod
    def _wake(t: Ticket, result: int) -> None:
        fut = t.waker
        if isinstance(fut, asyncio.Future) and not fut.done():
            fut.set_result(result)

    def depth(self) -> dict[tuple[str, str], int]:
        """(band, tenant) → requests waiting, over every model; only those with any."""
        out: dict[tuple[str, str], int] = {}
        for m in self._models.values():
            for k, n in m.queue.depth().items():
                out[k] = out.get(k, 0) + n
        return dict(sorted(out.items(), key=lambda kv: (BANDS.index(kv[0][0]), kv[0][1])))


def _pushed_out(model: str, band: str, retry_after_s: int) -> FlowRefused:
    return FlowRefused(
        model,
        f"the {band} band's queue is full and this tenant has the most requests in it",
        status=429,
        code="flow_queue_full",
        retry_after_s=retry_after_s,
    )


def _waited_out(model: str, band: str, waited_s: float, retry_after_s: int) -> FlowRefused:
    return FlowRefused(
        model,
        f"it waited {waited_s:.1f}s in the {band} band's queue",
        status=503,
        code="flow_wait_exceeded",
        retry_after_s=retry_after_s,
    )
