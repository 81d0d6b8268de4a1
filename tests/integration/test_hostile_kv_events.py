"""A rogue KV-event publisher against a real router: deep nesting, a huge frame, a replay
that never ends. Each costs a log line and a fallback to guessing, never a traceback or
memory without bound, and requests are served throughout.

The publisher and its replay socket are this test's own ZeroMQ sockets on 127.0.0.1;
the router and the sim-engine behind it are real processes.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.router.routing.kvfollow import MAX_MESSAGE_BYTES, MAX_REPLAY_BYTES
from llmgw.testing import Program, free_port
from llmgw.testing.wait import wait_until
from llmgw.wire.kvevents import KVEventBatch, encode_batch, encode_seq
from tests.integration.hostile import no_traceback, rss_kib
from tests.integration.router_fixtures import (
    base_config,
    chat_body,
    router,
    sim_engines,
)

zmq = pytest.importorskip("zmq")

pytestmark = pytest.mark.timeout(120)

GOOD = encode_batch(KVEventBatch(ts=1.0, events=[]))


def metric(router_url: str, name: str) -> float | None:
    with urllib.request.urlopen(router_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    m = re.search(rf'^{re.escape(name)}\{{endpoint="e0"\}} (\S+)$', text, re.M)
    return None if m is None else float(m.group(1))


def served(r: Program) -> bool:
    body = json.dumps(chat_body("still routed", max_tokens=2)).encode()
    req = urllib.request.Request(
        r.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return bool(resp.status == 200)


class Rogue:
    """A publisher (PUB) and a replay socket (ROUTER) that say what the test wants."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.pub.bind(self.address)
        self.replay = self.ctx.socket(zmq.ROUTER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay_address = f"tcp://127.0.0.1:{free_port()}"
        self.replay.bind(self.replay_address)

    def send(self, seq: int, payload: bytes) -> None:
        self.pub.send_multipart([b"", encode_seq(seq), payload])

    def close(self) -> None:
        self.pub.close(0)
        self.replay.close(0)
        self.ctx.term()


@contextlib.contextmanager
def following(tmp_path: Path) -> Iterator[tuple[Rogue, Program]]:
    """A router following the rogue publisher for its one endpoint, connected, and past
    the publisher's first (good) batch."""
    rogue = Rogue()
    try:
        with sim_engines(tmp_path, [200.0]) as engines:
            entry = {
                "id": "e0",
                "url": engines[0].url,
                "models": ["m"],
                "kv_events": rogue.address,
                "kv_events_replay": rogue.replay_address,
                "tokenizer": "sim",
            }
            with router(tmp_path, base_config(endpoints=[entry])) as r:
                wait_until(
                    lambda: metric(r.url, "llmgw_router_kv_events_connected") == 1.0, what="connect"
                )

                # A subscription takes effect a moment after the handshake: resend batch 0
                # until one is applied.
                def first_applied() -> bool:
                    rogue.send(0, GOOD)
                    return (metric(r.url, "llmgw_router_kv_events_batches_total") or 0) >= 1

                wait_until(first_applied, what="batch 0 applied")
                yield rogue, r
    finally:
        rogue.close()


def quiet(r: Program) -> None:
    """No traceback, no crashed subscription, the process up."""
    text = r.log_text()
    no_traceback(text)
    assert "subscription crashed" not in text
    assert r.alive()


class TestRoguePublisher:
    """A rogue KV-event publisher cannot crash or bloat the router."""

    def test_deep_nesting_is_an_unreadable_batch(self, tmp_path: Path) -> None:
        """Fifty payloads nested 100,000 levels: each a gap, one log line in all, no
        RecursionError out of the decoder, requests served."""
        with following(tmp_path) as (rogue, r):
            deep = b"\x91" * 100_000 + b"\xc0"
            gaps0 = metric(r.url, "llmgw_router_kv_events_gaps_total") or 0
            for seq in range(1, 51):
                rogue.send(seq, deep)
            wait_until(
                lambda: (metric(r.url, "llmgw_router_kv_events_gaps_total") or 0) >= gaps0 + 50,
                what="fifty gaps",
            )
            text = r.log_text()
            lines = [x for x in text.splitlines() if "unreadable batch" in x]
            assert len(lines) == 1, lines
            assert "nested too deeply" in lines[0]
            assert served(r)
            quiet(r)

    def test_a_frame_past_the_maximum_is_never_held(self, tmp_path: Path) -> None:
        """Five 48 MB frames: ZeroMQ drops the connection before holding one (RSS grows by
        far less than a frame), the subscription comes back, requests are served."""
        with following(tmp_path) as (rogue, r):
            rss0 = rss_kib(r.pid)
            huge = b"\x00" * (6 * MAX_MESSAGE_BYTES)
            for seq in range(1, 6):
                rogue.send(seq, huge)
            wait_until(
                lambda: metric(r.url, "llmgw_router_kv_events_connected") == 1.0, what="reconnect"
            )
            assert served(r)
            grown = rss_kib(r.pid) - rss0
            assert grown < 24 * 1024, grown
            quiet(r)

    def test_a_replay_that_never_ends_is_bounded(self, tmp_path: Path) -> None:
        """A live batch far ahead makes the router ask the replay socket, which sends
        64 KB batches for ever without its end marker: the router stops at its bound,
        logs it, keeps guessing, and lets the memory go."""
        with following(tmp_path) as (rogue, r):
            rss0 = rss_kib(r.pid)
            stop = threading.Event()
            sent = [0]

            def answer() -> None:
                poller = zmq.Poller()
                poller.register(rogue.replay, zmq.POLLIN)
                if not poller.poll(20_000):
                    return
                ident, _, start = rogue.replay.recv_multipart()
                seq = int.from_bytes(start, "big")
                chunk = b"\x01" * 65536
                # Every message delivered, none dropped at a high-water mark: a send
                # waits (in 0.2 s steps) until the router has room, and ends once the
                # router has hung up.
                rogue.replay.setsockopt(zmq.ROUTER_MANDATORY, 1)
                rogue.replay.setsockopt(zmq.SNDTIMEO, 200)
                while not stop.is_set() and sent[0] < 3 * MAX_REPLAY_BYTES // 65536:
                    try:
                        rogue.replay.send_multipart([ident, b"", encode_seq(seq), chunk])
                    except zmq.Again:
                        continue
                    except zmq.ZMQError:
                        return
                    seq += 1
                    sent[0] += 1

            thread = threading.Thread(target=answer)
            thread.start()
            try:
                rogue.send(5_000, GOOD)
                wait_until(
                    lambda: "replay failed" in r.log_text(), what="the replay refused", timeout_s=60
                )
            finally:
                stop.set()
                thread.join(timeout=30)
            line = next(x for x in r.log_text().splitlines() if "replay failed" in x)
            assert "larger than" in line, line
            assert served(r)
            assert metric(r.url, "llmgw_router_kv_events_blocks") == 0.0
            grown = rss_kib(r.pid) - rss0
            assert grown < MAX_REPLAY_BYTES // 1024 + 32 * 1024, grown
            quiet(r)
