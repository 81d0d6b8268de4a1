"""The sim-engine's KV-event publisher, as vLLM's `ZmqEventPublisher` (wire/kvevents.py).

Enabled with vLLM's own flag, `--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557"}'`, so one engine template
serves both. After each scheduler step (and after a prefix-cache reset) the
events the KV cache recorded go out as one `[topic, seq, payload]` message on a
PUB socket; the last `buffer_steps` messages are kept for replay: a ROUTER
socket at `replay_endpoint` answers a request `[b"", start_seq (8 bytes
big-endian)]` with every kept `[b"", seq, payload]` from start_seq on, then
`[b"", -1, b""]`, as vLLM does.

One difference: vLLM binds an endpoint with a wildcard host and connects to
any other (a proxy); the sim-engine always binds, so a test can use a loopback
address.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import msgspec

from llmgw.simengine.kvcache import KVCache
from llmgw.wire.kvevents import KVEventBatch, encode_batch, encode_seq

if TYPE_CHECKING:
    import zmq
    import zmq.asyncio

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KVEventsSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """The fields of vLLM's KVEventsConfig the sim-engine reads; others are ignored."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


def parse_settings(text: str) -> KVEventsSettings:
    """`--kv-events-config` JSON; ValueError naming what is wrong."""
    try:
        s = msgspec.json.decode(text, type=KVEventsSettings)
    except msgspec.DecodeError as exc:
        raise ValueError(f"--kv-events-config: {exc}") from exc
    if s.publisher not in ("zmq", "null"):
        raise ValueError(f"--kv-events-config: publisher {s.publisher!r}: expected zmq or null")
    if s.buffer_steps < 1 or s.hwm < 0:
        raise ValueError("--kv-events-config: need buffer_steps >= 1 and hwm >= 0")
    return s


class KVEventPublisher:
    """Sends the KV cache's recorded events, one batch per flush."""

    def __init__(self, settings: KVEventsSettings, kv: KVCache) -> None:
        try:
            import zmq
            import zmq.asyncio
        except ImportError as exc:
            raise ValueError(
                "--kv-events-config needs pyzmq (pip install 'llmgw[kv-events]')"
            ) from exc
        self._zmq = zmq
        self.settings = settings
        self.kv = kv
        kv.events = []
        # A plain socket for PUB (send never waits: NOBLOCK drops at the high-water
        # mark), an asyncio one for the replay ROUTER (served by a task).
        self._ctx = zmq.Context()
        self._actx: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket[bytes] = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(settings.hwm)
        self._replay: zmq.asyncio.Socket | None = None
        try:
            self._pub.bind(settings.endpoint)
            if settings.replay_endpoint:
                self._actx = zmq.asyncio.Context()
                self._replay = self._actx.socket(zmq.ROUTER)
                self._replay.bind(settings.replay_endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise ValueError(f"--kv-events-config: cannot bind: {exc}") from exc
        self._topic = settings.topic.encode()
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=settings.buffer_steps)
        self.sent = 0
        self.dropped = 0

    def flush(self) -> None:
        """Publish what the cache recorded since the last flush, as one batch."""
        events = self.kv.events
        if not events:
            return
        self.kv.events = []
        payload = encode_batch(KVEventBatch(ts=time.time(), events=events))
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        try:
            # A PUB socket never blocks: past the high-water mark it drops, and the
            # subscriber sees the gap in the sequence numbers.
            self._pub.send_multipart(
                (self._topic, encode_seq(seq), payload), flags=self._zmq.NOBLOCK
            )
            self.sent += 1
        except self._zmq.ZMQError:
            self.dropped += 1

    async def serve_replay(self) -> None:
        """Answer replay requests until cancelled (nothing to do without a replay socket)."""
        sock = self._replay
        if sock is None:
            return
        while True:
            frames: list[Any] = await sock.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("ignoring a malformed KV-event replay request")
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await sock.send_multipart((client, b"", encode_seq(seq), payload))
            await sock.send_multipart((client, b"", END_SEQ, b""))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pub.close(linger=0)
        if self._replay is not None:
            with contextlib.suppress(Exception):
                self._replay.close(linger=0)
        if self._actx is not None:
            self._actx.term()
        self._ctx.term()
