"""Precise mode: each engine's prefix cache as its KV events tell it (docs/routing.md).

Where an endpoint names its engine's KV-event publisher (`EndpointInfo.kv_events`,
vLLM's ZMQ publisher or the sim-engine's, wire/kvevents.py), the router does not
have to guess what the engine holds: `kvfollow.py` subscribes, and `EngineBlocks`
applies every batch to an exact set of the engine's cached blocks.

Hashes. The engine's block hashes depend on its hash seed and algorithm, which
the router cannot know; `BlockStored` carries each block's token ids, so the
router hashes them into its own chain (`hash((parent, tokens))`, parent of a
prompt's first block `ROOT`) and keeps engine hash → router hash for the
removals. A request's prompt is tokenized with the endpoint's tokenizer
(`EndpointInfo.tokenizer`, llmgw.tokenization) and hashed the same way, so its
leading run of blocks in the set is exactly what the engine's own lookup
would find (capped, as the engine's, so at least one token is computed).

Freshness. An endpoint is in precise mode only while its subscription is
connected (and, after a reconnect, a batch has confirmed that nothing was missed)
and its set is known to be complete ("synced"): the subscriber saw
the publisher's first batch (sequence 0: the engine started empty), or an
`AllBlocksCleared` (the engine's cache was reset: empty again). A sequence gap
(messages dropped, a reconnect that missed some, a payload that did not
decode) or joining a publisher mid-stream leaves the set incomplete: it is
emptied, and the endpoint is routed by the guessing index (prefix.py) until
the set is known again, or — where the engine has a replay socket
(`EndpointInfo.kv_events_replay`) — the missed batches are fetched and applied.
Blocks whose parent the set does not know (stored before a gap), LoRA blocks
and blocks hashed with extra keys (multimodal inputs, cache salt) are left out:
the set errs towards holding less, never more.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.tokenization import PromptTokenizer, TokenizerSpecError, load_tokenizer
from llmgw.wire.kvevents import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KVEvent

ROOT = hash("llmgw-kv-events-root")
# Engine blocks one endpoint's set may hold; past it the set is dropped (fallback).
# 4M blocks of 16 tokens is 64M tokens, beyond any one engine's cache today.
MAX_BLOCKS = 4_000_000
GPU_MEDIA = (None, "GPU", "gpu")


def token_chain(token_ids: Sequence[int], block_size: int, limit: int) -> list[int]:
    """The router's hashes of the first `limit` full blocks of `token_ids`."""
    out: list[int] = []
    parent = ROOT
    for i in range(min(limit, len(token_ids) // block_size)):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        out.append(parent)
    return out


class EngineBlocks:
    """One endpoint's cached blocks, from its events; see the module docstring."""

    def __init__(self, *, max_blocks: int = MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self.block_size: int | None = None
        self._router_of: dict[BlockHash, int] = {}  # engine hash → router hash
        self._held: dict[int, int] = {}  # router hash → engine blocks with it
        self.next_seq: int | None = None  # None: no batch seen yet
        self.synced = False
        self.connected = False
        # False from a disconnect until the next batch: a publisher that restarted
        # while we were away (its engine's cache empty) says so only with its next
        # batch (sequence 0), so until then the set may claim what is gone.
        self.confirmed = True
        self.batches = 0
        self.gaps = 0
        self.skipped_blocks = 0

    @property
    def precise(self) -> bool:
        return self.connected and self.synced and self.confirmed

    def link(self, up: bool) -> None:
        """The subscription connected (True) or dropped (False)."""
        if not up:
            self.confirmed = False
        self.connected = up

    def __len__(self) -> int:
        return len(self._router_of)

    def clear(self) -> None:
        self._router_of.clear()
        self._held.clear()

    def lost(self) -> None:
        """Events were missed (or could not be read): the set is no longer complete."""
        self.gaps += 1
        self.synced = False
        self.clear()

    def on_batch(self, seq: int, events: Iterable[KVEvent]) -> None:
        """Apply one publisher message (its sequence number and events)."""
        expected = self.next_seq
        if seq != expected:
            if seq == 0:
                # A publisher's first batch: the engine (re)started with an empty cache.
                self.clear()
                self.synced = True
            elif expected is None:
                self.synced = False  # joined mid-stream: what came before is unknown
                self.clear()
            else:
                self.lost()
        self.next_seq = seq + 1
        self.confirmed = True  # in order, or the gap handled above
        self.batches += 1
        for ev in events:
            self.apply(ev)

    def apply(self, ev: KVEvent) -> None:
        if isinstance(ev, BlockStored):
            self._stored(ev)
        elif isinstance(ev, BlockRemoved):
            router_of, held = self._router_of, self._held
            for h in ev.block_hashes:
                r = router_of.pop(h, None)
                if r is not None:
                    n = held[r] - 1
                    if n:
                        held[r] = n
                    else:
                        del held[r]
        elif isinstance(ev, AllBlocksCleared):
            self.clear()
            self.synced = True  # empty, and known to be

    def _stored(self, ev: BlockStored) -> None:
        bs = ev.block_size
        n = len(ev.block_hashes)
        if (
            ev.lora_id is not None
            or ev.medium not in GPU_MEDIA
            or bs < 1
            or len(ev.token_ids) != n * bs
        ):
            self.skipped_blocks += n
            return
        if self.block_size != bs:
            if self.block_size is not None:
                self.clear()  # a new block size: the old chains match nothing now
            self.block_size = bs
        parent_hash = ev.parent_block_hash
        parent = ROOT if parent_hash is None else self._router_of.get(parent_hash)
        if parent is None:
            self.skipped_blocks += n  # its parent was stored before a gap
            return
        router_of, held, tokens = self._router_of, self._held, ev.token_ids
        for i, h in enumerate(ev.block_hashes):
            parent = hash((parent, tuple(tokens[i * bs : (i + 1) * bs])))
            if h in router_of:
                continue
            router_of[h] = parent
            held[parent] = held.get(parent, 0) + 1
        if len(router_of) > self.max_blocks:
            self.lost()

    def held_blocks(self, chain: Sequence[int], limit: int) -> int:
        """How many leading blocks of `chain` (at most `limit`) the engine holds."""
        held = self._held
        n = 0
        for r in chain[:limit]:
            if r not in held:
                break
            n += 1
        return n


class Follow:
    """What the router follows for one endpoint: its address, tokenizer and set."""

    def __init__(self, address: str, topic: str, replay: str, tokenizer: PromptTokenizer) -> None:
        self.address = address
        self.topic = topic
        self.replay = replay
        self.tokenizer = tokenizer
        self.blocks = EngineBlocks()

    def same(self, address: str, topic: str, replay: str, tokenizer: str) -> bool:
        return (self.address, self.topic, self.replay, self.tokenizer.spec) == (
            address,
            topic,
            replay,
            tokenizer,
        )


class KVEventIndex(Collector):
    """Every followed endpoint's set, the prefix matches they give, and their metrics."""

    def __init__(self) -> None:
        self.follows: dict[str, Follow] = {}
        self.all_ids: tuple[str, ...] = ()
        # Bumped when the followed set changes, so kvfollow restarts its subscriptions.
        self.version = 0
        # Problems already reported: a controller resends its list on every change.
        self._reported: set[str] = set()

    def set_endpoints(self, infos: Iterable[Any]) -> list[str]:
        """Follow the endpoints that name a publisher; returns problems (bad tokenizers)
        not returned before."""
        problems: list[str] = []
        keep: dict[str, Follow] = {}
        ids: list[str] = []
        # One tokenizer per spec, shared by the endpoints naming it: loading an hf
        # tokenizer.json takes tens of milliseconds on the event loop, and a model's
        # replicas all name the same one (each new replica used to load it again).
        loaded = {f.tokenizer.spec: f.tokenizer for f in self.follows.values()}
        for info in infos:
            ids.append(info.id)
            if not info.kv_events:
                continue
            old = self.follows.get(info.id)
            if old is not None and old.same(
                info.kv_events, info.kv_events_topic, info.kv_events_replay, info.tokenizer
            ):
                keep[info.id] = old
                continue
            tok = loaded.get(info.tokenizer)
            if tok is None:
                try:
                    tok = loaded[info.tokenizer] = load_tokenizer(info.tokenizer)
                except TokenizerSpecError as exc:
                    problems.append(f"{info.id}: {exc}")
                    continue
            keep[info.id] = Follow(info.kv_events, info.kv_events_topic, info.kv_events_replay, tok)
        if keep.keys() != self.follows.keys() or any(keep[k] is not self.follows[k] for k in keep):
            self.version += 1
        self.follows = keep
        self.all_ids = tuple(ids)
        new = [p for p in problems if p not in self._reported]
        self._reported = set(problems)
        return new

    def engine_restarted(self, endpoint_id: str) -> None:
        """The scrape saw the engine restart: whatever the set held is gone."""
        f = self.follows.get(endpoint_id)
        if f is not None:
            f.blocks.clear()

    def precise_among(self, ids: Iterable[str]) -> list[str]:
        follows = self.follows
        if not follows:
            return []
        return [e for e in ids if (f := follows.get(e)) is not None and f.blocks.precise]

    def match(self, body: Mapping[str, Any], ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """Endpoint id → (prompt tokens it holds, prompt tokens) for precise `ids`.

        Endpoints whose tokenizer cannot tokenize the request are left out (the
        guessing index answers for them).
        """
        out: dict[str, tuple[int, int]] = {}
        tokens: dict[str, list[int] | None] = {}
        chains: dict[tuple[str, int], list[int]] = {}
        for eid in ids:
            f = self.follows[eid]
            spec = f.tokenizer.spec
            if spec not in tokens:
                try:
                    tokens[spec] = f.tokenizer.prompt_ids(body)
                except (ValueError, TypeError, RecursionError):
                    tokens[spec] = None
            ids_ = tokens[spec]
            if ids_ is None:
                continue
            bs = f.blocks.block_size
            if bs is None:  # nothing stored since it was synced: it holds nothing
                out[eid] = (0, len(ids_))
                continue
            # The engine's lookup leaves at least the last prompt token to compute.
            limit = max(0, (len(ids_) - 1) // bs)
            chain = chains.get((spec, bs))
            if chain is None:
                chain = chains[(spec, bs)] = token_chain(ids_, bs, limit)
            out[eid] = (f.blocks.held_blocks(chain, limit) * bs, len(ids_))
        return out

    def collect(self) -> Iterator[Metric]:
        mode = GaugeMetricFamily(
            "llmgw_router_prefix_mode",
            "1 for how the router knows what each endpoint's KV cache holds: precise (its KV "
            "events) or guess (what was sent there).",
            labels=["endpoint", "mode"],
        )
        connected = GaugeMetricFamily(
            "llmgw_router_kv_events_connected",
            "1 while the subscription to the endpoint's KV-event publisher is connected.",
            labels=["endpoint"],
        )
        blocks = GaugeMetricFamily(
            "llmgw_router_kv_events_blocks",
            "Engine KV blocks the router knows the endpoint holds, from its events.",
            labels=["endpoint"],
        )
        batches = CounterMetricFamily(
            "llmgw_router_kv_events_batches",
            "KV-event batches applied, per endpoint.",
            labels=["endpoint"],
        )
        gaps = CounterMetricFamily(
            "llmgw_router_kv_events_gaps",
            "Times events were missed (a sequence gap or an unreadable batch), per endpoint.",
            labels=["endpoint"],
        )
        for eid in self.all_ids:
            f = self.follows.get(eid)
            precise = f is not None and f.blocks.precise
            mode.add_metric([eid, "precise"], 1.0 if precise else 0.0)
            mode.add_metric([eid, "guess"], 0.0 if precise else 1.0)
            if f is None:
                continue
            b = f.blocks
            connected.add_metric([eid], 1.0 if b.connected else 0.0)
            blocks.add_metric([eid], float(len(b)))
            batches.add_metric([eid], float(b.batches))
            gaps.add_metric([eid], float(b.gaps))
        yield from (mode, connected, blocks, batches, gaps)
