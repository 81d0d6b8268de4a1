"""Subscriptions to the engines' KV-event publishers (precise mode, kvevents.py).

One task per followed endpoint: a ZeroMQ SUB socket connected to its
`kv_events` address, filtered on its topic, feeding `EngineBlocks.on_batch`,
and a monitor of that socket, so the endpoint leaves precise mode the moment
the connection drops (ZeroMQ reconnects on its own; the sequence numbers then
tell whether anything was missed). With a replay address, a gap is filled by
asking the publisher for the batches from the missed one on (vLLM's replay
protocol, wire/kvevents.py), and so is joining mid-stream (from batch 0, which
the publisher still has if it has sent fewer than its buffer); the set is
precise again only if the replay covers exactly what was missed.

pyzmq is imported only when an endpoint is followed: a router without it
starts, logs that precise mode is unavailable, and guesses.

A publisher is not trusted (docs/hardening.md): a frame larger than
`MAX_MESSAGE_BYTES` makes ZeroMQ drop the connection before it is read whole
(the sequence numbers then show the gap), at most `RECEIVE_QUEUE` messages wait
unread, a payload nested past the decoder's depth is an unreadable batch, and a
replay holds at most `MAX_REPLAY_BATCHES` batches and `MAX_REPLAY_BYTES` bytes
for at most `REPLAY_DEADLINE_S`. Each costs a log line (at most one per
`LOG_EVERY_S` per endpoint and kind) and precise mode until the set is whole
again, never a traceback or memory without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Final

from llmgw.router.routing.kvevents import EngineBlocks, Follow, KVEventIndex
from llmgw.runtime.logs import kv
from llmgw.wire.kvevents import KVEventsDecodeError, decode_batch, decode_seq, encode_seq

log = logging.getLogger(__name__)

RECONCILE_S = 1.0
# The most a replay socket may be silent between two messages.
REPLAY_TIMEOUT_S = 2.0
# The most one replay may take in all: a publisher that sends, but never the
# batches asked for nor its end marker, would hold the subscription for ever.
REPLAY_DEADLINE_S = 10.0
# One frame from a publisher, at most. vLLM's batch for one engine step carries
# the token ids of the blocks it stored: under a megabyte for a 128k-token
# prefill. A larger frame makes ZeroMQ drop the connection (ZMQ_MAXMSGSIZE)
# before holding it, where one 100 MB frame used to cost the router twice that.
MAX_MESSAGE_BYTES: Final = 8 * 1024 * 1024
# Messages ZeroMQ keeps unread for the subscriber (ZMQ_RCVHWM; its default is
# 1000): past it new ones are dropped, a gap like any other.
RECEIVE_QUEUE: Final = 100
# What one replay may hold before it is applied: vLLM keeps 10,000 steps by
# default; bytes bound what a replay socket that never ends its answer can make
# the router keep.
MAX_REPLAY_BATCHES: Final = 10_000
MAX_REPLAY_BYTES: Final = 64 * 1024 * 1024
# A connection down this long is dialled again. ZeroMQ redials by itself after a
# connection error, but not after a protocol error (a frame past MAX_MESSAGE_BYTES):
# that subscription would stay down, silently, for good.
REDIAL_S: Final = 2.0
# A publisher's bad messages are said at most this often, per endpoint and kind.
LOG_EVERY_S: Final = 10.0


class KVEventFollower:
    """Keeps one subscription task per endpoint the index follows."""

    def __init__(self, index: KVEventIndex) -> None:
        self.index = index
        self._tasks: dict[str, tuple[Follow, asyncio.Task[None]]] = {}
        self._zmq: Any = None
        self._ctx: Any = None
        self._warned = False
        # (endpoint, what) → (when last said, times since not said): `_warn`.
        self._said: dict[tuple[str, str], tuple[float, int]] = {}

    def _warn(self, eid: str, what: str, **fields: Any) -> None:
        """One warning line per `LOG_EVERY_S` per endpoint and kind: a publisher that
        sends bad messages as fast as it can costs a line now and then, not a flood."""
        now = time.monotonic()
        key = (eid, what)
        last, quiet = self._said.get(key, (-LOG_EVERY_S, 0))
        if now - last < LOG_EVERY_S:
            self._said[key] = (last, quiet + 1)
            return
        if len(self._said) > 1024:
            self._said.clear()
        self._said[key] = (now, 0)
        if quiet:
            fields["not_logged_since"] = quiet
        log.warning(kv(what, endpoint=eid, **fields))

    async def run(self) -> None:
        """Reconcile the subscriptions with the index's endpoints until cancelled."""
        seen = -1
        try:
            while True:
                if self.index.version != seen or any(_crashed(t) for _, t in self._tasks.values()):
                    seen = self.index.version
                    self._reconcile()
                await asyncio.sleep(RECONCILE_S)
        finally:
            for _, task in self._tasks.values():
                task.cancel()
            for _, task in self._tasks.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._tasks.clear()
            if self._ctx is not None:
                self._ctx.term()

    def _reconcile(self) -> None:
        want = self.index.follows
        for eid in list(self._tasks):
            follow, task = self._tasks[eid]
            if want.get(eid) is not follow:
                task.cancel()
                del self._tasks[eid]
            elif _crashed(task):
                # Started again (below), at most once a RECONCILE_S; whatever it was
                # applying may be half done, so the set starts over as after a gap.
                follow.blocks.lost()
                del self._tasks[eid]
        if not want or not self._load_zmq():
            return
        for eid, follow in want.items():
            if eid not in self._tasks:
                task = asyncio.create_task(self._follow(eid, follow), name=f"kv-events-{eid}")
                task.add_done_callback(_log_crash)
                self._tasks[eid] = (follow, task)

    def _load_zmq(self) -> bool:
        if self._zmq is not None:
            return True
        try:
            import zmq
            import zmq.asyncio
        except ImportError:
            if not self._warned:
                self._warned = True
                log.error(
                    "endpoints name kv_events but pyzmq is not installed "
                    "(pip install 'llmgw[kv-events]'): routing by guessing"
                )
            return False
        self._zmq = zmq
        self._ctx = zmq.asyncio.Context()
        return True

    async def _follow(self, eid: str, follow: Follow) -> None:
        zmq = self._zmq
        blocks = follow.blocks
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sub.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        sub.setsockopt(zmq.SUBSCRIBE, follow.topic.encode())
        mon = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(mon, zmq.POLLIN)
        try:
            sub.connect(follow.address)
        except zmq.ZMQError as exc:
            log.error(kv("kv events: cannot connect", endpoint=eid, error=str(exc)))
            sub.close(linger=0)
            mon.close(linger=0)
            return
        log.info(kv("following kv events", endpoint=eid, address=follow.address))
        # When the connection went (or the dial began); None while it is up.
        down_since: float | None = time.monotonic()
        dropped = False  # it was up, and went down: a publisher that may be misbehaving
        try:
            while True:
                ready = dict(await poller.poll(int(REDIAL_S * 1000)))
                if mon in ready:
                    self._on_monitor(eid, blocks, await mon.recv_multipart())
                    if blocks.connected:
                        down_since = None
                    elif down_since is None:
                        down_since = time.monotonic()
                        dropped = True
                if down_since is not None and time.monotonic() - down_since >= REDIAL_S:
                    if dropped:
                        self._warn(
                            eid,
                            "kv events: dialling again",
                            why="the connection dropped: the publisher went away, or sent "
                            f"a frame over {MAX_MESSAGE_BYTES} bytes",
                        )
                    with contextlib.suppress(zmq.ZMQError):
                        sub.disconnect(follow.address)
                    sub.connect(follow.address)
                    down_since = time.monotonic()
                if sub in ready:
                    frames = await sub.recv_multipart()
                    await self._on_message(eid, follow, frames)
        finally:
            blocks.link(False)
            with contextlib.suppress(Exception):
                sub.disable_monitor()
            mon.close(linger=0)
            sub.close(linger=0)

    def _on_monitor(self, eid: str, blocks: EngineBlocks, frames: list[bytes]) -> None:
        from zmq.utils.monitor import parse_monitor_message

        event = parse_monitor_message(frames)["event"]
        up = event == self._zmq.EVENT_HANDSHAKE_SUCCEEDED
        if up != blocks.connected:
            log.info(kv("kv events " + ("connected" if up else "disconnected"), endpoint=eid))
        blocks.link(up)

    async def _on_message(self, eid: str, follow: Follow, frames: list[bytes]) -> None:
        blocks = follow.blocks
        seq: int | None = None
        try:
            if len(frames) != 3:
                raise KVEventsDecodeError(f"{len(frames)} frames, expected 3")
            number = decode_seq(frames[1])
            if number < 0:
                # -1 only ends a replay; nothing to count from.
                raise KVEventsDecodeError(f"sequence number {number}")
            seq = number
            _, events = decode_batch(frames[2])
        except KVEventsDecodeError as exc:
            self._warn(eid, "kv events: unreadable batch", error=str(exc))
            blocks.lost()
            if seq is not None:
                # Counted once: the next batch is not another gap, and asking the
                # replay socket for this one would only fetch the same bytes.
                blocks.next_seq = seq + 1
            return
        expected = blocks.next_seq
        # Missed batches (a gap, or joining mid-stream: from the publisher's first)
        # come from the replay socket where there is one; the publisher keeps its
        # last buffer_steps batches, so a long-running engine's history may be gone.
        # A number below the expected one is a publisher that restarted (its engine
        # too) and whose first batches went out before we reconnected: its history
        # from 0 as well.
        first = 0 if expected is None or seq < expected else expected
        if follow.replay and seq > first:
            await self._replay(eid, follow, first, seq)
        blocks.on_batch(seq, events)

    async def _replay(self, eid: str, follow: Follow, first: int, upto: int) -> bool:
        """Fetch and apply batches first..upto-1 from the replay socket; True if all came."""
        zmq = self._zmq
        blocks = follow.blocks
        if upto - first > MAX_REPLAY_BATCHES:
            # More than any publisher keeps (or a sequence number far ahead): not asked.
            self._warn(eid, "kv events: replay failed", error=f"{upto - first} batches missed")
            return False
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        got: list[tuple[int, bytes]] = []
        size = 0
        deadline = time.monotonic() + REPLAY_DEADLINE_S
        try:
            sock.connect(follow.replay)
            await sock.send_multipart((b"", encode_seq(first)))
            while True:
                left = min(REPLAY_TIMEOUT_S, deadline - time.monotonic())
                if left <= 0:
                    raise TimeoutError(f"not done within {REPLAY_DEADLINE_S:g}s")
                if not await sock.poll(int(left * 1000) + 1):
                    raise TimeoutError("no answer")
                frames = await sock.recv_multipart()
                if len(frames) != 3:
                    raise KVEventsDecodeError(f"replay: {len(frames)} frames, expected 3")
                seq = decode_seq(frames[1])
                if seq < 0:
                    break
                if seq >= upto:
                    if len(got) == upto - first:
                        # All that was missed is here; the rest of the publisher's
                        # history arrives live anyway. Stop reading (every worker of
                        # every router joining at once would otherwise be sent, and
                        # hold, up to the publisher's whole buffer).
                        break
                    continue
                if seq != first + len(got):
                    # The publisher no longer has what was missed (its buffer moved on)
                    # or skipped a number: nothing after this can fill the gap.
                    raise KVEventsDecodeError("replay did not cover the gap")
                size += len(frames[2])
                if size > MAX_REPLAY_BYTES:
                    raise KVEventsDecodeError(f"replay larger than {MAX_REPLAY_BYTES} bytes")
                got.append((seq, frames[2]))
            # Compared without listing first..upto: a sequence frame far ahead (a buggy
            # publisher) would otherwise allocate one int per missed number.
            if len(got) != upto - first or any(s != first + i for i, (s, _) in enumerate(got)):
                raise KVEventsDecodeError("replay did not cover the gap")
            for seq, payload in got:
                blocks.on_batch(seq, decode_batch(payload)[1])
        except (TimeoutError, KVEventsDecodeError, zmq.ZMQError) as exc:
            self._warn(eid, "kv events: replay failed", error=str(exc))
            return False
        finally:
            sock.close(linger=0)
        log.info(kv("kv events: gap replayed", endpoint=eid, batches=len(got)))
        return True


def _crashed(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None


def _log_crash(task: asyncio.Task[None]) -> None:
    """A subscription that died of an error is said at once (run() starts it again),
    not when the task is collected."""
    if not task.cancelled() and task.exception() is not None:
        log.error(
            kv("kv events: subscription crashed", task=task.get_name()), exc_info=task.exception()
        )
