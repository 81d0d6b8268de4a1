"""Flow control's index of one band's tenants (pure): who goes first, who has the most
queued, and how many turns an arrival waits for, none of them by walking every tenant.

flow.py's `_Band` keeps each tenant's queue of tickets; this keeps what every grant and
every arrival asks of all of them together, told of each change to one tenant
(`changed`: its requests waiting, and the finish tag of the first of them). A band
holding one request for each of a thousand users (one key per user, under overload)
otherwise walked them all several times a grant, and again at each arrival.

- **first**: the tenant whose first waiting request has the smallest finish tag; ties:
  the tenant with fewer queued (a backlog must not delay a quiet tenant's request),
  then the lower name. A heap of (tag, queued, name), one entry pushed at each change;
  an entry that no longer matches its tenant's tag and count is dropped when it comes
  to the top. The count is part of the order and changes while the tag stays (arrivals
  behind the first, removals), so an entry is checked against both: a tenant's latest
  entry always matches it, so the top entry that matches is the first by the exact
  order, with nothing reordered in place. Kept only while two tenants or more wait:
  one alone is first without it (a band of one team, or of requests without a key,
  pays nothing for it).
- **most**: the tenant with the most queued; ties: the higher name (longest-queue
  drop). The same, a heap of (−queued, name in reverse) checked against the count;
  built the first time it is asked (the band was full) and kept until the band
  empties or its entries are mostly stale, so a band that never fills pays nothing
  for it.
- **turns**: Σ over tenants of min(queued, k), the turns of other tenants an arrival
  waits for (`FlowQueue.expected_wait_s`). With `at_least[j]`, the tenants with j or
  more queued, it is Σ_{j ≤ k} at_least[j]: a prefix sum, kept in a Fenwick tree.

Each change costs a heap push or two and a tree update (logarithmic); an entry goes
once, and a heap is rebuilt from the live tenants when stale entries outnumber them.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Final

# Stale heap entries allowed beyond as many as the live ones before a rebuild.
SLACK: Final = 64


class _Reversed:
    """A tenant's name that sorts after the names it precedes (the heap of the most
    queued wants the higher name first at a tie). Two entries of one name are never
    ordered by it: they are alike for the heap."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __lt__(self, other: _Reversed) -> bool:
        return self.name > other.name


class TenantIndex:
    """One band's tenants with requests waiting: counts, first, most queued, turns."""

    __slots__ = ("_at_least", "_first", "_heads", "_most", "_tree", "count", "counts")

    def __init__(self) -> None:
        # Requests waiting, in all and per tenant (only tenants with some).
        self.count = 0
        self.counts: dict[str, int] = {}
        # Each tenant's first waiting request's finish tag (only tenants with some).
        self._heads: dict[str, float] = {}
        # None: not kept, one tenant or none waits (module doc).
        self._first: list[tuple[float, int, str]] | None = None
        # None: not kept (module doc).
        self._most: list[tuple[int, _Reversed]] | None = None
        # at_least[j]: tenants with j or more waiting (index 0 unused); _tree: its
        # Fenwick tree, as long.
        self._at_least: list[int] = [0]
        self._tree: list[int] = [0]

    def changed(self, tenant: str, delta: int, head: float | None) -> None:
        """`tenant`'s requests waiting changed by `delta` (+1, -1 or 0: one request at a
        time), and `head` is the finish tag of its first one now (None: it has none)."""
        counts = self.counts
        before = counts.get(tenant, 0)
        n = before + delta
        self.count += delta
        if n:
            counts[tenant] = n
        elif before:
            del counts[tenant]
        if delta:
            # at_least[j] += delta, in the tree too: j the count gained or lost.
            j = n if delta > 0 else before
            tree = self._tree
            size = len(tree) - 1
            if j > size:
                self._grow(j)
                tree = self._tree
                size = len(tree) - 1
            self._at_least[j] += delta
            while j <= size:
                tree[j] += delta
                j += j & -j
        heads = self._heads
        if head is None:
            heads.pop(tenant, None)
        else:
            heads[tenant] = head
        first = self._first
        if len(heads) < 2:
            self._first = None
        elif first is None or len(first) > 2 * len(heads) + SLACK:
            first = self._first = [(f, counts[t], t) for t, f in heads.items()]
            heapify(first)
        elif head is not None:
            heappush(first, (head, n, tenant))
        most = self._most
        if most is not None and delta:
            if n:
                heappush(most, (-n, _Reversed(tenant)))
                if len(most) > 2 * len(counts) + SLACK:
                    self._most = None
            elif not counts:
                self._most = None

    def first(self) -> str | None:
        """The tenant whose first waiting request has the smallest finish tag (ties: the
        fewer queued, then the lower name); None when none waits."""
        heap = self._first
        heads = self._heads
        if heap is None:
            for tenant in heads:
                return tenant
            return None
        counts = self.counts
        while heap:
            finish, n, tenant = heap[0]
            if heads.get(tenant) == finish and counts.get(tenant) == n:
                return tenant
            heappop(heap)
        return None

    def most(self) -> tuple[str, int] | None:
        """The tenant with the most waiting (ties: the higher name) and its count; None
        when none waits."""
        counts = self.counts
        heap = self._most
        if heap is None:
            heap = self._most = [(-k, _Reversed(t)) for t, k in counts.items()]
            heapify(heap)
        while heap:
            neg, name = heap[0]
            if counts.get(name.name) == -neg:
                return name.name, -neg
            heappop(heap)
        return None

    def turns(self, k: int) -> int:
        """Σ over the tenants of min(their requests waiting, `k`)."""
        tree = self._tree
        j = min(k, len(tree) - 1)
        total = 0
        while j > 0:
            total += tree[j]
            j -= j & -j
        return total

    def _grow(self, j: int) -> None:
        """Room for at_least[j]: the size at least doubled, the tree built anew (so a
        growth costs its size once, not a step at each count)."""
        size = max(j, 2 * (len(self._tree) - 1), 8)
        at_least = self._at_least
        at_least.extend([0] * (size + 1 - len(at_least)))
        tree = list(at_least)
        for i in range(1, size + 1):
            parent = i + (i & -i)
            if parent <= size:
                tree[parent] += tree[i]
        self._tree = tree
