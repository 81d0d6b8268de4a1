"""Prefix affinity: request block hashes, rendezvous homes, the prefix index."""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Sequence
from hashlib import blake2b
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.routing.blockhash import (
    MAX_ROUTED_BYTES,
    BlockHasher,
    _canonical,
    block_end,
    block_units,
    blocks_covering,
    blocks_within,
    request_block_hashes,
)
from llmgw.router.routing.prefix import PrefixIndex, capacity_units_for
from llmgw.router.routing.rendezvous import Homes, rendezvous_order

SYSTEM = "You are a careful assistant for the llmgw project. " * 20  # ~1 KB, 16 blocks


def chat(*turns: str, system: str = SYSTEM, **extra: Any) -> dict[str, Any]:
    msgs = [{"role": "system", "content": system}]
    for i, t in enumerate(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": t})
    return {"model": "m", "messages": msgs, **extra}


class TestRequestBlockHashes:
    """Request block hashes: stable, chained and covering what the prompt holds."""

    def test_same_request_gives_same_hashes(self) -> None:
        """Hashing is a pure function of the request."""
        assert request_block_hashes(chat("hi")) == request_block_hashes(chat("hi"))

    def test_first_hash_is_stable_across_processes(self) -> None:
        """The first block's hash is blake2b, not Python's per-process hash: a golden value."""
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        assert request_block_hashes(body) == (9842970722846239970,)

    @settings(max_examples=60)
    @given(st.one_of(st.integers(0, 700), st.integers(0, 40_000)), st.integers(0, 2**32 - 1))
    def test_chain_is_the_hash_of_the_previous_hash_and_the_block(
        self, size: int, seed: int
    ) -> None:
        """Whatever the prompt's length (a short chain hashed in a Python loop, a long one
        in C), hash i is hash((hash i-1, block i)) over the canonical prompt's blocks."""
        prompt = random.Random(seed).randbytes(size).decode("latin-1")
        body = {"model": "m", "prompt": prompt}
        data = _canonical(body)
        got = request_block_hashes(body)
        first = blake2b(b"m\x1e" + data[: block_end(0)], digest_size=8).digest()
        want = [int.from_bytes(first, "little")]
        for i in range(1, blocks_covering(len(data))):
            want.append(hash((want[-1], data[block_end(i - 1) : block_end(i)])))
        assert got == tuple(want)

    @given(
        system=st.integers(0, 20_000),
        users=st.lists(st.integers(0, 9_000), min_size=1, max_size=3),
        seed=st.integers(0, 2**32 - 1),
    )
    @settings(max_examples=60, deadline=None)
    def test_a_remembered_first_part_gives_the_same_chain(
        self, system: int, users: list[int], seed: int
    ) -> None:
        """Chat requests sharing a system prompt (its blocks' hashes remembered after the
        first) get exactly the chain computed link by link, whatever follows it."""
        rnd = random.Random(seed)
        text = rnd.randbytes(system).decode("latin-1")
        for n in users:
            body = chat(rnd.randbytes(n).decode("latin-1"), system=text)
            data = _canonical(body)
            first = blake2b(b"m\x1e" + data[: block_end(0)], digest_size=8).digest()
            want = [int.from_bytes(first, "little")]
            for i in range(1, blocks_covering(len(data))):
                want.append(hash((want[-1], data[block_end(i - 1) : block_end(i)])))
            assert request_block_hashes(body) == tuple(want)

    def test_a_remembered_part_is_used_only_when_equal_byte_for_byte(self) -> None:
        """Parts found under the same key (model, length and the three samples) but
        different elsewhere get each their own chain, as computed link by link."""
        size = 6000
        a = "a" * size
        b = "a" * 1000 + "b" + "a" * (size - 1001)  # outside the samples
        want = {}
        for text in (a, b):
            want[text] = BlockHasher().hashes(chat("hi", system=text))
        assert want[a] != want[b]
        hasher = BlockHasher()
        for _ in range(2):
            for text in (a, b, a, a, b):
                assert hasher.hashes(chat("hi", system=text)) == want[text]

    def test_equal_hashes_are_one_object(self) -> None:
        """Long chains that share blocks give the same int objects for them (what the
        index's dicts find by identity), whichever way each was computed, from a bounded
        table that starts again when full (hashes unchanged)."""
        # The ways: remembered first parts that differ at their end, later turns, a
        # prompt without a remembered part.
        system = "You review code carefully. " * 200
        bodies = [
            chat("hi", system=system + "User: ana."),
            chat("hi", system=system + "User: bob, in French."),
            chat("more please", system=system + "User: ana."),
            {"model": "m", "messages": [{"role": "user", "content": "short " * 150}]},
            {"model": "m", "messages": [{"role": "user", "content": "short " * 160}]},
        ]
        hasher = BlockHasher(canon_max=1024)
        chains = [hasher.hashes(b) for b in bodies]
        seen: dict[int, int] = {}
        for chain in chains:
            for h in chain:
                assert id(seen.setdefault(h, h)) == id(h)
        assert len(seen) < sum(map(len, chains))  # they do share blocks
        for _ in range(1024 // 8 + 2):
            hasher.chain(b"m\x1e", random.randbytes(600), 9)
        assert 0 < hasher.canonical_ints() <= 1024
        assert [hasher.hashes(b) for b in bodies] == chains

    def test_remembered_parts_are_bounded_in_count_and_bytes(self) -> None:
        """The memo keeps at most heads_max parts and heads_max_bytes of them, oldest
        forgotten first; a part over head_max_bytes is hashed but not kept."""
        big = 64 << 10
        hasher = BlockHasher(heads_max=16, head_max_bytes=big, heads_max_bytes=4 * big)
        rnd = random.Random(3)
        for _ in range(40):
            text = rnd.randbytes(big // 2).hex()[: big - 200]
            hasher.hashes(chat("hi", system=text), limit_bytes=2 * big)
        kept = [len(head) for head in hasher.heads]
        assert hasher.heads_bytes == sum(kept) <= 4 * big
        assert 0 < len(kept) < 40
        hasher.hashes(chat("hi", system="x" * (big + 1)), limit_bytes=2 * big)
        assert max(len(h) for h in hasher.heads) <= big
        for n in range(16 + 10):
            hasher.hashes(chat("hi", system=f"{n:08d}" + "y" * 2000))
        assert len(hasher.heads) == 16

    def test_tools_are_the_first_part(self) -> None:
        """With tools, the tools are the remembered part: another conversation with the
        same tools shares their blocks, other tools share nothing."""
        tools = [
            {"type": "function", "function": {"name": f"f{i}", "description": "x" * 300}}
            for i in range(8)
        ]
        a = request_block_hashes(chat("one", tools=tools))
        b = request_block_hashes(chat("two", system="other", tools=tools))
        c = request_block_hashes(chat("one", tools=tools[:7]))
        shared = blocks_covering(len(_canonical({"tools": tools})))
        assert shared > 16
        assert a[:shared] == b[:shared]
        assert a[0] == c[0]
        assert a[shared - 1] != c[shared - 1]

    def test_next_turn_extends_the_chain(self) -> None:
        """A conversation's next turn starts with every full block of the previous one."""
        one = request_block_hashes(chat("What is a KV cache?"))
        two = request_block_hashes(chat("What is a KV cache?", "It stores keys.", "And then?"))
        assert len(two) > len(one)
        assert two[: len(one)] == one

    def test_blocks_grow_with_their_offset(self) -> None:
        """64-byte blocks for the first KiB, then about 1/16 of the offset, 64-byte multiples."""
        ends = [block_end(i) for i in range(40)]
        assert ends[:17] == [64 * (i + 1) for i in range(17)]
        sizes = [b - a for a, b in zip([0, *ends], ends, strict=False)]
        for i, size in enumerate(sizes):
            assert size % 64 == 0
            assert size == max(64, (ends[i] - size) // 16 // 64 * 64)
        assert [block_units(i) for i in range(3)] == [1, 1, 1]
        assert block_units(39) == sizes[39] // 64

    def test_block_count_is_logarithmic(self) -> None:
        """A prompt of n bytes has about 16 + 16 ln(n / 1 KiB) full blocks."""
        counts = [blocks_covering(n) for n in (300, 8 << 10, 64 << 10, 1 << 20)]
        assert counts == [4, 57, 92, 138]
        hashes = request_block_hashes({"model": "m", "prompt": "x" * (64 << 10)})
        assert len(hashes) == blocks_covering((64 << 10) + 1)

    def test_the_whole_prompt_routes(self) -> None:
        """Two prompts sharing a 24 KiB preamble and differing after it share only the
        blocks the preamble covers; the old 16 KiB cut made them identical."""
        preamble = "tool definitions and instructions " * 740  # ~25 KB
        a = request_block_hashes(chat("q", system=preamble + "system prompt A " * 200))
        b = request_block_hashes(chat("q", system=preamble + "system prompt B " * 200))
        shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        assert block_end(shared - 1) <= len(preamble) + 40 < block_end(shared + 1)
        assert len(a) == len(b) > shared

    def test_routing_stops_at_the_limit(self) -> None:
        """Past MAX_ROUTED_BYTES (or limit_bytes) nothing more is hashed."""
        n = blocks_covering(10_000)
        assert (
            len(request_block_hashes({"model": "m", "prompt": "y" * 50_000}, limit_bytes=10_000))
            == n
        )
        assert blocks_covering(MAX_ROUTED_BYTES) < 170

    def test_short_prompt_gets_one_hash(self) -> None:
        """Less than a block still has a first hash, so it still has a home."""
        assert len(request_block_hashes({"model": "m", "prompt": "hi"})) == 1

    def test_no_prompt_no_hashes(self) -> None:
        """A body without messages or prompt hashes to nothing."""
        assert request_block_hashes({"model": "m"}) == ()

    def test_shared_system_prompt_shares_leading_blocks(self) -> None:
        """Two conversations with one system prompt share its full blocks, then diverge."""
        a = request_block_hashes(chat("first question " * 10))
        b = request_block_hashes(chat("another question " * 10))
        shared = len(SYSTEM) // 64
        assert a[:shared] == b[:shared]
        assert a[-1] != b[-1]

    def test_message_order_matters(self) -> None:
        """The same messages in another order are another prompt."""
        a = request_block_hashes(chat("x" * 100, "y" * 100, system="s"))
        b = request_block_hashes(chat("y" * 100, "x" * 100, system="s"))
        assert a != b

    def test_field_boundaries_matter(self) -> None:
        """Moving text across a message boundary changes the hashes."""
        a = request_block_hashes(chat("ab" * 40, "c" * 40, system="s"))
        b = request_block_hashes(chat("ab" * 40 + "c" * 20, "c" * 20, system="s"))
        assert a[-1] != b[-1]

    def test_roles_names_and_tool_calls_are_part_of_the_prompt(self) -> None:
        """Role, name and tool calls change the prompt as the engine renders it."""
        base = {"role": "assistant", "content": "z" * 80}
        variants = [
            base,
            {**base, "role": "user"},
            {**base, "name": "bob"},
            {**base, "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}]},
        ]
        hashes = {request_block_hashes({"model": "m", "messages": [v]}) for v in variants}
        assert len(hashes) == 4

    def test_content_parts_text_counts(self) -> None:
        """Text inside content parts is hashed; different text, different hashes."""

        def parts(text: str) -> dict[str, Any]:
            content = [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": "u"}},
            ]
            return {"model": "m", "messages": [{"role": "user", "content": content}]}

        assert request_block_hashes(parts("a" * 100)) != request_block_hashes(parts("b" * 100))

    def test_tool_definitions_come_first(self) -> None:
        """Different tools make a different prefix from the first block on."""
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
        with_tools = request_block_hashes(chat("q", tools=[tool]))
        without = request_block_hashes(chat("q"))
        assert with_tools[0] != without[0]

    def test_session_hint_never_joins_the_chain(self) -> None:
        """Content only: the `user` field (a session hint) leaves the chain unchanged, so
        conversations of different users over one system prompt share its blocks."""
        assert request_block_hashes(chat("q", user="u1")) == request_block_hashes(chat("q"))
        a = request_block_hashes(chat("first question", user="u1"))
        b = request_block_hashes(chat("other question", user="u2"))
        assert a[:16] == b[:16]

    def test_model_joins_the_first_block(self) -> None:
        """Two models on one endpoint never share a prefix."""
        assert (
            request_block_hashes({**chat("q"), "model": "a"})[0]
            != request_block_hashes(chat("q"))[0]
        )

    def test_completions_prompt_is_hashed(self) -> None:
        """A /completions prompt (or the first of a batch) is the canonical text."""
        one = request_block_hashes({"model": "m", "prompt": "p" * 200})
        batch = request_block_hashes({"model": "m", "prompt": ["p" * 200, "q"]})
        assert one == batch
        assert len(one) == 3


class TestCapacityUnits:
    """Capacity units converted between tokens and blocks."""

    def test_tokens_convert_at_four_chars_per_token(self) -> None:
        """KV tokens × 4 chars / 64-byte units; unknown capacity stays unknown."""
        assert (
            capacity_units_for(670_832),
            capacity_units_for(1),
            capacity_units_for(None),
        ) == (
            41_927,
            1,
            None,
        )

    def test_blocks_within_a_capacity(self) -> None:
        """blocks_within(u) leading blocks weigh at most u units, one more would not."""
        for units in (1, 16, 17, 100, 5000):
            n = blocks_within(units)
            assert sum(block_units(i) for i in range(n)) <= units
            assert sum(block_units(i) for i in range(n + 1)) > units


class TestRendezvous:
    """Rendezvous homes are deterministic, stable and spread evenly."""

    def test_order_is_a_permutation_and_deterministic(self) -> None:
        """Every candidate appears once, in an order fixed by key and ids alone (golden)."""
        assert rendezvous_order(12345, ["a", "b", "c", "d"]) == ["a", "c", "d", "b"]
        assert rendezvous_order(12345, ["d", "c", "b", "a"]) == ["a", "c", "d", "b"]

    def test_removing_another_endpoint_keeps_the_home(self) -> None:
        """Only keys whose home left move; the others keep their first choice."""
        ids = [f"ep{i}" for i in range(8)]
        for key in range(200):
            home = rendezvous_order(key, ids)[0]
            rest = [i for i in ids if i != "ep3"]
            if home != "ep3":
                assert rendezvous_order(key, rest)[0] == home

    def test_homes_spread_evenly(self) -> None:
        """Over many keys each of 8 endpoints is home to roughly an eighth."""
        ids = [f"ep{i}" for i in range(8)]
        homes = Counter(rendezvous_order(k * 7919, ids)[0] for k in range(8000))
        assert set(homes) == set(ids)
        assert max(homes.values()) < 1.25 * 1000
        assert min(homes.values()) > 0.75 * 1000

    def test_negative_keys_are_accepted(self) -> None:
        """Keys are taken modulo 2**64, so signed hashes work."""
        assert sorted(rendezvous_order(-5, ["a", "b"])) == ["a", "b"]

    def test_remembered_ids_give_the_same_orders_and_stay_bounded(self) -> None:
        """A policy's `Homes` answers as rendezvous_order does, asked lazily or not,
        however often its memo of ids fills and starts again."""
        homes = Homes(max_ids=5)
        ids = [f"ep{i}" for i in range(12)]
        for k in range(50):
            want = rendezvous_order(k * 7919, ids[k % 4 :])
            assert homes.order(k * 7919, ids[k % 4 :]) == want
            assert homes.lazy(k * 7919, ids[k % 4 :])() == want


class TestPrefixIndex:
    """The prefix index's matches, bounds and eviction order."""

    def test_match_counts_leading_blocks_held(self) -> None:
        """Each endpoint's match is the length of the leading run of blocks it holds."""
        idx = PrefixIndex()
        idx.record("a", [1, 2, 3, 4], capacity_units=None)
        idx.record("b", [1, 2], capacity_units=None)
        idx.record("c", [9], capacity_units=None)
        assert idx.match([1, 2, 3, 5], ["a", "b", "c", "d"]) == {"a": 3, "b": 2}

    def test_match_only_looks_at_candidates(self) -> None:
        """Endpoints not among the candidates are not reported."""
        idx = PrefixIndex()
        idx.record("a", [1], capacity_units=None)
        assert idx.match([1], ["b"]) == {}
        assert idx.match([], ["a"]) == {}

    def test_capacity_evicts_the_tail_of_the_oldest_chain_first(self) -> None:
        """Over its capacity an endpoint forgets the deepest blocks of its oldest chains."""
        idx = PrefixIndex()
        idx.record("a", [1, 2, 3], capacity_units=4)
        idx.record("a", [10, 11], capacity_units=4)
        assert idx.entries("a") == 4
        assert idx.match([1, 2, 3], ["a"]) == {"a": 2}
        assert idx.match([10, 11], ["a"]) == {"a": 2}

    def test_recording_again_refreshes_recency(self) -> None:
        """A chain sent again becomes the most recent and survives eviction."""
        idx = PrefixIndex()
        idx.record("a", [1, 2], capacity_units=4)
        idx.record("a", [3, 4], capacity_units=4)
        idx.record("a", [1, 2], capacity_units=4)
        idx.record("a", [5, 6], capacity_units=4)
        assert idx.match([1, 2], ["a"]) == {"a": 2}
        assert idx.match([3], ["a"]) == {}

    def test_completion_restamps_under_pressure(self) -> None:
        """Over half its capacity, a completion makes the chain the most recent again."""
        idx = PrefixIndex()
        idx.record("a", [1, 2], capacity_units=6)
        idx.record("a", [3, 4], capacity_units=6)
        idx.completed("a", [1, 2], capacity_units=6)
        idx.record("a", [5, 6], capacity_units=6)
        idx.record("a", [7], capacity_units=6)
        assert idx.match([1, 2], ["a"]) == {"a": 2}
        assert idx.match([3, 4], ["a"]) == {"a": 1}

    def test_completion_far_from_capacity_changes_nothing(self) -> None:
        """At most half full, a completion of a chain still held leaves the index as it
        is: nothing is evicted before as much again is sent there."""
        idx = PrefixIndex()
        idx.record("a", [1, 2], capacity_units=100)
        idx.record("a", [3, 4], capacity_units=100)
        before = _state(idx)
        idx.completed("a", [1, 2], capacity_units=100)
        assert _state(idx) == before

    def test_completion_of_a_chain_no_longer_held_records_it(self) -> None:
        """A completion whose chain was forgotten since its dispatch (purge, trim) puts
        it back, however empty the index: the engine holds it now."""
        idx = PrefixIndex()
        idx.record("a", [1, 2], capacity_units=100)
        idx.purge("a")
        idx.completed("a", [1, 2], capacity_units=100)
        assert idx.match([1, 2], ["a"]) == {"a": 2}
        idx.record("b", [1, 2, 3], capacity_units=100)
        idx.trim("b", 2)
        idx.completed("b", [1, 2, 3], capacity_units=100)
        assert idx.match([1, 2, 3], ["b"]) == {"b": 3}

    def test_chain_longer_than_capacity_keeps_its_head(self) -> None:
        """A chain bigger than the endpoint's capacity keeps its first blocks."""
        idx = PrefixIndex()
        idx.record("a", list(range(1, 11)), capacity_units=3)
        assert idx.match(list(range(1, 11)), ["a"]) == {"a": 3}

    def test_unknown_capacity_uses_the_default(self) -> None:
        """capacity_units=None bounds the endpoint by default_capacity_units."""
        idx = PrefixIndex(default_capacity_units=5)
        idx.record("a", list(range(100)), capacity_units=None)
        assert idx.entries("a") == 5

    def test_global_cap_evicts_least_recent_across_endpoints(self) -> None:
        """Past max_total_entries the globally oldest entries go, whichever endpoint holds them."""
        idx = PrefixIndex(max_total_entries=6)
        idx.record("old", [1, 2, 3], capacity_units=None)
        idx.record("mid", [4, 5, 6], capacity_units=None)
        idx.record("new", [7, 8], capacity_units=None)
        assert len(idx) == 6
        assert (idx.entries("old"), idx.entries("mid"), idx.entries("new")) == (1, 3, 2)
        assert idx.match([1, 2, 3], ["old"]) == {"old": 1}

    def test_purge_forgets_one_endpoint(self) -> None:
        """purge() drops an endpoint's entries (restart or removal) and nothing else."""
        idx = PrefixIndex()
        idx.record("a", [1, 2], capacity_units=None)
        idx.record("b", [1], capacity_units=None)
        idx.purge("a")
        idx.purge("never-seen")
        assert (len(idx), idx.match([1, 2], ["a", "b"])) == (1, {"b": 1})

    def test_retain_purges_everything_not_listed(self) -> None:
        """retain() keeps only the listed endpoints."""
        idx = PrefixIndex()
        for ep in "abc":
            idx.record(ep, [1, 2], capacity_units=None)
        idx.retain(["b", "z"])
        assert (len(idx), idx.entries_by_endpoint()) == (2, {"b": 2})

    @settings(max_examples=150)
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["a", "b", "c"]),
                st.lists(st.integers(0, 3), min_size=1, max_size=6),
                st.integers(1, 8),
            ),
            max_size=40,
        ),
        st.integers(3, 30),
    )
    def test_bounds_hold_and_chains_stay_leading_runs(
        self, ops: list[tuple[str, list[int], int]], max_total: int
    ) -> None:
        """Whatever is recorded, every endpoint stays within its capacity, the index
        within its cap, and what an endpoint holds of its newest chain is a leading run."""
        idx = PrefixIndex(max_total_entries=max_total)
        newest: dict[str, tuple[int, ...]] = {}
        for ep, path, cap in ops:
            # Chains from a small tree of shared prefixes: a node is its path from the root.
            chain = tuple(hash(tuple(path[: i + 1])) for i in range(len(path)))
            idx.record(ep, chain, capacity_units=cap)
            newest[ep] = chain
            assert idx.entries(ep) <= cap
            assert len(idx) <= max_total
            assert len(idx) == sum(idx.entries_by_endpoint().values())
        for ep, chain in newest.items():
            held = [idx.match([h], [ep]) == {ep: 1} for h in chain]
            assert held == sorted(held, reverse=True)  # True…True False…False
            # match() counts a chain held to its last block as held whole: the same.
            run = held.count(True)
            assert idx.match(chain, [ep]) == ({ep: run} if run else {})

    @settings(max_examples=200)
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["a", "b", "c"]),
                st.lists(st.integers(0, 9), min_size=1, max_size=40),
                st.sampled_from([None, 1, 5, 20, 60, 2000]),
                st.sampled_from(["once", "twice", "trim"]),
            ),
            max_size=30,
        ),
        st.integers(5, 200),
    )
    def test_record_matches_the_one_at_a_time_refresh(
        self, ops: list[tuple[str, list[int], int | None, str]], max_total: int
    ) -> None:
        """record()'s batched refresh, and its skipping of a chain recorded again with
        nothing changed in between, leave the index as popping and re-inserting every
        chain one hash at a time, deepest first, did: the same entries in the same order,
        with the same weights and the same order of stamps, hence the same matches and
        evictions (per endpoint and global), repeated hashes in a chain included."""
        idx = PrefixIndex(max_total_entries=max_total, default_capacity_units=30)
        ref = _OneAtATime(max_total_entries=max_total, default_capacity_units=30)
        for ep, chain, cap, how in ops:
            for _ in range(2 if how == "twice" else 1):
                idx.record(ep, tuple(chain), capacity_units=cap)
                ref.record(ep, tuple(chain), capacity_units=cap)
            if how == "trim":
                assert idx.trim(ep, 10) == ref.trim(ep, 10)
                idx.record(ep, tuple(chain), capacity_units=cap)
                ref.record(ep, tuple(chain), capacity_units=cap)
            assert _state(idx) == _state(ref)
            eps = "abc"
            assert [idx.units(e) for e in eps] == [ref.units(e) for e in eps]
            assert len(idx) == len(ref)

    @pytest.mark.parametrize(
        ("capacity", "max_total"), [(None, 100_000), (300, 100_000), (None, 900)]
    )
    def test_long_workloads_match_the_reference(self, capacity: int | None, max_total: int) -> None:
        """Thousands of records of long chains from shared prefixes (system prompts,
        different user turns), without pressure, under each endpoint's capacity and
        under the global cap: entries, order, weights and evictions stay those of the
        one-at-a-time reference throughout, and an endpoint's eviction front never
        holds more than the most it has held."""
        rng = random.Random(7)
        idx = PrefixIndex(max_total_entries=max_total, default_capacity_units=1 << 20)
        ref = _OneAtATime(max_total_entries=max_total, default_capacity_units=1 << 20)
        systems = [[rng.getrandbits(63) for _ in range(40)] for _ in range(6)]
        most: Counter[str] = Counter()
        fronts: dict[str, object] = {}
        remade = 0
        for step in range(3000):
            ep = rng.choice("abc")
            system = rng.choice(systems)
            chain = system[: rng.randint(20, 40)] + [
                rng.getrandbits(63) for _ in range(rng.randint(0, 30))
            ]
            idx.record(ep, tuple(chain), capacity_units=capacity)
            ref.record(ep, tuple(chain), capacity_units=capacity)
            for e, held in idx._held.items():
                # The most it held, counting a record's entries before its evictions.
                most[e] = max(most[e], len(held.lru) + (len(chain) if e == ep else 0))
                assert len(held.front) <= most[e]
                if fronts.setdefault(e, held.front) is not held.front:
                    remade += 1
                    fronts[e] = held.front
            if step % 250 == 0 or step == 2999:
                assert _state(idx) == _state(ref)
                assert [idx.units(e) for e in "abc"] == [ref.units(e) for e in "abc"]
                assert len(idx) == len(ref)
        # Under pressure the fronts run out and are made again; without, never.
        assert (remade > 3) == (capacity is not None or max_total < 100_000)

    def test_recording_the_same_chain_again_skips_only_when_nothing_changed(self) -> None:
        """The second record of a chain with nothing in between leaves the index as it
        was; one after another record, a trim or a new capacity refreshes as always."""
        idx = PrefixIndex(max_total_entries=100)
        idx.record("a", (1, 2, 3), capacity_units=None)
        before = _state(idx)
        idx.record("a", (1, 2, 3), capacity_units=None)
        assert (_state(idx), idx._tick) == (before, 1)  # skipped
        idx.record("b", (7,), capacity_units=None)
        idx.record("a", (1, 2, 3), capacity_units=None)
        assert idx._tick == 3  # refreshed: "a" is again newer than "b"
        idx.record("a", (1, 2, 3), capacity_units=2)
        assert (idx._tick, idx.entries("a")) == (4, 2)  # a new capacity
        idx.record("a", (1, 2), capacity_units=2)
        idx.trim("a", 1)
        idx.record("a", (1, 2), capacity_units=2)
        assert (idx._tick, idx.entries("a")) == (6, 2)  # after a trim


def _state(idx: PrefixIndex | _OneAtATime) -> dict[str, list[tuple[int, int, int]]]:
    """Each endpoint's (hash, stamp's rank in the index, weight), oldest first."""
    eps = sorted(idx.entries_by_endpoint())
    orders = {ep: idx.order(ep) for ep in eps}
    ticks = sorted({t for order in orders.values() for _h, t, _w in order})
    rank = {t: i for i, t in enumerate(ticks)}
    return {ep: [(h, rank[t], w) for h, t, w in order] for ep, order in orders.items()}


class _OneAtATime:
    """The reference: one OrderedDict per endpoint, every hash of a chain popped and
    re-inserted, deepest first, and the oldest entries (per endpoint, then across the
    index) evicted first. PrefixIndex must keep the same entries in the same order."""

    def __init__(self, *, max_total_entries: int, default_capacity_units: int) -> None:
        self._max_total = max_total_entries
        self._default = default_capacity_units
        self._lru: dict[str, OrderedDict[int, tuple[int, int]]] = {}
        self._weight: dict[str, int] = {}
        self._total = 0
        self._tick = 0

    def __len__(self) -> int:
        return self._total

    def entries_by_endpoint(self) -> dict[str, int]:
        return {ep: len(lru) for ep, lru in self._lru.items() if lru}

    def units(self, endpoint_id: str) -> int:
        return self._weight.get(endpoint_id, 0)

    def order(self, endpoint_id: str) -> list[tuple[int, int, int]]:
        return [(h, t, w) for h, (t, w) in self._lru.get(endpoint_id, {}).items()]

    def record(
        self, endpoint_id: str, hashes: Sequence[int], *, capacity_units: int | None
    ) -> None:
        if not hashes:
            return
        cap = self._default if capacity_units is None else max(1, capacity_units)
        lru = self._lru.setdefault(endpoint_id, OrderedDict())
        self._tick += 1
        before = len(lru)
        weight = self._weight.get(endpoint_id, 0)
        n = min(len(hashes), max(1, blocks_within(cap)))
        for i in range(n - 1, -1, -1):
            old = lru.pop(hashes[i], None)
            if old is not None:
                weight -= old[1]
            lru[hashes[i]] = (self._tick, block_units(i))
            weight += block_units(i)
        while weight > cap and len(lru) > 1:
            weight -= lru.popitem(last=False)[1][1]
        self._weight[endpoint_id] = weight
        self._total += len(lru) - before
        while self._total > self._max_total:
            ep = min((lru[next(iter(lru))], ep) for ep, lru in self._lru.items() if lru)[1]
            self._weight[ep] -= self._lru[ep].popitem(last=False)[1][1]
            self._total -= 1

    def trim(self, endpoint_id: str, units: int) -> int:
        lru = self._lru.get(endpoint_id, OrderedDict())
        gone = 0
        while lru and self._weight[endpoint_id] > units:
            self._weight[endpoint_id] -= lru.popitem(last=False)[1][1]
            gone += 1
        self._total -= gone
        return gone


class TestJournal:
    """With workers, every record is noted for the others and replayed into their index."""

    def test_records_are_noted_and_replayed_without_echo(self) -> None:
        """Records are noted and replayed without echo."""
        a, b = PrefixIndex(), PrefixIndex()
        a.journal, b.journal = [], []
        a.record("e1", [1, 2, 3], capacity_units=None)
        a.record("e2", (7, 8), capacity_units=500)
        assert a.journal == [("e1", (1, 2, 3), None), ("e2", (7, 8), 500)]
        b.replay(a.journal)
        assert b.match([1, 2, 3], ["e1", "e2"]) == {"e1": 3}
        assert b.match([7, 8], ["e1", "e2"]) == {"e2": 2}
        assert b.journal == []  # replayed records are not sent back

    def test_a_one_process_index_notes_nothing(self) -> None:
        """A one process index notes nothing."""
        idx = PrefixIndex()
        idx.record("e1", [1, 2], capacity_units=None)
        assert idx.journal is None
