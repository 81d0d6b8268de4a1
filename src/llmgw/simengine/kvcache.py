"""Paged KV cache with prefix caching, after vLLM V1's BlockPool and KVCacheManager.

Capacity is `num_gpu_blocks` blocks of `block_size` tokens. As in vLLM, block 0
is a reserved "null" block, so `num_gpu_blocks - 1` blocks hold tokens and
`usage = 1 - free / (num_gpu_blocks - 1)`. Free blocks include cached blocks no
live request references (evictable), so usage measures the blocks pinned by
live requests, not cache residency (as vLLM V1 reports it).

Block hashes (the exact recipe, for benchmark oracles)
    Only full blocks are hashed. Block i of a token sequence holds tokens
    `[i*block_size, (i+1)*block_size)`; its hash is
    `blake2b(parent + b"".join(t.to_bytes(4, "little") for t in block_tokens),
    digest_size=16)`, where `parent` is the previous block's hash, and for
    block 0 `NONE_HASH = blake2b(b"llmgw-sim-none-hash", digest_size=16)`.
    A request's sequence is its prompt ids (`tokenizer.prompt_ids_for_body`)
    followed by the ids it generates. `prompt_block_hashes(ids, block_size)`
    computes the chain; `/sim/cache` lists hashes as lowercase hex.

Lifecycle
    A new request first looks up the longest chain of cached blocks matching
    its hashes, capped so at least one prompt token is computed (`lookup`).
    `allocate` pins those blocks and takes fresh ones: never-used blocks first,
    then the least recently freed (evicting its hash from the cache). Blocks
    that are full after the step are entered in the cache. `free` releases a
    request's blocks in reverse order, so a sequence's tail is evicted before
    its head, which other requests are more likely to share.

KV events
    With `events` set to a list, the cache appends vLLM's KV events to it as
    they happen (wire/kvevents.py): `BlockStored` when `allocate` enters
    blocks in the cache (one event per run of consecutive new blocks, with
    their tokens, so `allocate` needs the owner's `token_ids`), `BlockRemoved`
    when `_take` evicts a cached block for reuse, `AllBlocksCleared` on
    `reset_prefix_cache`. The publisher (kvevents.py) sends and empties the
    list after each scheduler step.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.wire.kvevents import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

NONE_HASH: bytes = hashlib.blake2b(b"llmgw-sim-none-hash", digest_size=16).digest()

HASH_RECIPE = (
    "hash_i = blake2b(parent || token_ids of block i as 4-byte little-endian, digest_size=16); "
    "parent = hash_{i-1}, or for block 0 NONE_HASH = blake2b(b'llmgw-sim-none-hash', "
    "digest_size=16); only full blocks are hashed; token ids from "
    "llmgw.simengine.tokenizer.prompt_ids_for_body(body) (prompt) followed by generated ids; "
    "llmgw.simengine.kvcache.prompt_block_hashes(ids, block_size) computes the chain"
)


def block_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The hash of one full block whose predecessor's hash is `parent`."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(t.to_bytes(4, "little") for t in token_ids))
    return h.digest()


def extend_block_hashes(hashes: list[bytes], token_ids: Sequence[int], block_size: int) -> None:
    """Append the hashes of blocks of `token_ids` that are full but not hashed yet."""
    full = len(token_ids) // block_size
    parent = hashes[-1] if hashes else NONE_HASH
    for i in range(len(hashes), full):
        parent = block_hash(parent, token_ids[i * block_size : (i + 1) * block_size])
        hashes.append(parent)


def prompt_block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chain of block hashes of a token sequence (full blocks only)."""
    out: list[bytes] = []
    extend_block_hashes(out, token_ids, block_size)
    return out


class Block:
    __slots__ = ("block_id", "hash", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        # None: not full, or a duplicate of a block already cached.
        self.hash: bytes | None = None
        self.ref_cnt = 0


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """One cached block as /sim/cache shows it."""

    block_id: int
    hash: bytes
    ref_cnt: int  # 0: evictable, kept until its space is needed


class KVCache:
    """Blocks, their reference counts, the hash → block map and the LRU free queue."""

    def __init__(self, *, num_gpu_blocks: int, block_size: int) -> None:
        if num_gpu_blocks < 2 or block_size < 1:
            raise ValueError("need num_gpu_blocks >= 2 and block_size >= 1")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        # Blocks are created on first use: ids below _next_fresh exist. All never-used
        # blocks come before any freed one in vLLM's free queue, so taking fresh ids
        # first and then the LRU head is the same order without building 40k objects.
        self._next_fresh = 1  # block 0 is vLLM's null block
        self._free: OrderedDict[int, Block] = OrderedDict()  # freed blocks, LRU first
        self._cached: dict[bytes, Block] = {}
        self._owned: dict[str, list[Block]] = {}
        self._num_hashed: dict[str, int] = {}  # per owner: leading blocks already cached
        self.evictions = 0
        # vLLM's KV events, appended as they happen; None: not recorded (see above).
        self.events: list[KVEvent] | None = None

    @property
    def capacity_blocks(self) -> int:
        return self.num_gpu_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return self.num_gpu_blocks - self._next_fresh + len(self._free)

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: fraction of blocks pinned by live requests."""
        return 1.0 - self.num_free_blocks / self.capacity_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def blocks_of(self, owner: str) -> int:
        return len(self._owned.get(owner, ()))

    def lookup(self, hashes: Sequence[bytes], num_tokens: int) -> list[Block]:
        """The longest run of cached blocks matching `hashes` from the start.

        At most `(num_tokens - 1) // block_size` blocks: the last token is always
        computed, as it yields the logits of the first output token.
        """
        limit = min(len(hashes), (num_tokens - 1) // self.block_size)
        out: list[Block] = []
        cached = self._cached
        for i in range(limit):
            b = cached.get(hashes[i])
            if b is None:
                break
            out.append(b)
        return out

    def allocate(
        self,
        owner: str,
        num_tokens: int,
        hashes: Sequence[bytes],
        computed: Sequence[Block] = (),
        token_ids: Sequence[int] = (),
    ) -> bool:
        """Make `owner` hold blocks for its first `num_tokens` tokens; False if they do not fit.

        `computed` are cache hits from `lookup` (only when `owner` holds nothing
        yet). On False nothing changed. Blocks that will be full once those
        tokens are computed are entered in the cache under `hashes`; with events
        on, `token_ids` (the owner's tokens) go into their BlockStored events.
        """
        blocks = self._owned.get(owner)
        if blocks is None:
            blocks = self._owned[owner] = []
            self._num_hashed[owner] = 0
        elif computed:
            raise ValueError("cache hits can only start a request's blocks")
        bs = self.block_size
        need = -(-num_tokens // bs) - len(blocks) - len(computed)
        # A hit on an evictable block takes it out of the free queue as well.
        revived = sum(1 for b in computed if b.ref_cnt == 0)
        if need > self.num_free_blocks - revived:
            if not blocks:
                del self._owned[owner], self._num_hashed[owner]
            return False
        for b in computed:
            if b.ref_cnt == 0:
                del self._free[b.block_id]
            b.ref_cnt += 1
        blocks.extend(computed)
        for _ in range(need):
            blocks.append(self._take())
        full = min(len(hashes), num_tokens // bs)
        start = self._num_hashed[owner] + len(computed)
        cached = self._cached
        stored: list[int] = []
        for i in range(start, full):
            h = hashes[i]
            if h not in cached:
                b = blocks[i]
                b.hash = h
                cached[h] = b
                stored.append(i)
        self._num_hashed[owner] = max(full, start)
        if stored and self.events is not None:
            self._stored_events(stored, hashes, token_ids)
        return True

    def _stored_events(
        self, stored: list[int], hashes: Sequence[bytes], token_ids: Sequence[int]
    ) -> None:
        """One BlockStored per run of consecutive block indexes newly cached."""
        assert self.events is not None
        bs = self.block_size
        run_start = prev = stored[0]
        for i in [*stored[1:], -1]:
            if i == prev + 1:
                prev = i
                continue
            self.events.append(
                BlockStored(
                    block_hashes=list(hashes[run_start : prev + 1]),
                    parent_block_hash=hashes[run_start - 1] if run_start else None,
                    token_ids=list(token_ids[run_start * bs : (prev + 1) * bs]),
                    block_size=bs,
                    lora_id=None,
                    medium="GPU",
                )
            )
            run_start = prev = i

    def _take(self) -> Block:
        if self._next_fresh < self.num_gpu_blocks:
            b = Block(self._next_fresh)
            self._next_fresh += 1
        else:
            _, b = self._free.popitem(last=False)
            if b.hash is not None:
                del self._cached[b.hash]
                if self.events is not None:
                    self.events.append(BlockRemoved(block_hashes=[b.hash], medium="GPU"))
                b.hash = None
                self.evictions += 1
        b.ref_cnt = 1
        return b

    def free(self, owner: str) -> None:
        """Release all of `owner`'s blocks (finished, aborted or preempted); idempotent."""
        blocks = self._owned.pop(owner, None)
        self._num_hashed.pop(owner, None)
        if not blocks:
            return
        free = self._free
        for b in reversed(blocks):
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                free[b.block_id] = b

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, as vLLM's reset_prefix_cache; False (nothing
        changed) while a live request still pins blocks, as vLLM refuses then."""
        if self._owned:
            return False
        for b in self._cached.values():
            b.hash = None
        self._cached.clear()
        if self.events is not None:
            self.events.append(AllBlocksCleared())
        return True

    def snapshot(self) -> list[CachedBlock]:
        """Every cached block with its reference count, sorted by block id."""
        out = [CachedBlock(b.block_id, h, b.ref_cnt) for h, b in self._cached.items()]
        out.sort(key=lambda c: c.block_id)
        return out
