"""Precise mode's pieces: vLLM's KV-event wire format, the sim-engine's events, the
router's per-endpoint block sets and how the scheduler uses them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot, Stats
from llmgw.router.routing.affinity import route_key
from llmgw.router.routing.kvevents import EngineBlocks, KVEventIndex, token_chain
from llmgw.router.routing.policies import Ours
from llmgw.router.routing.prefix import PrefixIndex
from llmgw.simengine.kvcache import KVCache, prompt_block_hashes
from llmgw.tokenization import TokenizerSpecError, load_tokenizer
from llmgw.tokenization.sim import BOS, prompt_ids_for_body, tokenize
from llmgw.wire.endpoints import EndpointInfo
from llmgw.wire.kvevents import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventsDecodeError,
    decode_batch,
    decode_seq,
    encode_batch,
    encode_seq,
)

# vLLM's own structs, in the two layouts its releases have published (written here
# from its documented field list, so the test does not depend on vLLM).


class VArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class VArrayStored(VArrayEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class VArrayRemoved(VArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class VArrayCleared(VArrayEvent, tag="AllBlocksCleared"):
    pass


class VArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[VArrayStored | VArrayRemoved | VArrayCleared]


class VMapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class VMapStored(VMapEvent, tag="BlockStored"):
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class VMapRemoved(VMapEvent, tag="BlockRemoved"):
    block_hashes: list[bytes]
    medium: str | None
    group_idx: int | None = None


class VMapCleared(VMapEvent, tag="AllBlocksCleared"):
    pass


class VMapBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[VMapStored | VMapRemoved | VMapCleared]
    data_parallel_rank: int | None = None


def stored(hashes: list[Any], parent: Any, tokens: list[int], bs: int = 2) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=bs,
        lora_id=None,
        medium="GPU",
    )


class TestCodec:
    """vLLM's KV-event wire format, decoded and refused."""

    @pytest.mark.parametrize(
        "payload",
        [
            b"\x91" * 100_000 + b"\xc0",
            # A batch whose one event nests 100,000 levels deep.
            b"\x92\x01\x91" + b"\x91" * 100_000 + b"\xc0",
            b"\x82\xa2ts\x01\xa6events\x91" + b"\x81\xa1a" * 100_000 + b"\xc0",
        ],
    )
    def test_deep_nesting_is_a_decode_error_not_a_recursion_error(self, payload: bytes) -> None:
        """100,000 levels of arrays or maps: KVEventsDecodeError, which the follower counts
        as an unreadable batch, never RecursionError out of the subscription."""
        with pytest.raises(KVEventsDecodeError, match="nested too deeply"):
            decode_batch(payload)

    def test_array_layout_is_vllms_byte_for_byte(self) -> None:
        """What we encode is what vLLM's array_like structs encode, and decodes back."""
        ours = KVEventBatch(
            ts=12.5,
            events=[
                BlockStored(
                    block_hashes=[7, 8],
                    parent_block_hash=None,
                    token_ids=[1, 2, 3, 4],
                    block_size=2,
                    lora_id=None,
                    medium="GPU",
                ),
                BlockRemoved(block_hashes=[7], medium="GPU"),
                AllBlocksCleared(),
            ],
        )
        theirs = VArrayBatch(
            ts=12.5,
            events=[
                VArrayStored([7, 8], None, [1, 2, 3, 4], 2, None, "GPU"),
                VArrayRemoved([7], "GPU"),
                VArrayCleared(),
            ],
        )
        assert encode_batch(ours) == msgspec.msgpack.encode(theirs)
        assert decode_batch(encode_batch(ours)) == (12.5, ours.events)

    def test_map_layout_of_later_vllm_decodes(self) -> None:
        """Newer vLLM's map layout (bytes hashes, extra fields) reads as the same events."""
        payload = msgspec.msgpack.encode(
            VMapBatch(
                ts=3.0,
                events=[
                    VMapStored([b"a", b"b"], b"p", [5, 6, 7, 8], 2, None, "GPU", None, None, 0),
                    VMapRemoved([b"a"], None),
                    VMapCleared(),
                ],
                data_parallel_rank=0,
            )
        )
        ts, events = decode_batch(payload)
        assert ts == 3.0
        assert events == [
            BlockStored(
                block_hashes=[b"a", b"b"],
                parent_block_hash=b"p",
                token_ids=[5, 6, 7, 8],
                block_size=2,
                lora_id=None,
                medium="GPU",
            ),
            BlockRemoved(block_hashes=[b"a"], medium=None),
            AllBlocksCleared(),
        ]

    def test_unknown_kinds_and_keyed_blocks_are_left_out(self) -> None:
        """An event kind we do not know, and blocks hashed with extra keys (multimodal,
        LoRA by name), are skipped rather than misread."""
        payload = msgspec.msgpack.encode(
            {
                "ts": 1,
                "events": [
                    {"type": "SomethingNew", "x": 1},
                    ["AnotherNew", 1, 2],
                    VMapStored([b"a"], None, [1, 2], 2, None, None, None, [("img", 1)]),
                    VMapStored([b"b"], None, [1, 2], 2, None, None, "adapter"),
                    {"type": "AllBlocksCleared"},
                ],
            }
        )
        assert decode_batch(payload) == (1.0, [AllBlocksCleared()])

    def test_older_events_without_medium_decode(self) -> None:
        """vLLM releases before `medium` sent six-element BlockStored arrays."""
        payload = msgspec.msgpack.encode([0.5, [["BlockStored", [1], None, [3, 4], 2, None]]])
        assert decode_batch(payload)[1] == [
            BlockStored(
                block_hashes=[1],
                parent_block_hash=None,
                token_ids=[3, 4],
                block_size=2,
                lora_id=None,
                medium=None,
            )
        ]

    @pytest.mark.parametrize(
        "payload",
        [
            b"\xc1",  # not msgpack
            msgspec.msgpack.encode(42),
            msgspec.msgpack.encode(["ts", []]),
            msgspec.msgpack.encode([1.0, "events"]),
            msgspec.msgpack.encode([1.0, [42]]),
            msgspec.msgpack.encode([1.0, [["BlockStored", [1]]]]),  # fields missing
            msgspec.msgpack.encode([1.0, [["BlockStored", "x", None, [1], 1, None, None]]]),
            # Map layout with an extra_keys that is not a list: refused, not a TypeError
            # that would end the endpoint's subscription (kvfollow catches only this error).
            *(
                msgspec.msgpack.encode(
                    {
                        "ts": 1.0,
                        "events": [
                            {
                                "type": "BlockStored",
                                "block_hashes": [1],
                                "parent_block_hash": None,
                                "token_ids": [1],
                                "block_size": 1,
                                "extra_keys": extra,
                            }
                        ],
                    }
                )
                for extra in (5, True, 1.5)
            ),
        ],
    )
    def test_malformed_payloads_are_refused(self, payload: bytes) -> None:
        """A malformed payload is a decode error."""
        with pytest.raises(KVEventsDecodeError):
            decode_batch(payload)

    def test_sequence_frames(self) -> None:
        """8 bytes big-endian, as vLLM's publisher sends them; -1 ends a replay."""
        assert encode_seq(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"
        assert decode_seq(encode_seq(258)) == 258
        assert decode_seq((-1).to_bytes(8, "big", signed=True)) == -1
        with pytest.raises(KVEventsDecodeError):
            decode_seq(b"\x01")


class TestSimEngineEvents:
    """The KV events the sim-engine publishes."""

    def test_store_evict_and_reset_are_published(self) -> None:
        """allocate stores a run of blocks with their tokens and parent; reusing a
        cached block evicts it; a reset clears all."""
        kv = KVCache(num_gpu_blocks=4, block_size=2)
        kv.events = []
        a = [1, 2, 3, 4, 5]
        ha = prompt_block_hashes(a, 2)
        assert kv.allocate("a", 5, ha, token_ids=a)
        assert kv.events == [stored(ha, None, [1, 2, 3, 4])]
        kv.free("a")
        kv.events.clear()
        b = [9, 9, 9, 9, 9]
        hb = prompt_block_hashes(b, 2)
        assert kv.allocate("b", 5, hb, token_ids=b)  # needs all 3 blocks: evicts a's two
        assert kv.events == [
            BlockRemoved(block_hashes=[ha[1]], medium="GPU"),
            BlockRemoved(block_hashes=[ha[0]], medium="GPU"),
            stored(hb, None, [9, 9, 9, 9]),
        ]
        kv.free("b")
        kv.events.clear()
        assert kv.reset_prefix_cache()
        assert kv.events == [AllBlocksCleared()]

    def test_a_hit_stores_only_the_new_tail_with_its_parent(self) -> None:
        """A hit stores only the new tail with its parent."""
        kv = KVCache(num_gpu_blocks=16, block_size=2)
        kv.events = []
        first = [1, 2, 3, 4, 5]
        assert kv.allocate("a", 5, prompt_block_hashes(first, 2), token_ids=first)
        kv.free("a")
        kv.events.clear()
        longer = [1, 2, 3, 4, 6, 7, 8]
        h = prompt_block_hashes(longer, 2)
        hits = kv.lookup(h, len(longer))
        assert len(hits) == 2
        assert kv.allocate("b", 7, h, hits, token_ids=longer)
        assert kv.events == [stored([h[2]], h[1], [6, 7])]


def blocks_from(events: list[Any], seq: int = 0) -> EngineBlocks:
    b = EngineBlocks()
    b.connected = True
    b.on_batch(seq, events)
    return b


class TestEngineBlocks:
    """The block set kept per engine from its events, and when it is precise."""

    def test_exact_set_from_events(self) -> None:
        """The router's own chain over the events' tokens matches the prompt's chain,
        whatever the engine's hashes are; removals and a clear take blocks away."""
        b = blocks_from([stored([b"x", b"y"], None, [1, 2, 3, 4]), stored([b"z"], b"y", [5, 6])])
        chain = token_chain([1, 2, 3, 4, 5, 6, 7], 2, 3)
        assert b.precise
        assert b.held_blocks(chain, 3) == 3
        assert b.held_blocks(token_chain([1, 2, 3, 9, 5, 6], 2, 3), 3) == 1
        b.on_batch(1, [BlockRemoved(block_hashes=[b"y"], medium="GPU")])
        assert b.held_blocks(chain, 3) == 1
        b.on_batch(2, [AllBlocksCleared()])
        assert b.held_blocks(chain, 3) == 0
        assert b.precise
        assert len(b) == 0

    def test_a_gap_empties_the_set_and_leaves_precise_mode(self) -> None:
        """Missed batches may have removed blocks: the set is dropped, the endpoint
        falls back to guessing until a clear tells what the cache holds again."""
        b = blocks_from([stored([1], None, [1, 2])])
        b.on_batch(2, [stored([2], None, [3, 4])])  # batch 1 was missed
        assert not b.precise
        assert b.gaps == 1
        assert b.held_blocks(token_chain([1, 2, 0], 2, 1), 1) == 0
        b.on_batch(3, [AllBlocksCleared()])
        assert b.precise

    def test_joining_mid_stream_is_not_precise_until_known(self) -> None:
        """Joining mid stream is not precise until known."""
        b = blocks_from([stored([1], None, [1, 2])], seq=5)
        assert not b.precise
        b.on_batch(0, [])  # the publisher restarted: its engine's cache is empty
        assert b.precise

    def test_disconnected_is_not_precise_until_a_batch_confirms(self) -> None:
        """Down it guesses, and back up it still guesses until the next batch says whether
        the publisher restarted (sequence 0) or carried on (the next number)."""
        b = blocks_from([stored([1], None, [1, 2])])
        b.link(False)
        assert not b.precise
        b.link(True)
        assert not b.precise
        b.on_batch(1, [])
        assert b.precise
        assert len(b) == 1
        b.link(False)
        b.link(True)
        b.on_batch(0, [])  # the engine restarted while we were away
        assert b.precise
        assert len(b) == 0

    def test_orphans_and_lora_blocks_are_left_out(self) -> None:
        """A block whose parent is unknown, or hashed with a LoRA, is never believed."""
        lora = BlockStored(
            block_hashes=[3],
            parent_block_hash=None,
            token_ids=[1, 2],
            block_size=2,
            lora_id=1,
            medium=None,
        )
        b = blocks_from([stored([2], 99, [3, 4]), lora])
        assert len(b) == 0
        assert b.skipped_blocks == 2

    def test_bounded(self) -> None:
        """A batch over the block bound keeps nothing and leaves precise mode."""
        b = EngineBlocks(max_blocks=2)
        b.connected = True
        b.on_batch(0, [stored([1, 2, 3], None, [1, 2, 3, 4, 5, 6])])
        assert len(b) == 0
        assert not b.precise


def snap(eid: str, *, inflight: int = 0) -> Snapshot:
    return Snapshot.of(
        info=EndpointInfo(id=eid, url=f"http://{eid}", models=("m",)),
        stats=Stats(running=0, waiting=0, kv_usage=0.0, kv_capacity_tokens=160_000),
        drain_rate=0.0,
        inflight=inflight,
        running_capacity=8,
        stale=False,
        age_s=0.1,
        breaker=BreakerState.CLOSED,
        restarts=0,
    )


def body(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def engine_events(bdy: dict[str, Any], bs: int = 16) -> list[Any]:
    """The BlockStored a sim-engine publishes after computing this prompt."""
    kv = KVCache(num_gpu_blocks=1000, block_size=bs)
    kv.events = []
    ids = prompt_ids_for_body(bdy)
    assert kv.allocate("r", len(ids), prompt_block_hashes(ids, bs), token_ids=ids)
    return kv.events


class TestIndexAndPolicy:
    """The precise index and the policy that routes by it."""

    def index(self, *ids: str) -> KVEventIndex:
        idx = KVEventIndex()
        infos = [
            EndpointInfo(
                id=e, url=f"http://{e}", models=("m",), kv_events="tcp://x:1", tokenizer="sim"
            )
            for e in ids
        ]
        plain = EndpointInfo(id="g", url="http://g", models=("m",))
        assert idx.set_endpoints([*infos, plain]) == []
        for e in ids:
            idx.follows[e].blocks.connected = True
            idx.follows[e].blocks.on_batch(0, [])
        return idx

    @pytest.mark.parametrize(
        "bad",
        [
            {"model": "m", "messages": ["hi"]},
            {"model": "m", "messages": {"role": "user"}},
            {"model": "m", "messages": [{"role": "user", "content": "hi"}, 5]},
        ],
    )
    def test_a_malformed_chat_body_is_left_to_the_guess(self, bad: dict[str, Any]) -> None:
        """Messages that are not objects leave the endpoint to its guess: the tokenizer
        cannot say (the engine will refuse the request)."""
        # An AttributeError raised out of the policy made the router answer a bare 500.
        idx = self.index("a")
        assert idx.match(bad, ["a"]) == {}

    def test_match_counts_the_tokens_the_engine_holds(self) -> None:
        """Match counts the tokens the engine holds."""
        idx = self.index("a", "b")
        prompt = body("the shared system prompt " * 40)
        idx.follows["b"].blocks.on_batch(1, engine_events(prompt))
        tokens = len(prompt_ids_for_body(prompt))
        got = idx.match(prompt, ["a", "b"])
        assert got["a"] == (0, tokens)
        held, total = got["b"]
        assert total == tokens
        assert 0 < tokens - held <= 16
        assert idx.precise_among(["a", "b", "g"]) == ["a", "b"]

    def test_ours_goes_where_the_events_say_and_drops_stale_guesses(self) -> None:
        """The guessing index believes `a` holds the prompt (it was sent there); the
        events say `b` does: precise endpoints answer from their events."""
        idx = self.index("a", "b")
        prefix = PrefixIndex()
        ours = Ours(prefix, exact=idx)
        prompt = body("a long system prompt that engines cache " * 30)
        key = route_key(prompt, None)
        prefix.record("a", key.hashes, capacity_units=None)
        idx.follows["b"].blocks.on_batch(1, engine_events(prompt))
        d = ours.choose([snap("a"), snap("b")], key, ())
        assert (d.endpoint_id, d.reason) == ("b", "prefix")
        assert d.blocks_of("a") == 0
        assert d.blocks_of("b") > 0

    def test_fallback_to_the_guess_when_not_precise(self) -> None:
        """Fallback to the guess when not precise."""
        idx = self.index("a", "b")
        prefix = PrefixIndex()
        ours = Ours(prefix, exact=idx)
        prompt = body("another long system prompt " * 30)
        key = route_key(prompt, None)
        prefix.record("a", key.hashes, capacity_units=None)
        idx.follows["a"].blocks.connected = False  # subscription down
        idx.follows["b"].blocks.on_batch(5, [])  # a gap: b's set is unknown
        d = ours.choose([snap("a"), snap("b")], key, ())
        assert (d.endpoint_id, d.reason) == ("a", "prefix")

    def test_bad_tokenizer_is_reported_and_not_followed(self) -> None:
        """Bad tokenizer is reported and not followed."""
        idx = KVEventIndex()
        info = EndpointInfo(
            id="a", url="http://a", models=("m",), kv_events="tcp://x:1", tokenizer="bpe"
        )
        problems = idx.set_endpoints([info])
        assert len(problems) == 1
        assert "bpe" in problems[0]
        assert idx.follows == {}
        assert idx.set_endpoints([info]) == []  # said once, not on every list

    def test_metrics(self) -> None:
        """The prefix mode and event batches are exported per endpoint."""
        idx = self.index("a")
        names = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for m in idx.collect()
            for s in m.samples
        }
        assert names[("llmgw_router_prefix_mode", (("endpoint", "a"), ("mode", "precise")))] == 1
        assert names[("llmgw_router_prefix_mode", (("endpoint", "g"), ("mode", "guess")))] == 1
        assert names[("llmgw_router_kv_events_batches_total", (("endpoint", "a"),))] == 1


class TestTokenizers:
    """Tokenizer specs and loading a Hugging Face tokenizer file."""

    def test_specs(self) -> None:
        """`sim` is the sim-engine's tokenizer; anything else unknown, or an hf file that
        cannot be loaded (or no tokenizers package), is refused with a clear error."""
        assert load_tokenizer("sim").prompt_ids({"prompt": "abcdefgh"}) == [
            BOS,
            *tokenize("abcdefgh"),
        ]
        with pytest.raises(TokenizerSpecError, match="expected 'sim'"):
            load_tokenizer("nonsense")
        with pytest.raises(TokenizerSpecError):
            load_tokenizer("hf:/nonexistent/tokenizer.json")

    def test_hf_tokenizer_file(self, tmp_path: Path) -> None:
        """A tokenizer.json is loaded with `tokenizers`; completions prompts get its
        special tokens (as vLLM encodes them), chat requests are refused (no template),
        and the index leaves such an endpoint to the guess for them."""
        tokenizers = pytest.importorskip("tokenizers")
        vocab = {"<s>": 0, "[UNK]": 1, "hello": 2, "world": 3}
        tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 0)]
        )
        path = tmp_path / "tokenizer.json"
        tok.save(str(path))
        hf = load_tokenizer(f"hf:{path}")
        assert hf.prompt_ids({"prompt": "hello world hello"}) == [0, 2, 3, 2]
        assert hf.prompt_ids({"prompt": ["world"]}) == [0, 3]
        assert hf.prompt_ids({"prompt": [5, 6]}) == [5, 6]
        with pytest.raises(ValueError, match="chat"):
            hf.prompt_ids(body("hello"))
        idx = KVEventIndex()
        info = EndpointInfo(
            id="a", url="http://a", models=("m",), kv_events="tcp://x:1", tokenizer=f"hf:{path}"
        )
        assert idx.set_endpoints([info]) == []
        assert idx.match(body("hello"), ["a"]) == {}
        assert idx.match({"prompt": "hello"}, ["a"]) == {"a": (0, 2)}


class TestTokenizerSharing:
    """Endpoints naming one tokenizer share one load."""

    def test_endpoints_naming_one_tokenizer_share_one_load(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A model's replicas all name the same tokenizer: it is loaded once, and a later
        endpoint list (a new replica) reuses it instead of loading it again."""
        from llmgw.router.routing import kvevents

        loads: list[str] = []

        def counting(spec: str) -> Any:
            loads.append(spec)
            return load_tokenizer(spec)

        monkeypatch.setattr(kvevents, "load_tokenizer", counting)

        def info(eid: str) -> EndpointInfo:
            return EndpointInfo(
                id=eid,
                url=f"http://{eid}",
                models=("m",),
                kv_events=f"tcp://{eid}:1",
                tokenizer="sim",
            )

        idx = KVEventIndex()
        assert idx.set_endpoints([info("a"), info("b")]) == []
        assert idx.follows["a"].tokenizer is idx.follows["b"].tokenizer
        assert idx.set_endpoints([info("a"), info("b"), info("c")]) == []
        assert idx.follows["c"].tokenizer is idx.follows["a"].tokenizer
        assert loads == ["sim"]
