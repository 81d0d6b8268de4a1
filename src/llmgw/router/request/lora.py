"""LoRA adapters on llama.cpp replicas: what a request for one carries, and its answer's name.

vLLM and the sim-engine take an adapter's name as the request's model and answer
with it: nothing to do. llama-server loads its adapters at start (the agent's
`--lora-scaled FILE:0,...`, applied to no request by default) and selects one per
request by position: `"lora": [{"id": i, "scale": 1.0}]` (the adapters the list
leaves out get scale 0). It answers with its own name whatever the request named,
so for an adapter the router writes the adapter's name back into the answer's
`model`, in every event of a stream. The endpoint list says which replicas need
this and the positions (`EndpointInfo.lora_ids`).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_MODEL = re.compile(rb'"model":"(?:[^"\\]|\\.)*"')
_OPEN = b'"model":"'


def positions(names: tuple[str, ...]) -> dict[str, int]:
    """Adapter → the id llama-server knows it by (its position in `lora_ids`)."""
    return {name: i for i, name in enumerate(names)}


def select(body: bytes, lora_id: int) -> bytes:
    """The request body with llama-server's per-request adapter selection added.

    The body was decoded once already (intake), so it is a JSON object here.
    """
    doc: dict[str, Any] = _decoder.decode(body)
    doc["lora"] = [{"id": lora_id, "scale": 1.0}]
    return _encoder.encode(doc)


class Rename:
    """Writes `name` as the `model` of every JSON object in an answer, across chunks.

    llama-server writes compact JSON (`"model":"x"`); a chunk that ends inside one
    (or inside its opening) is held back until the rest comes, so a split never
    leaves the engine's name in the answer.
    """

    __slots__ = ("_held", "_value")

    def __init__(self, name: str) -> None:
        self._value = b'"model":' + _encoder.encode(name)
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        self._held = b""
        cut = _unfinished(data)
        if cut is not None:
            data, self._held = data[:cut], data[cut:]
        return _MODEL.sub(self._value.replace(b"\\", b"\\\\"), data)

    def flush(self) -> bytes:
        """What is still held when the answer ends (an unfinished field: as it is)."""
        out, self._held = self._held, b""
        return out


def _unfinished(data: bytes) -> int | None:
    """Where a `"model":"…"` field that the chunk does not finish begins; None if none."""
    i = data.rfind(_OPEN)
    done = 0
    if i >= 0:
        m = _MODEL.match(data, i)
        if m is None:
            return i
        done = m.end()
    # The chunk may end with the field's opening cut short (never inside a finished one).
    for k in range(len(_OPEN) - 1, 0, -1):
        if len(data) - k >= done and data.endswith(_OPEN[:k]):
            return len(data) - k
    return None
