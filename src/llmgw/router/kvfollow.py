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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from llmgw.router.kvevents import EngineBlocks, Follow, KVEventIndex
from llmgw.runtime.logs import kv
from llmgw.wire.kvevents import KVEventsDecodeError, decode_batch, decode_seq, encode_seq

log = logging.getLogger(__name__)

RECONCILE_S = 1.0
REPLAY_TIMEOUT_S = 2.0


class KVEventFollower:
    """Keeps one subscription task per endpoint the index follows."""

    def __init__(self, index: KVEventIndex) -> None:
        self.index = index
        self._tasks: dict[str, tuple[Follow, asyncio.Task[None]]] = {}
        self._zmq: Any = None
        self._ctx: Any = None
        self._warned = False

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
        try:
            while True:
                ready = dict(await poller.poll())
                if mon in ready:
                    self._on_monitor(eid, blocks, await mon.recv_multipart())
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
            log.warning(kv("kv events: unreadable batch", endpoint=eid, error=str(exc)))
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
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        got: list[tuple[int, bytes]] = []
        try:
            sock.connect(follow.replay)
            await sock.send_multipart((b"", encode_seq(first)))
            while True:
                if not await sock.poll(int(REPLAY_TIMEOUT_S * 1000)):
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
                got.append((seq, frames[2]))
            # Compared without listing first..upto: a sequence frame far ahead (a buggy
            # publisher) would otherwise allocate one int per missed number.
            if len(got) != upto - first or any(s != first + i for i, (s, _) in enumerate(got)):
                raise KVEventsDecodeError("replay did not cover the gap")
            for seq, payload in got:
                blocks.on_batch(seq, decode_batch(payload)[1])
        except (TimeoutError, KVEventsDecodeError, zmq.ZMQError) as exc:
            log.warning(kv("kv events: replay failed", endpoint=eid, error=str(exc)))
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
