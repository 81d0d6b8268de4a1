"""Prefix affinity: block hashes of a request, and who holds which.

The cheapest token a replica computes is the one already in its KV cache. The
router does not see engine caches, so it remembers what it sent where: a
request becomes a chain of block hashes over its canonical prompt, each
endpoint keeps an LRU of the chains recently sent to it, bounded by its KV
capacity, and the scheduler prefers the endpoint holding the longest leading
run of the chain (docs/routing.md).

Content only. The chain is a function of the model and the prompt, nothing
else: two conversations that share a system prompt share its blocks, whoever
sends them. A client's session hint (`X-Session-ID`, the OpenAI `user` field)
is a separate signal (`affinity.py`), used only where the content does not
decide; mixing it into the chain gave every conversation its own chain, and a
new conversation never found the engines already holding its system prompt.

The whole prompt. Blocks grow with their offset: 64 bytes each for the first
KiB, then about 1/16 of the offset (a multiple of 64 bytes), so a prompt of n
bytes has about 16 + 16·ln(n / 1 KiB) blocks (57 at 8 KiB, 92 at 64 KiB, 138
at 1 MiB) and each byte is hashed once. The error of a match is therefore at
most one block: 64 bytes early on, about 6 % of the prefix further out —
enough to tell a 24 KiB shared preamble plus this system prompt from the same
preamble plus another. Routing stops at `MAX_ROUTED_BYTES` (4 MiB).

Hashes: block i's hash covers everything before it (a chain), so equal hash i
means an equal prefix up to block i. The first hash is blake2b — stable across
processes, because it keys the home replica. The rest are Python's own hash of
(previous, block) (SipHash in C; per-process, but only ever compared inside
this process's PrefixIndex, or those of workers started with one hash seed). Past a
few blocks the chain is computed by C iterators, not a Python loop: same hashes.

Weights: the index counts what an endpoint holds in units of 64 bytes (block
i weighs `block_units(i)`), so its capacity bound stays a byte bound whatever
the block sizes.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from hashlib import blake2b
from itertools import accumulate, islice, pairwise, repeat
from operator import getitem
from typing import Any

import msgspec

_MASK64 = (1 << 64) - 1
# Separators that cannot appear in JSON-encoded text, so ("ab", "c") and ("a", "bc")
# never produce the same canonical bytes.
_MSG, _FIELD, _TOOLS, _PROMPT = b"\x1e", b"\x1f", b"\x1d", b"\x1c"
_encode = msgspec.json.Encoder().encode

# Chat templates render tool definitions ahead of the conversation (system
# prompt or first turn), so a change of tools changes the engine's prefix from
# the start; putting them first keeps our blocks aligned with the engine's cache.

UNIT = 64  # bytes: the smallest block, and the index's unit of weight
GROWTH = 16  # past 16 units, a block is about 1/GROWTH of its offset
MAX_ROUTED_BYTES = 4 << 20


def _layout(limit: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Block end offsets up to `limit`, and each block's weight in units."""
    ends: list[int] = []
    units: list[int] = []
    off = 0
    while off < limit:
        size = max(UNIT, off // GROWTH // UNIT * UNIT)
        off += size
        ends.append(off)
        units.append(size // UNIT)
    return tuple(ends), tuple(units)


_ENDS, _UNITS = _layout(MAX_ROUTED_BYTES)
_CUM_UNITS = tuple(accumulate(_UNITS))
# Block i+1 of a prompt, for i >= 0 (block 0 is hashed with the model, apart).
_BLOCKS = tuple(slice(start, end) for start, end in pairwise(_ENDS))
# Up to this many blocks after the first, a Python loop is cheaper than setting up
# the iterators that chain the blocks in C.
_SHORT_CHAIN = 8
# _REV_WEIGHTS[n]: the weights of the first n blocks, deepest first (record's order).
_REV_WEIGHTS = ((), *(_UNITS[n - 1 :: -1] for n in range(1, len(_UNITS) + 1)))


def block_end(i: int) -> int:
    """The byte offset where block i ends (the prefix block i's hash covers)."""
    return _ENDS[min(i, len(_ENDS) - 1)]


def block_units(i: int) -> int:
    """Block i's weight in 64-byte units."""
    return _UNITS[min(i, len(_UNITS) - 1)]


def blocks_within(units: int) -> int:
    """How many leading blocks fit in `units` (a capacity in 64-byte units)."""
    return bisect_right(_CUM_UNITS, units)


def blocks_covering(nbytes: int) -> int:
    """How many leading blocks end at or before `nbytes`."""
    return bisect_right(_ENDS, nbytes)


def _text(content: Any) -> bytes:
    """Message content as bytes: strings as-is, text parts' text, other parts as JSON."""
    if isinstance(content, str):
        return content.encode()
    if content is None:
        return b""
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                text = part.get("text")
                out.append(text.encode() if isinstance(text, str) else _encode(text))
            else:
                out.append(_encode(part))  # images, audio, files: their URL or data
        return _FIELD.join(out)
    return _encode(content)


def _canonical(body: Mapping[str, Any], limit: int = MAX_ROUTED_BYTES) -> bytes:
    """What the engine will see as the prompt, in its order, cut at `limit` bytes."""
    return _canonical_and_head(body, limit)[0]


def _canonical_and_head(body: Mapping[str, Any], limit: int) -> tuple[bytes, bytes]:
    """`_canonical`, and its first part (the tools, or the first message) uncut."""
    parts: list[bytes] = []
    size = 0
    tools = body.get("tools") or body.get("functions")
    if tools:
        parts.append(_TOOLS + _encode(tools))
        size += len(parts[-1])
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if size >= limit:
                break
            if not isinstance(m, dict):
                part = _MSG + _encode(m)
            elif (
                type(role := m.get("role", "")) is str
                and type(content := m.get("content")) is str
                and not m.get("name")
                and not m.get("tool_calls")
                and not m.get("tool_call_id")
            ):
                # The usual message, a role and a string: the same bytes as below, in
                # one format and one encode.
                part = f"\x1e{role}\x1f\x1f{content}\x1f\x1f".encode()
            else:
                part = b"".join(
                    (
                        _MSG,
                        str(m.get("role", "")).encode(),
                        _FIELD,
                        str(m.get("name") or "").encode(),
                        _FIELD,
                        _text(m.get("content")),
                        _FIELD,
                        _encode(m["tool_calls"]) if m.get("tool_calls") else b"",
                        _FIELD,
                        str(m.get("tool_call_id") or "").encode(),
                    )
                )
            parts.append(part)
            size += len(part)
    prompt = body.get("prompt")
    if prompt is not None and size < limit:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of prompts: route on the first
        parts.append(_PROMPT + (prompt.encode() if isinstance(prompt, str) else _encode(prompt)))
    if not parts:
        return b"", b""
    return b"".join(parts)[:limit], parts[0]


def request_block_hashes(
    body: Mapping[str, Any], *, limit_bytes: int = MAX_ROUTED_BYTES
) -> tuple[int, ...]:
    """Chained block hashes of a chat or completions request: model and content only.

    Covers tool definitions, then chat messages in order (role, name, content
    including content parts, tool calls), then the completions prompt, as UTF-8
    bytes in the growing blocks of the module docstring, up to `limit_bytes`.
    Only full blocks are hashed (a partial last block would change with the
    next turn), except that a prompt shorter than one block gets one hash so it
    still has a home. The model joins the first block's key, so two models on
    one endpoint never share; a session hint never does (see the module
    docstring). Empty when there is no prompt at all.
    """
    data, head = _canonical_and_head(body, limit_bytes)
    if not data:
        return ()
    key = str(body.get("model", "")).encode() + _MSG
    count = bisect_right(_ENDS, len(data), 1)  # hashes in the chain
    # The blocks inside the first part (a system prompt, the tools) are usually the
    # same as many requests' before: their hashes come from _HEADS when they do.
    held = bisect_right(_ENDS, min(len(head), len(data))) if len(head) >= _HEAD_MIN else 0
    if held > 1:
        mk = hash((key, head))
        out = _HEADS.get(mk)
        if out is None:
            out = _chain(key, data, held)
            _HEADS[mk] = out
            if len(_HEADS) > _HEADS_MAX:
                _HEADS.popitem(last=False)
        else:
            _HEADS.move_to_end(mk)
        if held == count:
            return out
        return _chain(key, data, count, list(out))
    return _chain(key, data, count)


# First parts of at least this many bytes have their blocks' hashes remembered, by
# the (64-bit, per-process) hash of the part: no weaker than the chain itself,
# whose every link is such a hash. Hashing the part once costs about a tenth of
# chaining its blocks one by one (bench/router_overhead.py --policy-step, 8 KB).
_HEAD_MIN = 1024
_HEADS_MAX = 1024  # parts remembered (each a tuple of at most len(_ENDS) hashes)
_HEADS: OrderedDict[int, tuple[int, ...]] = OrderedDict()


# First blocks (model and 64 bytes) already hashed: most requests open with a system
# prompt many others share, and blake2b costs more than the rest of a short chain.
# Cleared when full: a cache, not a record.
_FIRSTS_MAX = 4096
_FIRSTS: dict[bytes, int] = {}


def _chain(key: bytes, data: bytes, count: int, out: list[int] | None = None) -> tuple[int, ...]:
    """The first `count` hashes of the chain over `data`, continuing `out` if given."""
    if out is None:
        first = key + data[: _ENDS[0]]
        got = _FIRSTS.get(first)
        if got is None:
            got = int.from_bytes(blake2b(first, digest_size=8).digest(), "little")
            if len(_FIRSTS) >= _FIRSTS_MAX:
                _FIRSTS.clear()
            _FIRSTS[first] = got
        h = got
        out = [h]
    else:
        h = out[-1]
    blocks = _BLOCKS[len(out) - 1 : count - 1]
    # getitem() and += where data[block] and extend() would read better: compiled by
    # mypyc (scripts/build-mypyc, mypy 2.4), a bytes index rejects a slice object, and
    # extend() reads the whole iterable before appending, which breaks the C chain.
    if len(blocks) <= _SHORT_CHAIN:
        for block in blocks:
            h = hash((h, getitem(data, block)))
            out.append(h)
    else:
        # The same chain, h_i = hash((h_i-1, block i)), computed in C: zip reads
        # each previous hash from `out` just after += has appended it (so never
        # strict: `out` is one ahead when the blocks run out).
        links = islice(out, len(out) - 1, None)
        out += map(hash, zip(links, map(getitem, repeat(data), blocks), strict=False))
    return tuple(out)


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


@lru_cache(maxsize=65536)
def _id_hash(endpoint_id: str) -> int:
    return int.from_bytes(blake2b(endpoint_id.encode(), digest_size=8).digest(), "little")


def _mix64(x: int) -> int:
    """splitmix64's finaliser: every input bit moves every output bit."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def rendezvous_order(key: int, candidates: Sequence[str]) -> list[str]:
    """Candidates by descending highest-random-weight for `key`.

    Deterministic across processes (blake2b of the id and splitmix64, never
    Python's per-process hash): routers that never talk agree on the order, and
    removing one endpoint only moves the keys it was first for.
    """
    k = key & _MASK64
    return sorted(candidates, key=lambda c: (-_mix64(k ^ _id_hash(c)), c))


def _kept(hashes: Sequence[int], cap: int) -> int:
    """How many leading blocks of a chain a record keeps under a capacity of `cap` units:
    a chain longer than the capacity keeps its head, the part others share."""
    n = len(hashes)
    if 0 < n <= len(_CUM_UNITS) and _CUM_UNITS[n - 1] <= cap:
        return n  # the whole chain fits (the common case): no search
    return min(n, max(1, blocks_within(cap)))


# Chains of up to this many kept blocks (a prompt of about 1 KiB) are recorded one
# hash at a time; longer ones with the C iterators of the batch, cheaper per hash.
_SHORT_RECORD = 16
_TICK_SHIFT = 20  # an entry's value: tick << 20 | its weight in units (< 2**20)
_WEIGHT_MASK = (1 << _TICK_SHIFT) - 1


class PrefixIndex:
    """Per endpoint, an LRU of block hashes recently sent there; one global cap.

    Each endpoint's LRU is bounded by its KV capacity in 64-byte units (block i
    weighs `block_units(i)`), scaled by what the engine's own answers taught
    (`scale`, see feedback.py); all endpoints together by `max_total_entries`
    (about 125 bytes an entry on CPython 3.11: the default bounds the index near
    250 MB), evicting the least recently recorded entry across the whole index.
    A chain is recorded deepest block first, so its first blocks are the most
    recent: eviction eats chains from the tail, like engine caches do, and what
    an endpoint holds of a chain stays a leading run.
    """

    def __init__(
        self, *, max_total_entries: int = 2_000_000, default_capacity_units: int = 4096
    ) -> None:
        self._max_total = max(1, max_total_entries)
        self._default_capacity = max(1, default_capacity_units)
        # endpoint → hash → tick << 20 | weight; order = recency (oldest first).
        self._lru: dict[str, OrderedDict[int, int]] = {}
        self._weight: dict[str, int] = {}
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
        lru = self._lru.get(endpoint_id)
        return 0 if lru is None else len(lru)

    def units(self, endpoint_id: str) -> int:
        """What the endpoint is believed to hold, in 64-byte units."""
        return self._weight.get(endpoint_id, 0)

    def entries_by_endpoint(self) -> dict[str, int]:
        """Entry counts per endpoint with any, sorted by id (admin view)."""
        return {ep: len(self._lru[ep]) for ep in sorted(self._lru) if self._lru[ep]}

    def match(self, hashes: Sequence[int], candidates: Iterable[str]) -> dict[str, int]:
        """Endpoint id → leading blocks of `hashes` it holds; those holding none are left out."""
        out: dict[str, int] = {}
        if not hashes:
            return out
        first = hashes[0]
        last = hashes[-1]
        whole = len(hashes)
        for ep in candidates:
            lru = self._lru.get(ep)
            if lru is None or first not in lru:
                continue
            if last in lru:
                # Held to its last block, so held whole: every record of a block also
                # records (as newer) each block before it, and eviction takes the
                # oldest first, so what an endpoint holds of a chain is a leading run.
                out[ep] = whole
                continue
            n = 1
            for h in hashes[1:]:
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
        if self.journal is not None:
            noted = hashes if isinstance(hashes, tuple) else tuple(hashes)
            self.journal.append((endpoint_id, noted, capacity_units))
        cap = self.capacity(endpoint_id, capacity_units)
        fresh = self._fresh
        if (
            fresh is not None
            and fresh[0] == endpoint_id
            and fresh[2] == cap
            and (fresh[1] is hashes or fresh[1] == hashes)
        ):
            return
        lru = self._lru.get(endpoint_id)
        if lru is None:
            lru = self._lru[endpoint_id] = OrderedDict()
        self._tick += 1
        stamp = self._tick << _TICK_SHIFT
        before = len(lru)
        weight = self._weight.get(endpoint_id, 0)
        # Deepest first, so the chain's head ends up most recent. A chain longer
        # than the capacity keeps its head: that is the part others share.
        n = _kept(hashes, cap)  # n <= len(_UNITS)
        if n <= _SHORT_RECORD:
            # One hash at a time, deepest first: what a short chain costs least by, and
            # right as it is when a hash repeats (its shallower place is the last put).
            pop = lru.pop
            for i in range(n - 1, -1, -1):
                h = hashes[i]
                was = pop(h, None)
                if was is not None:
                    weight -= was & _WEIGHT_MASK
                lru[h] = stamp | _UNITS[i]
            weight += _CUM_UNITS[n - 1]
        else:
            # Pop what is held of the chain (in C), then insert it with this stamp.
            chain = hashes[n - 1 :: -1]
            old = list(map(lru.pop, chain, repeat(None, n)))
            for h, w in zip(chain, _REV_WEIGHTS[n], strict=True):
                lru[h] = stamp | w
            if len(lru) == before + old.count(None):
                # Each hash once: the old values' low bits sum to their weight (a
                # chain weighs < 2**20 units), the new ones to the chain's.
                weight += _CUM_UNITS[n - 1] - (sum(filter(None, old)) & _WEIGHT_MASK)
            else:  # a hash repeats in the chain (a collision, or a test): one at a time
                weight = self._refresh_slowly(lru, hashes, n, stamp, weight, old)
        while weight > cap and len(lru) > 1:
            weight -= lru.popitem(last=False)[1] & _WEIGHT_MASK
        self._weight[endpoint_id] = weight
        self._total += len(lru) - before
        if self._total > self._max_total:
            self._evict_global(self._total - self._max_total)
            self._fresh = None
        else:
            chain_t = hashes if isinstance(hashes, tuple) else tuple(hashes)
            self._fresh = (endpoint_id, chain_t, cap)

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
        order decides hits, it never is (bench/routing.py, cache-starved). It saves
        the re-insert of the whole chain, the larger half of the policy's per-request
        cost on long prompts (bench/router_overhead.py --chat, 8 KB).
        """
        if not hashes:
            return
        lru = self._lru.get(endpoint_id)
        if lru is not None:
            cap = self.capacity(endpoint_id, capacity_units)
            if (
                self._weight.get(endpoint_id, 0) * 2 <= cap
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

    @staticmethod
    def _refresh_slowly(
        lru: OrderedDict[int, int],
        hashes: Sequence[int],
        n: int,
        stamp: int,
        weight: int,
        old: list[int | None],
    ) -> int:
        """record()'s refresh of a chain in which a hash repeats; the new weight.

        The batch has popped the chain (`old`: what each pop returned) and put
        each of its hashes back once; take the old weights off and pop and
        re-insert one at a time, deepest first, so that order and weights are
        those of refreshing one hash at a time from the start.
        """
        weight -= sum(filter(None, old)) & _WEIGHT_MASK
        for h in set(hashes[:n]):
            weight += lru[h] & _WEIGHT_MASK
        for i in range(n - 1, -1, -1):
            h = hashes[i]
            weight -= lru.pop(h) & _WEIGHT_MASK
            lru[h] = stamp | _UNITS[i]
            weight += _UNITS[i]
        return weight

    def _evict_global(self, n: int) -> None:
        """Drop the n least recently recorded entries across all endpoints."""
        heap = [(next(iter(lru.values())), ep) for ep, lru in self._lru.items() if lru]
        heapq.heapify(heap)
        while n > 0 and heap:
            _stamp, ep = heapq.heappop(heap)
            lru = self._lru[ep]
            self._weight[ep] -= lru.popitem(last=False)[1] & _WEIGHT_MASK
            self._total -= 1
            n -= 1
            if lru:
                heapq.heappush(heap, (next(iter(lru.values())), ep))

    def trim(self, endpoint_id: str, units: int) -> int:
        """Forget the endpoint's oldest entries until it holds at most `units`; how many went."""
        self._fresh = None
        lru = self._lru.get(endpoint_id)
        if lru is None:
            return 0
        weight = self._weight.get(endpoint_id, 0)
        gone = 0
        while lru and weight > units:
            weight -= lru.popitem(last=False)[1] & _WEIGHT_MASK
            gone += 1
        self._weight[endpoint_id] = weight
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
        lru = self._lru.pop(endpoint_id, None)
        self._weight.pop(endpoint_id, None)
        if lru is not None:
            self._total -= len(lru)

    def retain(self, endpoint_ids: Iterable[str]) -> None:
        """Purge every endpoint not listed (and forget what feedback taught about them)."""
        keep = set(endpoint_ids)
        for ep in [ep for ep in self._lru if ep not in keep]:
            self.purge(ep)
        for ep in [ep for ep in self._scale if ep not in keep]:
            del self._scale[ep]
