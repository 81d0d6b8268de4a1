"""Where flow control holds each replica: the load its engine runs without a queue (pure).

The policy's learned capacity (scheduler.py) is the most requests an engine was seen
running at once. That is a ceiling, not a working point: an engine short of KV cache
runs fewer when its requests share less of their prompts, and one that runs its
ceiling takes long, prefill-heavy steps. Holding requests in the router only at the
ceiling meant a granted request still met a queue at the engine, first come first
served, and waited there as if there were no bands or tenants.

So each replica gets a hold point: the load (1.0: its learned capacity) at or above
which flow control counts it as full. It is learned from what every scrape shows,
one request at a time, as TCP learns a window:

- a scrape that finds requests **waiting** at the engine lowers it to one request
  below what the engine was running then, by at most a fifth of it a scrape (the
  engine has shown that it cannot take more now, but a moment's figure may be low);
- a scrape that finds **no queue** while the engine ran at the hold point raises it
  by one request, up to the ceiling, so a point lowered by a passing burst or a mix
  of long prompts comes back when the engine can take more.

A scrape with the engine below its hold point and no queue says nothing about the
point and leaves it. The point only matters while flow control is asked, at or above
it: below saturation no request is held, whatever it is. A replica removed from the
router takes its point with it (`retain`): the lowest point is what the proxy compares
every request with, and a departed replica's low one kept it asking flow control about
every request for good, while replica churn (a fresh id per start) grew the points
without end.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot, Stats
from llmgw.router.routing.scheduler import DEFAULT_CONFIG, SchedulerConfig

# The most one scrape may take off a hold point, as a share of it. An engine seen in
# the middle of a preemption or a long prefill runs few requests for a moment; taking
# the point down to that at once held the replica near empty for as many scrapes as
# it then took to climb back, one request each.
DECREASE: Final = 0.8


class _Point:
    __slots__ = ("load", "stats")

    def __init__(self, load: float) -> None:
        # The load (1.0: the learned capacity) at or above which the replica is full.
        self.load = load
        # The scrape it was last learned from (Registry.observe makes a new one each).
        self.stats: Stats | None = None


class HoldPoints:
    """Each replica's hold point, learned from its scrapes; `lowest` over all of them."""

    def __init__(self, *, scheduler: SchedulerConfig = DEFAULT_CONFIG) -> None:
        self._cfg = scheduler
        # The most a hold point may be: the policy's own saturation.
        self.ceiling = scheduler.saturated_load
        self._points: dict[str, _Point] = {}
        # The lowest hold point of any replica (the ceiling while none is lower): a
        # request whose policy found every replica's total below it is not held, with
        # no look at the replicas (the proxy's one comparison per request).
        self.lowest = self.ceiling

    def point(self, s: Snapshot) -> float:
        """`s`'s hold point, first learning from its scrape if that is new."""
        p = self._points.get(s.id)
        if p is None:
            p = self._points[s.id] = _Point(self.ceiling)
        st = s.stats
        if st is None or st is p.stats or s.stale or s.breaker is BreakerState.OPEN:
            return p.load
        p.stats = st
        step = self.step(s)
        before = p.load
        if st.waiting > 0:
            # Already below what it ran: the queue is not this point's doing.
            p.load = min(p.load, max(step, (st.running - 1) * step, p.load * DECREASE))
        elif st.running * step > p.load - step / 2 and p.load < self.ceiling:
            p.load = min(self.ceiling, p.load + step)
        if p.load != before:
            self._lowest_again()
        return p.load

    def step(self, s: Snapshot) -> float:
        """One request's share of `s`'s load (scheduler.load_of's units)."""
        capacity = max(s.running_capacity, self._cfg.default_capacity, 1)
        weight = s.weight if s.weight > 0 else 1.0
        return 1.0 / capacity / weight

    def retain(self, ids: Collection[str]) -> None:
        """Forget the points of replicas not in `ids` (the endpoint list now)."""
        gone = [i for i in self._points if i not in ids]
        for i in gone:
            del self._points[i]
        if gone:
            self._lowest_again()

    def _lowest_again(self) -> None:
        self.lowest = min((p.load for p in self._points.values()), default=self.ceiling)

    def points(self) -> dict[str, float]:
        """Replica id → its hold point, sorted by id (for tests and debugging)."""
        return {i: self._points[i].load for i in sorted(self._points)}
