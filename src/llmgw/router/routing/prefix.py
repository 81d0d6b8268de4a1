"""Prefix affinity: which replica holds which block hashes of the requests sent to it.

The router does not see engine caches, so it remembers what it sent where: each
endpoint keeps an LRU of the block-hash chains (blockhash.py) recently sent to
it, bounded by its KV capacity, and the scheduler prefers the endpoint holding
the longest leading run of a request's chain (docs/routing.md).

Weights: the index counts what an endpoint holds in units of 64 bytes (block
i weighs `block_units(i)`), so its capacity bound stays a byte bound whatever
the block sizes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Final, cast

from llmgw.router.routing.blockhash import CUM_UNITS, UNIT, UNITS, blocks_within


def capacity_units_for(
    kv_capacity_tokens: int | None, *, chars_per_token: float = 4.0
) -> int | None:
    """How many 64-byte units of prefix an endpoint's KV cache holds, roughly.

    Blocks are counted in bytes and KV capacity in tokens; about four
    characters make a token in English text and code, which is all an LRU bound
    needs. None (unknown capacity) lets PrefixIndex use its default.
    """
    if kv_capacity_tokens is None:
        return None
    return max(1, int(kv_capacity_tokens * chars_per_token // UNIT))


def _kept(hashes: Sequence[int], cap: int) -> int:
    """How many leading blocks of a chain a record keeps under a capacity of `cap` units:
    a chain longer than the capacity keeps its head, the part others share."""
    n = len(hashes)
    if 0 < n <= len(CUM_UNITS) and CUM_UNITS[n - 1] <= cap:
        return n  # the whole chain fits (the common case): no search
    return min(n, max(1, blocks_within(cap)))


# An entry's value: tick << _POS_BITS | (_POS_TOP - its place in the chain). A larger
# value is a more recent entry, and within one record the deeper block is the older.
_POS_BITS: Final = 12
_POS_TOP: Final = (1 << _POS_BITS) - 1
if len(UNITS) > _POS_TOP:  # pragma: no cover - a layout change that needs more bits
    raise RuntimeError("prefix: more blocks than an entry's value can place")
# An entry's weight in units, by the low bits of its value.
_WEIGHT_OF: Final = tuple(
    UNITS[_POS_TOP - low] if _POS_TOP - low < len(UNITS) else 0 for low in range(_POS_TOP + 1)
)


class _Held:
    """What one endpoint is believed to hold: hash → value (see `_POS_BITS`), and a
    front of its oldest entries to evict from.

    Recording a hash is one store of a newer value: nothing moves. Eviction takes
    the front's entries in order, skipping those whose value has changed since (a
    later record refreshed them, or they went and came back): every entry not in
    the front was newer than all of it when the front was made, and a change only
    makes a value newer, so the first unchanged entry of the front is the oldest
    entry held. When the front runs out it is made again, by sorting what is held.
    """

    __slots__ = ("at", "front", "lru", "weight")

    def __init__(self) -> None:
        self.lru: dict[int, int] = {}
        self.weight = 0  # units held
        self.front: list[tuple[int, int]] = []  # (hash, value), oldest first
        self.at = 0  # the front's first place not yet taken or skipped

    def oldest(self) -> int:
        """The oldest entry's value, -1 when none; moves the front past changed entries."""
        lru = self.lru
        front = self.front
        at = self.at
        while True:
            if at >= len(front):
                if not lru:
                    self.front = []
                    self.at = 0
                    return -1
                front = self.front = sorted(lru.items(), key=_value)
                at = 0
            h, v = front[at]
            if lru.get(h) == v:
                self.at = at
                return v
            at += 1

    def pop_oldest(self) -> None:
        """Forget the oldest entry (there must be one)."""
        self.oldest()
        h, v = self.front[self.at]
        del self.lru[h]
        self.at += 1
        self.weight -= _WEIGHT_OF[v & _POS_TOP]


def _value(item: tuple[int, int]) -> int:
    return item[1]


class PrefixIndex:
    """Per endpoint, an LRU of block hashes recently sent there; one global cap.

    Each endpoint's LRU is bounded by its KV capacity in 64-byte units (block i
    weighs `block_units(i)`), scaled by what the engine's own answers taught
    (`scale`, see feedback.py); all endpoints together by `max_total_entries`
    (about 105 bytes an entry on CPython 3.11, 170 while an eviction front is held;
    the OrderedDict this replaced took 204: the default bounds the index near 340 MB),
    evicting the least recently recorded entry across the whole index. A chain is
    recorded deepest block first, so its first blocks are the most recent: eviction
    eats chains from the tail, like engine caches do, and what an endpoint holds of
    a chain stays a leading run.

    Recording a chain gives each of its hashes one newer value (`_Held`): a chain
    the endpoint already holds, the usual case, moves nothing.
    """

    def __init__(
        self, *, max_total_entries: int = 2_000_000, default_capacity_units: int = 4096
    ) -> None:
        self._max_total = max(1, max_total_entries)
        self._default_capacity = max(1, default_capacity_units)
        self._held: dict[str, _Held] = {}
        self._scale: dict[str, float] = {}
        self._total = 0
        self._tick = 0
        # (endpoint, chain, capacity) of the last record() when nothing has
        # changed the index since: recording it again would only restamp the
        # newest entries as still the newest, which changes no answer and no
        # eviction, so it is skipped (a request's completion right after its
        # dispatch, or the same prompt twice in a row).
        self._fresh: tuple[str, tuple[int, ...], int] | None = None
        # With several router workers (worker.py): every record() is also noted here,
        # sent to the other workers in batches and replayed into their indexes, so each
        # worker's index learns what all of them sent. None in a one-process router.
        self.journal: list[tuple[str, tuple[int, ...], int | None]] | None = None

    def __len__(self) -> int:
        return self._total

    def entries(self, endpoint_id: str) -> int:
        held = self._held.get(endpoint_id)
        return 0 if held is None else len(held.lru)

    def units(self, endpoint_id: str) -> int:
        """What the endpoint is believed to hold, in 64-byte units."""
        held = self._held.get(endpoint_id)
        return 0 if held is None else held.weight

    def entries_by_endpoint(self) -> dict[str, int]:
        """Entry counts per endpoint with any, sorted by id (admin view)."""
        held = self._held
        return {ep: len(held[ep].lru) for ep in sorted(held) if held[ep].lru}

    def order(self, endpoint_id: str) -> list[tuple[int, int, int]]:
        """(hash, tick of its last record, weight in units) of what the endpoint holds,
        oldest first: the order eviction takes them in (tests and debugging)."""
        held = self._held.get(endpoint_id)
        if held is None:
            return []
        items = sorted(held.lru.items(), key=_value)
        return [(h, v >> _POS_BITS, _WEIGHT_OF[v & _POS_TOP]) for h, v in items]

    def match(self, hashes: Sequence[int], candidates: Iterable[str]) -> dict[str, int]:
        """Endpoint id → leading blocks of `hashes` it holds; those holding none are left out."""
        out: dict[str, int] = {}
        if not hashes:
            return out
        # As objects: compiled, an int that fits a machine word is unboxed, and boxed
        # again (a new int object) for every dict lookup.
        chain = cast("Sequence[object]", hashes)
        first = chain[0]
        last = chain[-1]
        whole = len(chain)
        for ep in candidates:
            held = self._held.get(ep)
            if held is None:
                continue
            lru = cast("dict[object, int]", held.lru)
            if first not in lru:
                continue
            if last in lru:
                # Held to its last block, so held whole: every record of a block also
                # records (as newer) each block before it, and eviction takes the
                # oldest first, so what an endpoint holds of a chain is a leading run.
                out[ep] = whole
                continue
            n = 1
            for h in chain[1:]:
                if h not in lru:
                    break
                n += 1
            out[ep] = n
        return out

    def capacity(self, endpoint_id: str, capacity_units: int | None) -> int:
        """The bound record() applies: the capacity (default when unknown) × scale."""
        cap = self._default_capacity if capacity_units is None else max(1, capacity_units)
        return max(1, int(cap * self._scale.get(endpoint_id, 1.0)))

    def record(
        self, endpoint_id: str, hashes: Sequence[int], *, capacity_units: int | None
    ) -> None:
        """Remember that `hashes` were sent to `endpoint_id` (now the most recent there).

        `capacity_units`: the endpoint's KV capacity in 64-byte units (see
        capacity_units_for), None when unknown (the default is used).
        """
        if not hashes:
            return
        chain = hashes if isinstance(hashes, tuple) else tuple(hashes)
        if self.journal is not None:
            self.journal.append((endpoint_id, chain, capacity_units))
        cap = self.capacity(endpoint_id, capacity_units)
        fresh = self._fresh
        if (
            fresh is not None
            and fresh[0] == endpoint_id
            and fresh[2] == cap
            and (fresh[1] is chain or fresh[1] == chain)
        ):
            return
        held = self._held.get(endpoint_id)
        if held is None:
            held = self._held[endpoint_id] = _Held()
        lru = held.lru
        self._tick += 1
        top = self._tick << _POS_BITS | _POS_TOP
        before = len(lru)
        weight = held.weight
        # Deepest first, so the chain's head ends up most recent (and a hash that
        # repeats keeps its shallower place, the last put). A chain longer than the
        # capacity keeps its head: that is the part others share.
        n = _kept(chain, cap)  # n <= len(UNITS)
        # Hashes as objects (see match()): no unboxing and boxing per hash.
        keys = cast("tuple[object, ...]", chain)
        values = cast("dict[object, int]", lru)
        for i in range(n - 1, -1, -1):
            h = keys[i]
            was = values.get(h)
            if was is not None:
                weight -= _WEIGHT_OF[was & _POS_TOP]
            values[h] = top - i
        held.weight = weight + CUM_UNITS[n - 1]
        while held.weight > cap and len(lru) > 1:
            held.pop_oldest()
        self._total += len(lru) - before
        if self._total > self._max_total:
            self._evict_global(self._total - self._max_total)
            self._fresh = None
        else:
            self._fresh = (endpoint_id, chain, cap)

    def completed(
        self, endpoint_id: str, hashes: Sequence[int], *, capacity_units: int | None
    ) -> None:
        """A request sent to `endpoint_id` finished: `record()` it again, unless that
        can change nothing that matters.

        The engine frees a finished request's blocks as its most recently used, so
        recording the chain again keeps the index's LRU order close to the engine's.
        But order only decides what is evicted, and an endpoint whose index holds at
        most half its capacity (in an index at most half its cap) evicts nothing
        until as much again has been sent: while the chain is still held from its
        dispatch (head and tail), its refresh is skipped. Under cache pressure, where
        order decides hits, it never is (bench/routing.py, cache-starved).
        """
        if not hashes:
            return
        held = self._held.get(endpoint_id)
        if held is not None:
            cap = self.capacity(endpoint_id, capacity_units)
            lru = held.lru
            if (
                held.weight * 2 <= cap
                and self._total * 2 <= self._max_total
                and hashes[0] in lru
                and hashes[_kept(hashes, cap) - 1] in lru
            ):
                return
        self.record(endpoint_id, hashes, capacity_units=capacity_units)

    def replay(self, records: Iterable[tuple[str, Sequence[int], int | None]]) -> None:
        """Apply records another worker made (see `journal`), without noting them again."""
        journal, self.journal = self.journal, None
        try:
            for endpoint_id, hashes, capacity_units in records:
                self.record(endpoint_id, hashes, capacity_units=capacity_units)
        finally:
            self.journal = journal

    def _evict_global(self, n: int) -> None:
        """Drop the n least recently recorded entries across all endpoints."""
        heap = [(held.oldest(), ep) for ep, held in self._held.items() if held.lru]
        heapq.heapify(heap)
        while n > 0 and heap:
            _value, ep = heapq.heappop(heap)
            held = self._held[ep]
            held.pop_oldest()
            self._total -= 1
            n -= 1
            if held.lru:
                heapq.heappush(heap, (held.oldest(), ep))

    def trim(self, endpoint_id: str, units: int) -> int:
        """Forget the endpoint's oldest entries until it holds at most `units`; how many went."""
        self._fresh = None
        held = self._held.get(endpoint_id)
        if held is None:
            return 0
        gone = 0
        while held.lru and held.weight > units:
            held.pop_oldest()
            gone += 1
        self._total -= gone
        return gone

    def scale(self, endpoint_id: str) -> float:
        """The factor applied to the endpoint's capacity (1.0 until feedback lowers it)."""
        return self._scale.get(endpoint_id, 1.0)

    def set_scale(self, endpoint_id: str, factor: float) -> None:
        self._scale[endpoint_id] = min(1.0, max(0.0625, factor))

    def purge(self, endpoint_id: str) -> None:
        """Forget everything sent to an endpoint (its engine restarted, or it left)."""
        self._fresh = None
        held = self._held.pop(endpoint_id, None)
        if held is not None:
            self._total -= len(held.lru)

    def retain(self, endpoint_ids: Iterable[str]) -> None:
        """Purge every endpoint not listed (and forget what feedback taught about them)."""
        keep = set(endpoint_ids)
        for ep in [ep for ep in self._held if ep not in keep]:
            self.purge(ep)
        for ep in [ep for ep in self._scale if ep not in keep]:
            del self._scale[ep]
