"""sim-engine KV cache: block hashes, reference counts, LRU eviction, usage."""

from __future__ import annotations

import hashlib

import pytest

from llmgw.simengine.kvcache import (
    NONE_HASH,
    KVCache,
    block_hash,
    extend_block_hashes,
    prompt_block_hashes,
)


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


class TestBlockHashes:
    """KV block hashes as vLLM chains them."""

    def test_recipe(self) -> None:
        """Block 0 hashes NONE_HASH plus its tokens as 4-byte little-endian, blake2b-128."""
        tokens = seq(1000, 4)
        body = b"".join(t.to_bytes(4, "little") for t in tokens)
        expected = hashlib.blake2b(NONE_HASH + body, digest_size=16).digest()
        assert [expected] == prompt_block_hashes(tokens, 4)

    def test_none_hash(self) -> None:
        """NONE_HASH is blake2b-128 of a fixed seed string."""
        assert hashlib.blake2b(b"llmgw-sim-none-hash", digest_size=16).digest() == NONE_HASH

    def test_chained(self) -> None:
        """Block i's hash depends on block i-1's hash."""
        h = prompt_block_hashes(seq(0, 8), 4)
        assert h[1] == block_hash(h[0], seq(4, 4))

    def test_only_full_blocks(self) -> None:
        """A trailing partial block has no hash."""
        assert len(prompt_block_hashes(seq(0, 11), 4)) == 2

    def test_same_block_different_prefix(self) -> None:
        """Identical tokens after different prefixes hash differently."""
        a = prompt_block_hashes([1, 1, 1, 1, 9, 9, 9, 9], 4)
        b = prompt_block_hashes([2, 2, 2, 2, 9, 9, 9, 9], 4)
        assert a[1] != b[1]

    def test_extend_appends_only_new_blocks(self) -> None:
        """Extending after more tokens arrive gives the same chain as hashing at once."""
        tokens = seq(0, 6)
        hashes = prompt_block_hashes(tokens, 4)
        extend_block_hashes(hashes, [*tokens, 6, 7, 8], 4)
        assert prompt_block_hashes(seq(0, 9), 4) == hashes


class TestAllocate:
    """Allocating KV blocks, and refusing when full."""

    def test_usage_counts_pinned_blocks(self) -> None:
        """Usage is 1 - free / (num_gpu_blocks - 1): block 0 is vLLM's null block."""
        kv = KVCache(num_gpu_blocks=11, block_size=4)
        assert kv.allocate("a", 9, [])
        assert (7, pytest.approx(0.3)) == (kv.num_free_blocks, kv.usage)

    def test_refuses_when_full_and_changes_nothing(self) -> None:
        """A request that does not fit gets False and leaves the free count alone."""
        kv = KVCache(num_gpu_blocks=4, block_size=4)
        assert not kv.allocate("a", 13, [])
        assert (kv.num_free_blocks, kv.blocks_of("a")) == (3, 0)

    def test_grows_one_block_at_a_time(self) -> None:
        """Growing from 4 to 5 tokens takes exactly one more block."""
        kv = KVCache(num_gpu_blocks=10, block_size=4)
        kv.allocate("a", 4, [])
        kv.allocate("a", 5, [])
        assert kv.blocks_of("a") == 2

    def test_full_blocks_are_cached(self) -> None:
        """Blocks full after the step are entered under their hashes."""
        kv = KVCache(num_gpu_blocks=10, block_size=4)
        kv.allocate("a", 10, prompt_block_hashes(seq(0, 10), 4))
        assert kv.num_cached_blocks == 2


class TestPrefixHits:
    """Prefix hits pin and share cached blocks."""

    def test_second_request_hits(self) -> None:
        """A finished request's blocks serve the next request with the same prefix."""
        kv = KVCache(num_gpu_blocks=10, block_size=4)
        h = prompt_block_hashes(seq(0, 12), 4)
        kv.allocate("a", 12, h)
        kv.free("a")
        assert len(kv.lookup(h, 12)) == 2  # capped: the last token is always computed

    def test_hit_pins_evictable_blocks(self) -> None:
        """Allocating with hits raises their ref counts and takes them off the free queue."""
        kv = KVCache(num_gpu_blocks=10, block_size=4)
        h = prompt_block_hashes(seq(0, 8), 4)
        kv.allocate("a", 8, h)
        kv.free("a")
        hits = kv.lookup(h, 9)
        assert kv.allocate("b", 9, h, hits)
        assert ([c.ref_cnt for c in kv.snapshot()], kv.num_free_blocks) == ([1, 1], 6)

    def test_shared_blocks_have_two_refs(self) -> None:
        """Two live requests sharing a prefix both reference its blocks."""
        kv = KVCache(num_gpu_blocks=10, block_size=4)
        h = prompt_block_hashes(seq(0, 8), 4)
        kv.allocate("a", 9, h)
        kv.allocate("b", 9, h, kv.lookup(h, 9))
        assert [c.ref_cnt for c in kv.snapshot()] == [2, 2]

    def test_lookup_stops_at_first_miss(self) -> None:
        """Only the leading run of cached blocks counts."""
        kv = KVCache(num_gpu_blocks=10, block_size=4)
        kv.allocate("a", 8, prompt_block_hashes(seq(0, 8), 4))
        other = prompt_block_hashes([*seq(0, 4), *seq(50, 8)], 4)
        assert len(kv.lookup(other, 13)) == 1

    def test_revived_blocks_count_against_free(self) -> None:
        """Hits on evictable blocks are not free space for the rest of the request."""
        kv = KVCache(num_gpu_blocks=4, block_size=4)
        h = prompt_block_hashes(seq(0, 8), 4)
        kv.allocate("a", 8, h)
        kv.free("a")
        assert not kv.allocate("b", 13, h, kv.lookup(h, 13))  # 2 hits + 2 new > 3


class TestEviction:
    """KV block eviction order."""

    def test_fresh_blocks_before_evicting(self) -> None:
        """Never-used blocks are taken before any cached block is evicted."""
        kv = KVCache(num_gpu_blocks=5, block_size=4)
        kv.allocate("a", 4, prompt_block_hashes(seq(0, 4), 4))
        kv.free("a")
        kv.allocate("b", 12, [])
        assert (kv.num_cached_blocks, kv.evictions) == (1, 0)

    def test_least_recently_freed_goes_first(self) -> None:
        """When space runs out, the block freed longest ago is evicted."""
        kv = KVCache(num_gpu_blocks=3, block_size=4)
        ha = prompt_block_hashes(seq(0, 4), 4)
        hb = prompt_block_hashes(seq(100, 4), 4)
        kv.allocate("a", 4, ha)
        kv.allocate("b", 4, hb)
        kv.free("a")
        kv.free("b")
        kv.allocate("c", 4, [])
        assert (kv.lookup(ha, 5), len(kv.lookup(hb, 5))) == ([], 1)

    def test_tail_blocks_evicted_before_head(self) -> None:
        """A request's blocks are freed in reverse, so its last block is evicted first."""
        kv = KVCache(num_gpu_blocks=3, block_size=4)
        h = prompt_block_hashes(seq(0, 8), 4)
        kv.allocate("a", 8, h)
        kv.free("a")
        kv.allocate("c", 4, [])
        assert len(kv.lookup(h, 9)) == 1

    def test_pinned_blocks_are_never_evicted(self) -> None:
        """Blocks a live request references are not free and not evictable."""
        kv = KVCache(num_gpu_blocks=3, block_size=4)
        h = prompt_block_hashes(seq(0, 8), 4)
        kv.allocate("a", 8, h)
        assert not kv.allocate("c", 4, [])

    def test_free_is_idempotent(self) -> None:
        """Freeing twice releases once."""
        kv = KVCache(num_gpu_blocks=5, block_size=4)
        kv.allocate("a", 8, [])
        kv.free("a")
        kv.free("a")
        assert kv.num_free_blocks == 4


class TestSnapshot:
    """KV cache snapshots are sorted."""

    def test_sorted_by_block_id(self) -> None:
        """The snapshot lists cached blocks in block-id order with their hashes."""
        kv = KVCache(num_gpu_blocks=10, block_size=4)
        h = prompt_block_hashes(seq(0, 12), 4)
        kv.allocate("a", 12, h)
        snap = kv.snapshot()
        assert ([1, 2, 3], h) == ([c.block_id for c in snap], [c.hash for c in snap])


class TestResetPrefixCache:
    """Resetting the prefix cache."""

    def test_forgets_every_cached_block_when_idle(self) -> None:
        """Nothing pinned: every hash goes, so the next lookup misses."""
        kv = KVCache(num_gpu_blocks=8, block_size=4)
        hashes = [b"h0", b"h1"]
        assert kv.allocate("r", 8, hashes)
        kv.free("r")
        assert len(kv.lookup(hashes, 9)) == 2
        assert kv.reset_prefix_cache()
        assert (kv.lookup(hashes, 9), kv.num_cached_blocks) == ([], 0)

    def test_refused_while_a_request_holds_blocks(self) -> None:
        """As vLLM: a live request's blocks keep the cache as it is."""
        kv = KVCache(num_gpu_blocks=8, block_size=4)
        assert kv.allocate("r", 8, [b"h0", b"h1"])
        assert not kv.reset_prefix_cache()
        assert kv.num_cached_blocks == 2
