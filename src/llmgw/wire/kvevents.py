"""vLLM's KV-cache events on the wire: what engines publish, what the router follows.

vLLM (`--kv-events-config`, publisher `zmq`) publishes from a ZeroMQ PUB socket
one multipart message per engine step with cache changes:

    [topic, seq, payload]

- `topic`: bytes, the configured topic (vLLM's default is empty);
- `seq`: the batch's sequence number, 8 bytes big-endian, 0 for the publisher's
  first batch and one more for each next, so a subscriber sees a gap;
- `payload`: msgpack of a `KVEventBatch` (`ts`, `events`), each event tagged
  with its class name: `BlockStored` (blocks entered the prefix cache: their
  hashes, the hash of the block before the first one or nil, the token ids of
  all of them, the block size, the LoRA id), `BlockRemoved` (hashes evicted)
  and `AllBlocksCleared` (the prefix cache was reset).

vLLM has used two msgpack layouts of the same structs: arrays (`array_like`,
`[tag, field, ...]`, the batch `[ts, events]`) and, in later releases, maps
(`{"type": tag, field: value}`). The sim-engine publishes arrays;
`decode_batch` reads both and ignores fields it does not know, so a newer
engine that appends fields still decodes. Block hashes are opaque keys: bytes
(newer vLLM, the sim-engine) or integers (older vLLM).
"""

from __future__ import annotations

from typing import Any

import msgspec

BlockHash = bytes | int


class KVEventsDecodeError(ValueError):
    """A payload that is not a KV event batch in either of vLLM's layouts."""


class KVCacheEvent(
    msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True, frozen=True
):
    """One change to an engine's prefix cache (the class name is the msgpack tag)."""


class BlockStored(KVCacheEvent, frozen=True):
    # The stored blocks' hashes, in chain order.
    block_hashes: list[BlockHash]
    # The hash of the block before block_hashes[0]; None: the first is a prompt's first block.
    parent_block_hash: BlockHash | None
    # The tokens of all the stored blocks (len(block_hashes) × block_size).
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    # Where the blocks are ("GPU", or an offload tier); None: the engine's GPU cache.
    medium: str | None


class BlockRemoved(KVCacheEvent, frozen=True):
    block_hashes: list[BlockHash]
    medium: str | None


class AllBlocksCleared(KVCacheEvent, frozen=True):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, frozen=True):
    """One publisher message's payload: the events of one engine step, in order."""

    ts: float
    events: list[KVEvent]


_encoder = msgspec.msgpack.Encoder()
_raw = msgspec.msgpack.Decoder()
SEQ_BYTES = 8


def encode_batch(batch: KVEventBatch) -> bytes:
    """The payload frame of a batch, in the array layout (as vLLM's array_like structs)."""
    return _encoder.encode(batch)


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big")


def decode_seq(frame: bytes) -> int:
    """A sequence frame; KVEventsDecodeError unless it is 8 bytes."""
    if len(frame) != SEQ_BYTES:
        raise KVEventsDecodeError(f"sequence frame of {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)


def decode_batch(payload: bytes) -> tuple[float, list[KVEvent]]:
    """(ts, events) of a payload in either layout; events of unknown kinds are left out."""
    try:
        doc = _raw.decode(payload)
    except msgspec.DecodeError as exc:
        raise KVEventsDecodeError(f"not msgpack: {exc}") from exc
    except RecursionError:
        # msgspec's decoder stops at the interpreter's recursion limit (about a
        # thousand levels; a batch has four): a publisher's nesting, refused here,
        # not a traceback out of the subscription.
        raise KVEventsDecodeError("nested too deeply") from None
    if isinstance(doc, list) and len(doc) >= 2:
        ts, events = doc[0], doc[1]
    elif isinstance(doc, dict):
        ts, events = doc.get("ts"), doc.get("events")
    else:
        raise KVEventsDecodeError("a batch is [ts, events] or {ts, events}")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not isinstance(events, list):
        raise KVEventsDecodeError("a batch needs a numeric ts and a list of events")
    out: list[KVEvent] = []
    for ev in events:
        got = _event(ev)
        if got is not None:
            out.append(got)
    return float(ts), out


_FIELDS: dict[str, tuple[type[KVCacheEvent], tuple[str, ...]]] = {
    "BlockStored": (BlockStored, BlockStored.__struct_fields__),
    "BlockRemoved": (BlockRemoved, BlockRemoved.__struct_fields__),
    "AllBlocksCleared": (AllBlocksCleared, ()),
}


def _event(ev: Any) -> KVEvent | None:
    if isinstance(ev, list) and ev:
        tag, values = ev[0], ev[1:]
        kind = _FIELDS.get(tag) if isinstance(tag, str) else None
        if kind is None:
            return None
        fields = dict(zip(kind[1], values, strict=False))
    elif isinstance(ev, dict):
        tag = ev.get("type")
        kind = _FIELDS.get(tag) if isinstance(tag, str) else None
        if kind is None:
            return None
        extra = ev.get("extra_keys") or ()
        if not isinstance(extra, list | tuple):
            raise KVEventsDecodeError(f"{tag}: extra_keys is not a list")
        if tag == "BlockStored" and (
            ev.get("lora_name") is not None or any(k is not None for k in extra)
        ):
            # Hashed with more than the tokens (LoRA, multimodal inputs, cache salt):
            # token ids alone cannot say which prompts match. Left out, like an unknown kind.
            return None
        fields = {f: ev[f] for f in kind[1] if f in ev}
    else:
        raise KVEventsDecodeError("an event is [tag, ...] or {type: tag, ...}")
    cls, names = kind
    # Fields a publisher may leave out (older releases had no `medium`) read as None.
    for f in ("lora_id", "medium"):
        if f in names:
            fields.setdefault(f, None)
    missing = [f for f in names if f not in fields]
    if missing:
        raise KVEventsDecodeError(f"{tag}: missing {', '.join(missing)}")
    try:
        got = msgspec.convert([tag, *(fields[f] for f in names)], cls)
    except msgspec.ValidationError as exc:
        raise KVEventsDecodeError(f"{tag}: {exc}") from exc
    except RecursionError:
        raise KVEventsDecodeError(f"{tag}: nested too deeply") from None
    assert isinstance(got, BlockStored | BlockRemoved | AllBlocksCleared)
    return got
