"""The router's KV-event follower against the sim-engine's publisher, in one process, on
loopback sockets: a sequence gap is filled from the replay socket, or falls back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from llmgw.router.routing import kvfollow
from llmgw.router.routing.kvevents import EngineBlocks, KVEventIndex
from llmgw.router.routing.kvfollow import KVEventFollower
from llmgw.simengine.kvcache import KVCache, prompt_block_hashes
from llmgw.simengine.kvevents import KVEventPublisher, KVEventsSettings
from llmgw.testing.procs import free_port
from llmgw.testing.wait import until
from llmgw.tokenization.sim import completion_prompt_ids
from llmgw.wire.endpoints import EndpointInfo
from llmgw.wire.kvevents import decode_batch, encode_seq

PROMPTS = [f"prompt number {i} " * 4 for i in range(3)]


@contextlib.asynccontextmanager
async def publisher(replay: bool) -> AsyncIterator[tuple[KVEventPublisher, str, str]]:
    """A publisher that has sent three batches, one prompt's blocks each."""
    addr, raddr = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    kv = KVCache(num_gpu_blocks=200, block_size=4)
    settings = KVEventsSettings(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=addr,
        replay_endpoint=raddr if replay else None,
    )
    pub = KVEventPublisher(settings, kv)
    task = asyncio.create_task(pub.serve_replay())
    try:
        for i, text in enumerate(PROMPTS):
            ids = completion_prompt_ids(text)
            assert kv.allocate(f"r{i}", len(ids), prompt_block_hashes(ids, 4), token_ids=ids)
            pub.flush()
        yield pub, addr, raddr
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        pub.close()


def follower(addr: str, raddr: str) -> tuple[KVEventFollower, KVEventIndex]:
    idx = KVEventIndex()
    info = EndpointInfo(
        id="a",
        url="http://a",
        models=("m",),
        kv_events=addr,
        kv_events_replay=raddr,
        tokenizer="sim",
    )
    assert idx.set_endpoints([info]) == []
    f = KVEventFollower(idx)
    assert f._load_zmq()
    return f, idx


def held(idx: KVEventIndex) -> list[int]:
    follow = idx.follows["a"]
    out = []
    for text in PROMPTS:
        got = idx.match({"prompt": text}, ["a"])
        out.append(got["a"][0] if "a" in got else -1)
    assert follow.blocks.precise
    return out


def frames(pub: KVEventPublisher, seq: int) -> list[Any]:
    return [b"", encode_seq(seq), dict(pub._buffer)[seq]]


@dataclass
class Live:
    """A follower of endpoint "a" whose subscription counts as connected."""

    follower: KVEventFollower
    idx: KVEventIndex

    @property
    def blocks(self) -> EngineBlocks:
        return self.idx.follows["a"].blocks

    async def receive(self, got: list[Any]) -> None:
        """Hand the follower one message, as the live socket would."""
        await self.follower._on_message("a", self.idx.follows["a"], got)


@contextlib.contextmanager
def following(addr: str, raddr: str) -> Iterator[Live]:
    f, idx = follower(addr, raddr)
    try:
        live = Live(f, idx)
        live.blocks.connected = True
        yield live
    finally:
        f._ctx.term()


class TestReplay:
    """Gaps in the event stream are filled from the replay socket or fall back."""

    async def test_a_gap_is_filled_from_the_replay_socket(self) -> None:
        """A gap is filled from the replay socket."""
        async with publisher(replay=True) as (pub, addr, raddr):
            with following(addr, raddr) as live:
                await live.receive(frames(pub, 0))
                # Batch 1 never arrived: batch 2 makes the follower ask for it.
                await live.receive(frames(pub, 2))
                assert live.blocks.gaps == 0
                assert live.blocks.next_seq == 3
                assert all(n > 0 for n in held(live.idx))

    async def test_joining_mid_stream_replays_from_the_first_batch(self) -> None:
        """A router that starts after the engine asks for its whole history: while the
        publisher still has batch 0, the set is complete and precise at once."""
        async with publisher(replay=True) as (pub, addr, raddr):
            with following(addr, raddr) as live:
                await live.receive(frames(pub, 2))
                assert live.blocks.gaps == 0
                assert all(n > 0 for n in held(live.idx))

    async def test_history_already_gone_falls_back_at_the_first_batch(self) -> None:
        """The publisher's buffer no longer holds batch 0: the first replayed batch says
        so, the follower stops there (it does not read the rest of the history) and
        guesses for the endpoint until its cache is known again (joining mid-stream is
        not a gap: nothing was missed after the subscription began)."""
        async with publisher(replay=True) as (pub, addr, raddr):
            pub._buffer.popleft()  # batch 0 has left the publisher's buffer
            with following(addr, raddr) as live:
                await live.receive(frames(pub, 2))
                assert not live.blocks.synced
                assert not live.blocks.precise
                assert live.blocks.next_seq == 3

    async def test_without_an_answer_the_gap_falls_back(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without a replay answer the gap falls back."""
        monkeypatch.setattr(kvfollow, "REPLAY_TIMEOUT_S", 0.3)
        async with publisher(replay=False) as (pub, addr, _):
            # A replay address nobody answers on.
            with following(addr, f"tcp://127.0.0.1:{free_port()}") as live:
                await live.receive(frames(pub, 0))
                await live.receive(frames(pub, 2))
                assert live.blocks.gaps == 1
                assert not live.blocks.precise

    async def test_an_unreadable_batch_counts_as_a_gap(self) -> None:
        """An unreadable batch counts as a gap."""
        async with publisher(replay=False) as (pub, addr, _):
            with following(addr, "") as live:
                await live.receive(frames(pub, 0))
                await live.receive([b"", encode_seq(1), b"\xc1"])
                assert live.blocks.gaps == 1
                assert not live.blocks.precise
                # The next batch follows the unreadable one: no second gap for the same loss.
                await live.receive(frames(pub, 2))
                assert live.blocks.gaps == 1
                assert live.blocks.next_seq == 3
                assert decode_batch(frames(pub, 1)[2])[1]  # the real batch 1 was not empty

    async def test_a_sequence_number_far_ahead_is_a_gap_not_a_crash(self) -> None:
        """A sequence frame far past the last (a buggy or hostile publisher) is a gap the
        replay cannot fill: the follower must not try to list every missed number (a
        MemoryError that ended the subscription, or gigabytes for a smaller jump)."""
        async with publisher(replay=True) as (pub, addr, raddr):
            with following(addr, raddr) as live:
                await live.receive(frames(pub, 0))
                far = [b"", encode_seq(2**40), frames(pub, 1)[2]]
                await live.receive(far)
                assert live.blocks.gaps == 1
                assert not live.blocks.precise
                assert live.blocks.next_seq == 2**40 + 1

    async def test_a_negative_sequence_number_is_unreadable(self) -> None:
        """-1 only ends a replay; on the live socket a negative number is a bad frame,
        not a position to replay from (encoding it for the replay request raised
        OverflowError, which ended the subscription)."""
        async with publisher(replay=True) as (pub, addr, raddr):
            with following(addr, raddr) as live:
                await live.receive(frames(pub, 0))
                bad = [b"", (-5).to_bytes(8, "big", signed=True), frames(pub, 1)[2]]
                await live.receive(bad)
                assert live.blocks.gaps == 1
                await live.receive(frames(pub, 2))
                assert live.blocks.next_seq == 3
                assert not live.blocks.precise

    async def test_a_restarted_publisher_whose_first_batches_were_missed_is_replayed(
        self,
    ) -> None:
        """A first batch numbered below what was expected has the whole history (from 0)
        fetched, as when joining mid-stream, instead of guessing until the next reset."""
        # The engine restarted and its publisher's first batches went out before the
        # subscription reconnected.
        async with publisher(replay=True) as (pub, addr, raddr):
            with following(addr, raddr) as live:
                # Where the previous incarnation of the publisher had got to.
                live.blocks.on_batch(0, [])
                live.blocks.next_seq = 500
                await live.receive(frames(pub, 2))
                assert live.blocks.gaps == 0
                assert live.blocks.next_seq == 3
                assert all(n > 0 for n in held(live.idx))


class TestSupervision:
    """A crashed subscription is started again."""

    async def test_a_subscription_that_crashes_is_started_again(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An error nobody foresaw while handling one message ends that endpoint's task;
        the follower starts it again instead of leaving the endpoint guessing for good."""
        monkeypatch.setattr(kvfollow, "RECONCILE_S", 0.05)
        calls: list[int] = []
        real = KVEventFollower._on_message

        async def flaky(self: KVEventFollower, eid: str, follow: Any, got: list[Any]) -> None:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("unforeseen")
            await real(self, eid, follow, got)

        monkeypatch.setattr(KVEventFollower, "_on_message", flaky)
        async with publisher(replay=False) as (pub, addr, _):
            f, idx = follower(addr, "")
            run = asyncio.create_task(f.run())
            try:
                blocks = idx.follows["a"].blocks
                published: list[str] = []

                def restarted_and_applying() -> bool:
                    if len(calls) >= 2 and blocks.batches > 0:
                        return True
                    # Not yet: publish one more batch for the restarted follower to apply.
                    name = f"m{len(published)}"
                    ids = completion_prompt_ids(f"more text {len(published)} " * 2)
                    pub.kv.allocate(name, len(ids), prompt_block_hashes(ids, 4), token_ids=ids)
                    pub.kv.free(name)
                    pub.flush()
                    published.append(name)
                    return False

                await until(
                    restarted_and_applying,
                    timeout_s=30,
                    every_s=0.1,
                    what="the follower restarted and applying batches",
                )
            finally:
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
