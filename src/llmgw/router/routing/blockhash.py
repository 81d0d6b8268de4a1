"""Block hashes of a request: its canonical prompt, cut into growing blocks, chained.

The cheapest token a replica computes is the one already in its KV cache; the
router guesses who holds what by remembering what it sent where (prefix.py), and
this module gives that memory its keys: a request becomes a chain of block
hashes over its canonical prompt (what the engine will see, in its order).

Content only. The chain is a function of the model and the prompt, nothing
else: two conversations that share a system prompt share its blocks, whoever
sends them. A client's session hint (`X-Session-ID`, the OpenAI `user` field)
is a separate signal (`affinity.py`), used only where the content does not
decide; mixing it into the chain gave every conversation its own chain, and a
new conversation never found the engines already holding its system prompt.

The whole prompt. Blocks grow with their offset: 64 bytes each for the first
KiB, then about 1/16 of the offset (a multiple of 64 bytes), so a prompt of n
bytes has about 16 + 16·ln(n / 1 KiB) blocks and each byte is hashed once. The
error of a match is therefore at most one block: 64 bytes early on, a
sixteenth of the prefix further out — enough to tell a 24 KiB shared preamble
plus this system prompt from the same preamble plus another. Routing stops at
`MAX_ROUTED_BYTES` (4 MiB).

Hashes: block i's hash covers everything before it (a chain), so equal hash i
means an equal prefix up to block i. The first hash is blake2b — stable across
processes, because it keys the home replica (rendezvous.py). The rest are
Python's own hash of (previous, block) (SipHash in C; per-process, but only ever
compared inside this process's PrefixIndex, or those of workers started with one
hash seed). Past a few blocks the chain is computed by C iterators, not a Python
loop: same hashes.

`BlockHasher` owns the memos that make common requests cheap (a shared first
part, a first block, one object per hash value). The router has one,
`BLOCK_HASHER`, which `request_block_hashes` uses; a test can make its own.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from hashlib import blake2b
from itertools import accumulate, islice, pairwise, repeat
from operator import getitem
from typing import Any, Final, cast

import msgspec

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
# Each message and each content part counts at least one UNIT towards MAX_ROUTED_BYTES,
# so routing reads at most this many of them: a body of millions of one-byte items
# (`[0,0,...]`) otherwise cost a Python step and an object per item, seconds of the
# router's loop and hundreds of MB for one request, where its bytes cost nothing.
MAX_ROUTED_ITEMS: Final = MAX_ROUTED_BYTES // UNIT


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
# Each block's weight in units, and the running total of the weights.
UNITS: Final = _LAYOUT[1]
CUM_UNITS: Final = tuple(accumulate(UNITS))
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
    return UNITS[min(i, len(UNITS) - 1)]


def blocks_within(units: int) -> int:
    """How many leading blocks fit in `units` (a capacity in 64-byte units)."""
    return bisect_right(CUM_UNITS, units)


def blocks_covering(nbytes: int) -> int:
    """How many leading blocks end at or before `nbytes`."""
    return bisect_right(_ENDS, nbytes)


def _charge(n: int) -> int:
    """What an item of `n` bytes counts towards the routed bytes (MAX_ROUTED_ITEMS)."""
    return n if n > UNIT else UNIT


def _text(content: Any, room: int) -> tuple[bytes, int]:
    """Message content as bytes: strings as-is, text parts' text, other parts as JSON;
    and what it counts towards the routed bytes. Parts are read until they count
    `room`."""
    if isinstance(content, str):
        data = content.encode()
        return data, len(data)
    if content is None:
        return b"", 0
    if isinstance(content, list):
        out = []
        charged = 0
        for part in content:
            if charged >= room:
                break
            if isinstance(part, dict) and part.get("type") == "text":
                text = part.get("text")
                data = text.encode() if isinstance(text, str) else _encode(text)
            else:
                data = _encode(part)  # images, audio, files: their URL or data
            out.append(data)
            charged += _charge(len(data))
        return _FIELD.join(out), charged
    data = _encode(content)
    return data, len(data)


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
                text, charged = _text(m.get("content"), limit - size)
                part = b"".join(
                    (
                        _MSG,
                        str(m.get("role", "")).encode(),
                        _FIELD,
                        str(m.get("name") or "").encode(),
                        _FIELD,
                        text,
                        _FIELD,
                        _encode(m["tool_calls"]) if m.get("tool_calls") else b"",
                        _FIELD,
                        str(m.get("tool_call_id") or "").encode(),
                    )
                )
                size += charged - len(text)  # tiny parts count a UNIT each
            parts.append(part)
            size += _charge(len(part))
    prompt = body.get("prompt")
    if prompt is not None and size < limit:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of prompts: route on the first
        parts.append(_PROMPT + (prompt.encode() if isinstance(prompt, str) else _encode(prompt)))
    if not parts:
        return b"", b""
    return b"".join(parts)[:limit], parts[0]


class BlockHasher:
    """`hashes(body)`: a request's chain, and the memos that make common chains cheap.

    Each memo is a cache, not a record: bounded, and what it drops costs only the
    work again. Results never depend on what is remembered.
    - First parts (the tools, or the first message: usually a system prompt many
      requests share) of at least `head_min_bytes`, with their blocks' hashes:
      found by the model, the part's length and three 32-byte samples of it, used
      only when the whole part is equal, byte for byte, to the one remembered.
      Comparing a part costs a fraction of hashing it (bench/RESULTS.md, "Figures
      once quoted in the router's source"). At most `heads_max` parts and
      `heads_max_bytes` bytes of them, oldest forgotten first; a part longer than
      `head_max_bytes` is not remembered.
    - First blocks (the model and 64 bytes) already hashed: most requests open
      with a system prompt many others share, and blake2b costs more than the
      rest of a short chain. Cleared when it holds `firsts_max`.
    - One object per hash value of a long chain (`canon_max`, cleared when full):
      see `_canonical_ints`.
    """

    __slots__ = (
        "_canon",
        "_firsts",
        "_heads",
        "_heads_bytes",
        "canon_max",
        "firsts_max",
        "head_max_bytes",
        "head_min_bytes",
        "heads_max",
        "heads_max_bytes",
    )

    def __init__(
        self,
        *,
        head_min_bytes: int = 1024,
        heads_max: int = 1024,
        head_max_bytes: int = 1 << 20,
        heads_max_bytes: int = 32 << 20,
        firsts_max: int = 4096,
        canon_max: int = 1 << 16,
    ) -> None:
        self.head_min_bytes = head_min_bytes
        self.heads_max = heads_max
        self.head_max_bytes = head_max_bytes
        self.heads_max_bytes = heads_max_bytes
        self.firsts_max = firsts_max
        # Full, the default holds about 1,000 chains of 64 blocks: 5 MB with its
        # int objects, which are mostly the index's own keys (tracemalloc).
        self.canon_max = canon_max
        # (model, length, samples) → (the part, its blocks' hashes); oldest first.
        self._heads: OrderedDict[tuple[bytes, int, bytes], tuple[bytes, tuple[int, ...]]] = (
            OrderedDict()
        )
        self._heads_bytes = 0  # bytes of parts in _heads
        # The model and the first block's bytes → its hash.
        self._firsts: dict[bytes, int] = {}
        # A hash value → the object first seen with it.
        self._canon: dict[int, int] = {}

    @property
    def heads(self) -> list[bytes]:
        """The first parts remembered, oldest first (tests)."""
        return [part for part, _hashes in self._heads.values()]

    @property
    def heads_bytes(self) -> int:
        return self._heads_bytes

    def canonical_ints(self) -> int:
        """How many hash values have one object (tests)."""
        return len(self._canon)

    def hashes(
        self, body: dict[str, Any], *, limit_bytes: int = MAX_ROUTED_BYTES
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
        # same as many requests' before: their hashes come from _heads when they do.
        size = len(head)
        held = bisect_right(_ENDS, min(size, len(data))) if size >= self.head_min_bytes else 0
        if held <= 1:
            return self.chain(key, data, count)
        mid = size // 2
        # Cheap to hash: the model, the length and three samples of the part; a hit
        # is one only if the whole part is the same (one memcmp).
        mk = (key, size, head[:_SAMPLE] + head[mid : mid + _SAMPLE] + head[-_SAMPLE:])
        got = self._heads.get(mk)
        if got is not None and len(got[1]) == held and got[0] == head:
            self._heads.move_to_end(mk)
            out = got[1]
        else:
            out = self.chain(key, data, held)
            if size <= self.head_max_bytes:
                self._remember_head(mk, head, out)
        if held == count:
            return out
        return self.chain(key, data, count, list(out))

    def _remember_head(
        self, mk: tuple[bytes, int, bytes], head: bytes, hashes: tuple[int, ...]
    ) -> None:
        """Put a part and its hashes into _heads (replacing any under the same key)."""
        heads = self._heads
        was = heads.pop(mk, None)
        if was is not None:
            self._heads_bytes -= len(was[0])
        heads[mk] = (head, hashes)
        self._heads_bytes += len(head)
        while len(heads) > self.heads_max or self._heads_bytes > self.heads_max_bytes:
            self._heads_bytes -= len(heads.popitem(last=False)[1][0])

    def chain(
        self, key: bytes, data: bytes, count: int, out: list[int] | None = None
    ) -> tuple[int, ...]:
        """The first `count` hashes of the chain over `data`, continuing `out` if given."""
        start = 0 if out is None else len(out)
        if out is None:
            first = key + data[: _ENDS[0]]
            firsts = self._firsts
            got = firsts.get(first)
            if got is None:
                got = int.from_bytes(blake2b(first, digest_size=8).digest(), "little")
                if len(firsts) >= self.firsts_max:
                    firsts.clear()
                firsts[first] = got
            h = got
            out = [h]
        else:
            h = out[-1]
        blocks = _BLOCKS[len(out) - 1 : count - 1]
        # getitem() and += where data[block] and extend() would read better: compiled by
        # mypyc (scripts/build-mypyc), a bytes index rejects a slice object, and
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
            self._canonical_ints(out, start)
        return tuple(out)

    def _canonical_ints(self, out: list[int], start: int) -> None:
        """Replace each hash in out[start:] by the object first seen with its value.

        The prefix index's dicts keep the key object they were first given, and find
        an identical object without comparing it. Chains that share blocks but not a
        remembered first part (a system prompt with a per-user ending, the turns of
        one conversation) otherwise bring new int objects each time, and every dict
        lookup of an equal but distinct int compares the two, on two or more lookups
        per block recorded (the cost is in bench/RESULTS.md). As objects: compiled,
        an int is unboxed and boxed again into a new object. Short chains are not
        worth it: looking each hash up costs about what it saves in the index.
        """
        fresh = cast("list[object]", out)
        canon = cast("dict[object, object]", self._canon)
        if len(canon) >= self.canon_max:
            canon.clear()
        new = fresh[start:]
        fresh[start:] = map(canon.setdefault, new, new)


# A hit needs the whole part equal; the samples only find the candidate.
_SAMPLE: Final = 32

# The router's block hasher (one per process: the memos are worth most when every
# request shares them).
BLOCK_HASHER: Final = BlockHasher()


def request_block_hashes(
    body: dict[str, Any], *, limit_bytes: int = MAX_ROUTED_BYTES
) -> tuple[int, ...]:
    """`BLOCK_HASHER.hashes(body)`: the request's chain (see `BlockHasher.hashes`)."""
    return BLOCK_HASHER.hashes(body, limit_bytes=limit_bytes)
