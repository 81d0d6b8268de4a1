"""The scheduler's waiting queue, one per `--scheduling-policy` (vLLM V1's request_queue).

fcfs
    A deque in arrival order; a preempted request goes back to the front.
priority
    A heap keyed by (priority, arrival, seq): lower priority first, then earlier
    arrival; `seq` only breaks exact ties. A preempted request goes back to its
    (priority, arrival) place, which is what vLLM's `prepend_request` does here.

Both answer `head(now)`, the request the scheduler tries next among those that
had arrived when the step began. The engine runs steps back to back, so a step
may begin before the present and requests may already be queued that arrived
after it. Under fcfs such a request is the tail of the queue, so a head that
arrived too late means everyone did. Under priority it may sort first; left in
the heap it would hold back requests that were there in time (the scheduler
stops at a head it cannot serve), so requests wait in an arrival-ordered heap
until a step that begins after their arrival admits them.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from llmgw.simengine.batcher import SimRequest

E = TypeVar("E", bound=tuple[Any, ...])


class WaitingQueue(Protocol):
    """What the scheduler needs of its waiting queue."""

    def __len__(self) -> int: ...
    def add(self, req: SimRequest) -> None:
        """A new request."""

    def prepend(self, req: SimRequest) -> None:
        """A preempted request: first under fcfs; in its (priority, arrival) place otherwise."""

    def head(self, now: float) -> SimRequest | None:
        """The next request to try among those arrived by `now`; None: none has."""

    def pop_head(self) -> SimRequest:
        """Take out the request `head` just returned."""

    def remove(self, req: SimRequest) -> None:
        """Take out a request wherever it is (aborted); ValueError if it is not here."""

    def ids(self) -> list[str]:
        """Request ids in the order they would be served."""


class FcfsQueue:
    """First come, first served: a deque."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[SimRequest] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def add(self, req: SimRequest) -> None:
        self._q.append(req)

    def prepend(self, req: SimRequest) -> None:
        self._q.appendleft(req)

    def head(self, now: float) -> SimRequest | None:
        q = self._q
        if q and q[0].arrival_s <= now:
            return q[0]
        return None

    def pop_head(self) -> SimRequest:
        return self._q.popleft()

    def remove(self, req: SimRequest) -> None:
        self._q.remove(req)

    def ids(self) -> list[str]:
        return [r.req_id for r in self._q]


class PriorityQueue:
    """Lowest (priority, arrival) first: a heap of admitted requests and one of later arrivals."""

    __slots__ = ("_future", "_ready", "_seq")

    def __init__(self) -> None:
        self._seq = itertools.count()
        # (priority, arrival_s, seq, req): requests that had arrived by the last `head(now)`.
        self._ready: list[tuple[int, float, int, SimRequest]] = []
        # (arrival_s, seq, req): requests added since, ordered by arrival, not by add order.
        self._future: list[tuple[float, int, SimRequest]] = []

    def __len__(self) -> int:
        return len(self._ready) + len(self._future)

    def add(self, req: SimRequest) -> None:
        heapq.heappush(self._future, (req.arrival_s, next(self._seq), req))

    def prepend(self, req: SimRequest) -> None:
        heapq.heappush(self._ready, (req.priority, req.arrival_s, next(self._seq), req))

    def head(self, now: float) -> SimRequest | None:
        future, ready = self._future, self._ready
        while future and future[0][0] <= now:
            arrival_s, seq, req = heapq.heappop(future)
            heapq.heappush(ready, (req.priority, arrival_s, seq, req))
        return ready[0][3] if ready else None

    def pop_head(self) -> SimRequest:
        return heapq.heappop(self._ready)[3]

    def remove(self, req: SimRequest) -> None:
        # Linear, as deque.remove is: an abort is one request, not a hot path.
        if not (_drop(self._ready, req) or _drop(self._future, req)):
            raise ValueError(f"request {req.req_id} is not waiting")

    def ids(self) -> list[str]:
        keys = [*self._ready, *((r.priority, a, s, r) for a, s, r in self._future)]
        return [k[3].req_id for k in sorted(keys, key=lambda k: k[:3])]


def _drop(heap: list[E], req: SimRequest) -> bool:
    for i, entry in enumerate(heap):
        if entry[-1] is req:
            last = heap.pop()
            if i < len(heap):
                heap[i] = last
                heapq.heapify(heap)
            return True
    return False
