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
from collections.abc import Iterable, Sequence
from functools import lru_cache
from hashlib import blake2b
from itertools import accumulate, islice, pairwise, repeat
from operator import getitem
from typing import Any, Final, cast

import msgspec

_MASK64: Final = (1 << 64) - 1
# Separators that cannot appear in JSON-encoded text, so ("ab", "c") and ("a", "bc")
# never produce the same canonical bytes.
_MSG: Final = b"\x1e"
_FIELD: Final = b"\x1f"
_TOOLS: Final = b"\x1d"
_PROMPT: Final = b"\x1c"
_encode: Final = msgspec.json.Encoder().encode

# Chat templates render tool definitions ahead of the conversation (system
# prompt or first turn), so a change of tools changes the engine's prefix from
# the start; putting them first keeps our blocks aligned with the engine's cache.

UNIT: Final = 64  # bytes: the smallest block, and the index's unit of weight
GROWTH: Final = 16  # past 16 units, a block is about 1/GROWTH of its offset
MAX_ROUTED_BYTES: Final = 4 << 20


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


_LAYOUT: Final = _layout(MAX_ROUTED_BYTES)
_ENDS: Final = _LAYOUT[0]
_UNITS: Final = _LAYOUT[1]
_CUM_UNITS: Final = tuple(accumulate(_UNITS))
# Block i+1 of a prompt, for i >= 0 (block 0 is hashed with the model, apart).
_BLOCKS: Final = tuple(slice(start, end) for start, end in pairwise(_ENDS))
# Up to this many blocks after the first, a Python loop is cheaper than setting up
# the iterators that chain the blocks in C.
_SHORT_CHAIN: Final = 8


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


def _canonical(body: dict[str, Any], limit: int = MAX_ROUTED_BYTES) -> bytes:
    """What the engine will see as the prompt, in its order, cut at `limit` bytes."""
    return _canonical_and_head(body, limit)[0]


def _canonical_and_head(body: dict[str, Any], limit: int) -> tuple[bytes, bytes]:
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
                # A role and a string and nothing else (the commonest message: no
                # need to look for the fields it lacks), or none of them set.
                and (
                    (len(m) == 2 and "role" in m)
                    or not (m.get("name") or m.get("tool_calls") or m.get("tool_call_id"))
                )
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
    body: dict[str, Any], *, limit_bytes: int = MAX_ROUTED_BYTES
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
        size = len(head)
        mid = size // 2
        # Cheap to hash: the model, the length and three samples of the part; a hit
        # is one only if the whole part is the same (one memcmp).
        mk = (key, size, head[:_SAMPLE] + head[mid : mid + _SAMPLE] + head[-_SAMPLE:])
        got = _HEADS.get(mk)
        if got is not None and len(got[1]) == held and got[0] == head:
            _HEADS.move_to_end(mk)
            out = got[1]
        else:
            out = _chain(key, data, held)
            if size <= _HEAD_MAX_BYTES:
                _remember_head(mk, head, out)
        if held == count:
            return out
        return _chain(key, data, count, list(out))
    return _chain(key, data, count)


# First parts of at least this many bytes have their blocks' hashes remembered:
# found by the model, the part's length and three 32-byte samples of it, and used
# only when the whole part is equal, byte for byte, to the one remembered. Hashing
# the part (SipHash, as before) costs several times what comparing it does
# (bench/RESULTS.md, "Figures once quoted in the router's source").
_HEAD_MIN: Final = 1024
_SAMPLE: Final = 32
_HEADS_MAX: Final = 1024  # parts remembered
_HEAD_MAX_BYTES: Final = 1 << 20  # a longer part is not remembered
_HEADS_BYTES: Final = 32 << 20  # at most this many bytes of parts remembered in all
# (model, length, samples) → (the part, its blocks' hashes); oldest first.
_HEADS: Final[OrderedDict[tuple[bytes, int, bytes], tuple[bytes, tuple[int, ...]]]] = OrderedDict()
_heads_bytes: Final = [0]  # bytes of parts in _HEADS


def _remember_head(mk: tuple[bytes, int, bytes], head: bytes, hashes: tuple[int, ...]) -> None:
    """Put a part and its hashes into _HEADS (replacing any under the same key)."""
    was = _HEADS.pop(mk, None)
    if was is not None:
        _heads_bytes[0] -= len(was[0])
    _HEADS[mk] = (head, hashes)
    _heads_bytes[0] += len(head)
    while len(_HEADS) > _HEADS_MAX or _heads_bytes[0] > _HEADS_BYTES:
        _heads_bytes[0] -= len(_HEADS.popitem(last=False)[1][0])


# First blocks (model and 64 bytes) already hashed: most requests open with a system
# prompt many others share, and blake2b costs more than the rest of a short chain.
# Cleared when full: a cache, not a record.
_FIRSTS_MAX: Final = 4096
_FIRSTS: Final[dict[bytes, int]] = {}


def _chain(key: bytes, data: bytes, count: int, out: list[int] | None = None) -> tuple[int, ...]:
    """The first `count` hashes of the chain over `data`, continuing `out` if given."""
    start = 0 if out is None else len(out)
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
        # One object per hash value (`_CANON`), as objects: compiled, an int is unboxed
        # and boxed again into a new object. Short chains are not worth it: looking
        # each hash up here costs about what it saves in the index.
        fresh = cast("list[object]", out)
        canon = cast("dict[object, object]", _CANON)
        if len(canon) >= _CANON_MAX:
            canon.clear()
        new = fresh[start:]
        fresh[start:] = map(canon.setdefault, new, new)
    return tuple(out)


# Every hash a long chain computes is replaced by the object first seen with its value, so
# the prefix index (whose dicts keep the key object they were first given) finds it
# by identity. Chains that share blocks but not a remembered first part (a system
# prompt with a per-user ending, the turns of one conversation) otherwise bring new
# int objects each time, and every dict lookup of an equal but distinct int compares
# the two, on two or more lookups per block recorded (the cost is in
# bench/RESULTS.md). Cleared when full: a
# cache, not a record (what it drops only costs those comparisons again). Full, it
# holds about 1,000 chains of 64 blocks: 5 MB with its int objects, which are mostly
# the index's own keys (tracemalloc).
_CANON_MAX: Final = 1 << 16
_CANON: Final[dict[int, int]] = {}


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


class Rendezvous:
    """`rendezvous_order(key, candidates)` when called, and only then: the scheduler's
    home order for a request, which most requests (decided by a prefix holder or by
    load) never need. A class, not a closure: compiled, a closure over the caller's
    locals moved them all into an environment object, one more per request."""

    __slots__ = ("candidates", "key")

    def __init__(self, key: int, candidates: Sequence[str]) -> None:
        self.key = key
        self.candidates = candidates

    def __call__(self) -> list[str]:
        return rendezvous_order(self.key, self.candidates)


def _kept(hashes: Sequence[int], cap: int) -> int:
    """How many leading blocks of a chain a record keeps under a capacity of `cap` units:
    a chain longer than the capacity keeps its head, the part others share."""
    n = len(hashes)
    if 0 < n <= len(_CUM_UNITS) and _CUM_UNITS[n - 1] <= cap:
        return n  # the whole chain fits (the common case): no search
    return min(n, max(1, blocks_within(cap)))


# An entry's value: tick << _POS_BITS | (_POS_TOP - its place in the chain). A larger
# value is a more recent entry, and within one record the deeper block is the older.
_POS_BITS: Final = 12
_POS_TOP: Final = (1 << _POS_BITS) - 1
if len(_UNITS) > _POS_TOP:  # pragma: no cover - a layout change that needs more bits
    raise RuntimeError("prefix: more blocks than an entry's value can place")
# An entry's weight in units, by the low bits of its value.
_WEIGHT_OF: Final = tuple(
    _UNITS[_POS_TOP - low] if _POS_TOP - low < len(_UNITS) else 0 for low in range(_POS_TOP + 1)
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
        n = _kept(chain, cap)  # n <= len(_UNITS)
        # Hashes as objects (see match()): about 40 % fewer instructions per hash.
        keys = cast("tuple[object, ...]", chain)
        values = cast("dict[object, int]", lru)
        for i in range(n - 1, -1, -1):
            h = keys[i]
            was = values.get(h)
            if was is not None:
                weight -= _WEIGHT_OF[was & _POS_TOP]
            values[h] = top - i
        held.weight = weight + _CUM_UNITS[n - 1]
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
