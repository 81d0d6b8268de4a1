"""A queue weighed in seconds: owed decode, the engines' pace, and the choice it changes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.replicas.breaker import BreakerState, Outcome
from llmgw.router.replicas.pace import (
    MIN_PREFILL_TOKENS,
    decode_rate,
    drain_rate,
    prefill_cost,
)
from llmgw.router.replicas.registry import MAX_OWED, Registry, Snapshot, Stats
from llmgw.router.routing.blockhash import block_end
from llmgw.router.routing.policies import _shares
from llmgw.router.routing.scheduler import SchedulerConfig, choose, wait_s
from llmgw.testing import ManualClock
from llmgw.wire.endpoints import EndpointInfo

OFF = SchedulerConfig(weigh_queue_time=False)


def snap(
    id: str,
    *,
    inflight: int = 0,
    capacity: int = 8,
    rate: float = 0.0,
    owed: int = 0,
    full: int = 0,
    count: int | None = None,
    prefill: float | None = None,
    pending: int = 0,
    waiting: int = 0,
    kv: float | None = 0.0,
    size: int | None = None,
) -> Snapshot:
    """An endpoint whose last scrape saw exactly the router's `inflight` requests, `waiting`
    of them waiting, `kv` of its KV cache (`size` tokens) pinned; `count` of them (by
    default 8, or none when `full` is 0) gave max_tokens, `full` in all."""
    return Snapshot.of(
        info=EndpointInfo(id=id, url=f"http://{id}", models=("m",)),
        stats=Stats(
            running=inflight - waiting, waiting=waiting, kv_usage=kv, kv_capacity_tokens=size
        ),
        drain_rate=0.0,
        inflight=inflight,
        running_capacity=capacity,
        stale=False,
        age_s=1.0,
        breaker=BreakerState.CLOSED,
        restarts=0,
        inflight_at_scrape=inflight,
        pending=pending,
        owed_tokens=owed,
        owed_full=full,
        prefill_s_per_token=prefill,
        owed_count=(8 if full else 0) if count is None else count,
        decode_rate=rate,
    )


def stats(
    *, success: float = 0.0, prompt: float = 0.0, hits: float = 0.0, prefill_s: float = 0.0
) -> Stats:
    return Stats(
        running=0,
        waiting=0,
        kv_usage=0.0,
        success_total=success,
        prompt_tokens=prompt,
        prefix_hit_tokens=hits,
        prefill_seconds=prefill_s,
    )


class TestWait:
    """How long a new request would wait for a slot, from what is owed and the decode rate."""

    def test_no_queue_is_no_wait(self) -> None:
        """With a free slot the wait is zero, whatever else is known or not."""
        assert wait_s(snap("a", inflight=7, capacity=8)) == 0.0

    def test_unknown_decode_rate_is_unknown(self) -> None:
        """A queue at an engine whose decode rate is not learned yet has no wait in seconds."""
        assert wait_s(snap("a", inflight=10, rate=0.0, owed=100, full=200)) is None

    def test_unknown_max_tokens_is_unknown(self) -> None:
        """A queue of requests none of which gave max_tokens has no wait in seconds."""
        assert wait_s(snap("a", inflight=10, rate=10.0)) is None

    def test_within_the_first_batch_the_owed_decode_decides(self) -> None:
        """Three to leave a batch of 8 whose 4 known requests ask 100 tokens each: owing
        half (twice the mean owed is a whole answer), 3 x 100 / 8 / 10 tokens a second;
        owing a tenth, 3 x 20 / 8 / 10."""
        assert wait_s(snap("a", inflight=10, rate=10.0, owed=200, full=400, count=4)) == 3.75
        got = wait_s(snap("a", inflight=10, rate=10.0, owed=40, full=400, count=4))
        assert got == pytest.approx(0.75)

    def test_past_the_first_batch_each_request_costs_an_eighth_of_an_answer(self) -> None:
        """Eleven to leave a batch of 8 owing a quarter: 8 x 50 + 3 x 100 tokens, over 8
        sequences at 10 tokens a second."""
        got = wait_s(snap("a", inflight=18, rate=10.0, owed=100, full=400, count=4))
        assert got == 8.75

    def test_pending_requests_are_queue(self) -> None:
        """Requests awaiting their first token count once more, as in the load."""
        got = wait_s(snap("a", inflight=8, rate=10.0, owed=400, full=400, count=4, pending=2))
        assert got == 3.75


class TestFullShortOfItsBatch:
    """An engine whose KV cache is full runs what it runs; a prompt that does not fit waits."""

    def test_the_running_count_is_the_capacity(self) -> None:
        """2 running at a batch of 8, 90 % of the KV pinned (45 % each, 10 % free), 3
        waiting: 4 must leave a batch of 2 owing half of their 100 tokens, 2 x 100 + 2 x
        100 tokens over 2 sequences at 25 tokens a second."""
        s = snap("a", inflight=5, waiting=3, kv=0.9, rate=25.0, owed=250, full=500, count=5)
        assert wait_s(s) == 8.0

    def test_room_for_one_more_keeps_the_learned_capacity(self) -> None:
        """2 running pinning 60 % (30 % each, 40 % free), 3 waiting for a step: the batch
        size, no wait; 2 running at 70 % (35 % each, 30 % free) have no room."""
        s = snap("a", inflight=5, waiting=3, kv=0.6, rate=25.0, owed=250, full=500, count=5)
        assert wait_s(s) == 0.0
        s = snap("a", inflight=5, waiting=3, kv=0.7, rate=25.0, owed=250, full=500, count=5)
        assert wait_s(s) == 8.0

    def test_a_full_cache_with_nothing_waiting_keeps_the_learned_capacity(self) -> None:
        """90 % pinned by 2 running, none waiting: the batch size (a request that fits,
        as a holder's does, gets in)."""
        assert wait_s(snap("a", inflight=2, kv=0.9, rate=25.0, owed=64, full=128)) == 0.0

    def test_unknown_usage_keeps_the_learned_capacity(self) -> None:
        """An engine that exports no KV usage: the batch size."""
        s = snap("a", inflight=5, waiting=3, kv=None, rate=25.0, owed=250, full=500, count=5)
        assert wait_s(s) == 0.0

    def test_a_full_batch_keeps_the_learned_capacity(self) -> None:
        """A full batch with its KV full: the batch size, as before (3 to leave 8)."""
        s = snap("a", inflight=10, waiting=2, kv=1.0, rate=10.0, owed=200, full=400, count=4)
        assert wait_s(s) == 3.75

    def test_a_prompt_that_does_not_fit_waits_for_one_to_leave(self) -> None:
        """1,228 tokens free of 6,144: 2,000 to compute wait for the first of a batch of 8
        to leave (64 tokens owed over 8 sequences at 25 a second); 1,000 fit; an engine
        that does not say its cache's size, or a stale one, has room."""
        s = snap("a", inflight=2, kv=0.8, size=6144, rate=25.0, owed=64, full=128, count=2)
        assert wait_s(s, need_tokens=2000) == pytest.approx(0.32)
        assert wait_s(s, need_tokens=1000) == 0.0
        s = snap("a", inflight=2, kv=0.8, rate=25.0, owed=64, full=128, count=2)
        assert wait_s(s, need_tokens=2000) == 0.0

    def test_a_home_without_room_for_the_prompt_gives_way(self) -> None:
        """An unseen prefix of 2,000 tokens, its home with 1,228 free: a replica with
        room takes it; with 3,072 free, the home does."""
        home = snap("a", inflight=2, kv=0.8, size=6144, rate=25.0, owed=64, full=128, count=2)
        other = snap("b", inflight=1, kv=0.3, size=6144, rate=25.0)
        d = choose([home, other], home_order=["a", "b"], prompt_tokens=2000)
        assert (d.endpoint_id, d.reason) == ("b", "least-load")
        room = snap("a", inflight=2, kv=0.5, size=6144, rate=25.0, owed=64, full=128, count=2)
        d = choose([room, other], home_order=["a", "b"], prompt_tokens=2000)
        assert (d.endpoint_id, d.reason) == ("a", "home")

    def test_a_full_holder_loses_to_an_idle_replica(self) -> None:
        """The holder of the prompt runs 2 with 2 waiting and no room: seconds of queue
        against a prefill of 0.5 s on an idle replica, which takes the request; with room
        there, the holder keeps it."""
        idle = snap("b", rate=25.0, prefill=2.5e-4)
        full = snap("a", inflight=4, waiting=2, kv=0.9, rate=25.0, owed=200, full=256, count=4)
        kw = {"prefix_matches": {"a": 50}, "prefix_gain": {"a": 1.0}, "prompt_tokens": 2000}
        d = choose([full, idle], **kw)  # type: ignore[arg-type]
        assert (d.endpoint_id, d.reason) == ("b", "least-load")
        assert next(s.note for s in d.scores if s.id == "a") == "over wait"
        room = snap("a", inflight=4, waiting=2, kv=0.5, rate=25.0, owed=200, full=256, count=4)
        d = choose([room, idle], **kw)  # type: ignore[arg-type]
        assert (d.endpoint_id, d.reason) == ("a", "prefix")


class TestAffinityAgainstTheQueue:
    """A holder keeps a request only while its queue costs less than the prefix saves."""

    def holder_and_idle(
        self, *, rate: float = 25.0, full: int = 800, prefill: float | None = 1e-3
    ) -> list[Snapshot]:
        # a holds the prompt and has 3 requests ahead of a new one, its 8 owing half of
        # their 100 tokens: 3 x 100 / 8 / 25 = 1.5 s; b has free slots, and is less
        # than a batch below a.
        a = snap("a", inflight=10, rate=rate, owed=full // 2, full=full, prefill=prefill)
        return [a, snap("b", inflight=3, rate=rate, prefill=prefill)]

    def test_a_queue_costing_more_than_the_prefill_loses_the_holder(self) -> None:
        """1.5 s of queue against 1,000 tokens at 1 ms: the replica with a free slot
        takes it."""
        d = choose(
            self.holder_and_idle(),
            prefix_matches={"a": 10},
            prefix_gain={"a": 1.0},
            prompt_tokens=1000,
        )
        assert (d.endpoint_id, d.reason) == ("b", "least-load")
        assert next(s.note for s in d.scores if s.id == "a") == "over wait"
        # Counts alone keep it on the holder (10 of 8 is within a batch of 3 of 8).
        off = choose(
            self.holder_and_idle(),
            prefix_matches={"a": 10},
            prefix_gain={"a": 1.0},
            prompt_tokens=1000,
            cfg=OFF,
        )
        assert (off.endpoint_id, off.reason) == ("a", "prefix")

    def test_a_queue_costing_less_than_the_prefill_keeps_the_holder(self) -> None:
        """1.5 s of queue against 2,000 tokens at 1 ms: the holder keeps it."""
        d = choose(
            self.holder_and_idle(),
            prefix_matches={"a": 10},
            prefix_gain={"a": 1.0},
            prompt_tokens=2000,
        )
        assert (d.endpoint_id, d.reason) == ("a", "prefix")

    def test_only_the_extra_share_is_saved(self) -> None:
        """What both hold saves nothing: a holder of 0.8 against one of 0.5 saves 0.3 of
        the prompt (600 tokens, 0.6 s), less than its 1.5 s queue."""
        snaps = [*self.holder_and_idle()]
        d = choose(
            snaps,
            prefix_matches={"a": 10, "b": 6},
            prefix_gain={"a": 0.8, "b": 0.5},
            prompt_tokens=2000,
        )
        assert (d.endpoint_id, d.reason) == ("b", "prefix")

    @pytest.mark.parametrize(
        ("what", "kw"),
        [
            ("decode rate not learned", {"rate": 0.0}),
            ("no max_tokens given", {"full": 0}),
            ("no prefill cost learned", {"prefill": None}),
        ],
    )
    def test_unknowns_leave_the_counts_to_decide(self, what: str, kw: dict[str, object]) -> None:
        """Without a figure the wait needs, the holder wins as it always did."""
        d = choose(
            self.holder_and_idle(**kw),  # type: ignore[arg-type]
            prefix_matches={"a": 10},
            prefix_gain={"a": 1.0},
            prompt_tokens=1000,
        )
        assert (d.endpoint_id, d.reason) == ("a", "prefix"), what

    def test_a_busier_alternative_makes_the_prefill_dearer(self) -> None:
        """The same 1,000 tokens at an alternative with one request awaiting its first
        token (2 x 1 s: that prefill delays it too) outweigh the holder's 1.5 s queue."""
        a, _b = self.holder_and_idle()
        b = snap("b", inflight=3, pending=1, rate=25.0, prefill=1e-3)
        d = choose([a, b], prefix_matches={"a": 10}, prefix_gain={"a": 1.0}, prompt_tokens=1000)
        assert (d.endpoint_id, d.reason) == ("a", "prefix")

    def test_without_the_prompt_size_the_counts_decide(self) -> None:
        """No prompt_tokens given (a caller that does not weigh time): as before."""
        d = choose(self.holder_and_idle(), prefix_matches={"a": 10}, prefix_gain={"a": 1.0})
        assert (d.endpoint_id, d.reason) == ("a", "prefix")

    def test_a_home_that_would_queue_gives_way(self) -> None:
        """An unseen prefix's home with a queue, when another replica has a free slot:
        the least loaded takes it; with no decode rate learned, the home does."""
        home = snap("a", inflight=8, rate=25.0, owed=4000, full=8000)
        other = snap("b", inflight=7, rate=25.0)
        d = choose([home, other], home_order=["a", "b"], prompt_tokens=1000)
        assert (d.endpoint_id, d.reason) == ("b", "least-load")
        unknown = snap("a", inflight=8, owed=4000, full=8000)
        d = choose([unknown, other], home_order=["a", "b"], prompt_tokens=1000)
        assert (d.endpoint_id, d.reason) == ("a", "home")

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.integers(0, 20),  # inflight
                st.sampled_from([0.0, 3.0]),  # decode rate
                st.integers(0, 4000),  # owed
                st.integers(0, 12),  # held blocks
            ),
            min_size=1,
            max_size=6,
        )
    )
    def test_nothing_known_decides_as_before(self, rows: list[tuple[int, float, int, int]]) -> None:
        """With no max_tokens given anywhere (or no decode rate learned), every decision is
        the one the counts alone make."""
        snaps = [
            snap(f"e{i}", inflight=n, rate=rate, owed=0, full=0, prefill=1e-3)
            for i, (n, rate, _owed, _held) in enumerate(rows)
        ]
        matches = {f"e{i}": held for i, (*_x, held) in enumerate(rows) if held}
        gains = dict.fromkeys(matches, 0.9)
        order = [f"e{i}" for i in reversed(range(len(rows)))]
        kw = {"prefix_matches": matches, "prefix_gain": gains, "home_order": order}
        on = choose(snaps, prompt_tokens=3000, **kw)  # type: ignore[arg-type]
        off = choose(snaps, prompt_tokens=3000, cfg=OFF, **kw)  # type: ignore[arg-type]
        assert (on.endpoint_id, on.reason) == (off.endpoint_id, off.reason)


class TestPace:
    """Drain rate and prefill cost from two scrapes (pace.py)."""

    def test_drain_rate_is_smoothed(self) -> None:
        """10 finished in 2 s, from 1.0: 0.3 x 5 + 0.7 x 1 = 2.2 per second."""
        assert drain_rate(1.0, stats(success=0), stats(success=10), 2.0) == pytest.approx(2.2)

    def test_drain_rate_keeps_its_value_without_a_counter(self) -> None:
        """An engine without a finished-request counter keeps the rate it had."""
        none = Stats(running=0, waiting=0, kv_usage=None)
        assert drain_rate(1.5, none, none, 1.0) == 1.5

    def test_decode_rate_is_tokens_per_running_sequence(self) -> None:
        """600 tokens in 2 s over 3 and 7 running (5 on average): 60 a second each; then
        smoothed; no running sequence, or no counter, teaches nothing."""
        before = Stats(running=3, waiting=0, kv_usage=None, generation_tokens=1000.0)
        after = Stats(running=7, waiting=0, kv_usage=None, generation_tokens=1600.0)
        assert decode_rate(0.0, before, after, 2.0) == pytest.approx(60.0)
        assert decode_rate(40.0, before, after, 2.0) == pytest.approx(18.0 + 28.0)
        idle = Stats(running=0, waiting=0, kv_usage=None, generation_tokens=1600.0)
        assert decode_rate(40.0, idle, idle, 2.0) == 40.0
        bare = Stats(running=3, waiting=0, kv_usage=None)
        assert decode_rate(40.0, bare, bare, 2.0) == 40.0

    def test_prefill_cost_is_seconds_per_computed_token(self) -> None:
        """0.5 s of prefill over 1,000 prompt tokens of which 500 were cached: 1 ms each;
        then smoothed."""
        before = stats()
        after = stats(prompt=1000, hits=500, prefill_s=0.5)
        assert prefill_cost(None, before, after) == pytest.approx(1e-3)
        assert prefill_cost(2e-3, before, after) == pytest.approx(0.3e-3 + 1.4e-3)

    def test_prefill_cost_needs_every_counter_and_enough_work(self) -> None:
        """A missing counter, or an interval with too little computed, teaches nothing."""
        partial = Stats(running=0, waiting=0, kv_usage=None, prompt_tokens=5000.0)
        assert prefill_cost(None, partial, partial) is None
        few = stats(prompt=MIN_PREFILL_TOKENS - 1, prefill_s=0.5)
        assert prefill_cost(4e-3, stats(), few) == 4e-3

    def test_the_registry_learns_it(self) -> None:
        """Two scrapes a second apart give the snapshot its drain rate, prefill cost and
        decode rate."""
        clock = ManualClock()
        reg = Registry(clock=clock)
        reg.replace([EndpointInfo(id="a", url="http://a", models=("m",))])
        reg.observe("a", stats())
        clock.advance(1.0)
        reg.observe("a", stats(success=10, prompt=2000, hits=1000, prefill_s=2.0))
        s = reg.snapshot("a")
        assert s is not None
        assert (s.drain_rate, s.prefill_s_per_token) == (pytest.approx(3.0), pytest.approx(2e-3))
        assert s.decode_rate == 0.0  # nothing was running
        reg.observe("a", Stats(running=4, waiting=0, kv_usage=None, generation_tokens=0.0))
        clock.advance(1.0)
        reg.observe("a", Stats(running=4, waiting=0, kv_usage=None, generation_tokens=200.0))
        s = reg.snapshot("a")
        assert s is not None
        assert s.decode_rate == pytest.approx(50.0)


class TestOwed:
    """The registry counts the tokens in-flight requests may still generate."""

    def owed(self, reg: Registry) -> tuple[int, int]:
        s = reg.snapshot("a")
        assert s is not None
        return s.owed_tokens, s.owed_full

    def registry(self) -> Registry:
        reg = Registry(clock=ManualClock())
        reg.replace([EndpointInfo(id="a", url="http://a", models=("m",))])
        return reg

    def test_streamed_events_pay_off_and_release_clears_the_rest(self) -> None:
        """1,000 owed; 300 streamed leaves 700; the release takes the rest, once."""
        reg = self.registry()
        r = reg.acquire("a", pending=True, max_tokens=1000)
        assert r is not None
        assert self.owed(reg) == (1000, 1000)
        snap_ = reg.snapshot("a")
        assert snap_ is not None
        assert snap_.owed_count == 1
        r.streamed(300)
        assert self.owed(reg) == (700, 1000)
        r(Outcome.OK)
        r(Outcome.OK)
        assert self.owed(reg) == (0, 0)

    def test_more_events_than_max_tokens_never_go_below_zero(self) -> None:
        """Role and usage events are events too: what is owed stops at zero."""
        reg = self.registry()
        r = reg.acquire("a", max_tokens=4)
        assert r is not None
        r.streamed(3)
        r.streamed(3)
        assert self.owed(reg) == (0, 4)
        r(Outcome.OK)
        assert self.owed(reg) == (0, 0)

    def test_a_request_without_max_tokens_owes_nothing_known(self) -> None:
        """No max_tokens (or a nonsensical one): in flight, but no tokens counted."""
        reg = self.registry()
        r1, r2 = reg.acquire("a"), reg.acquire("a", max_tokens=0)
        assert r1 is not None
        assert r2 is not None
        r1.streamed(10)
        assert self.owed(reg) == (0, 0)
        assert reg.inflight("a") == 2

    def test_a_max_tokens_past_a_float_still_weighs_a_queue(self) -> None:
        """A body's `max_tokens` of 10**400 is owed as MAX_OWED: the queue it is in is weighed
        in seconds, where its average overflowed a float and every choice there raised."""
        reg = self.registry()
        for _ in range(9):
            assert reg.acquire("a", max_tokens=10**400) is not None
        s = reg.snapshot("a")
        assert s is not None
        assert (s.owed_tokens, s.owed_full) == (MAX_OWED * 9, MAX_OWED * 9)
        queued = snap("a", inflight=9, rate=20.0, owed=s.owed_tokens, full=s.owed_full, count=9)
        assert wait_s(queued) is not None


class TestSmallGainWithRoom:
    """A holder of a small share of the prompt keeps it while it has room to start it now."""

    def test_room_now_restores_the_whole_bound(self) -> None:
        """Every replica holds a 6,000-token preamble of a 7,000-token prompt; a holds 10 %
        more (a bound of 0.4 batch) and runs 4 of 8: with room for the rest the holder
        takes the request; with its KV cache too full for the rest, or with no prefill
        cost learned (no saving known), the cut bound or the wait sends it to b."""
        kw = {
            "prefix_matches": {"a": 400, "b": 375},
            "prefix_gain": {"a": 0.1, "b": 0.0},
            "prefix_common": 6000 / 7000,
            "prompt_tokens": 7000,
        }
        idle = snap("b", rate=25.0, prefill=1e-4)
        room = snap("a", inflight=4, rate=25.0, owed=100, full=200, count=4, prefill=1e-4)
        d = choose([room, idle], **kw)  # type: ignore[arg-type]
        assert (d.endpoint_id, d.reason) == ("a", "prefix")
        # 300 tokens to hold anew fit in 5 % of 6,144 free, not in 1 %.
        fits = snap("a", inflight=4, kv=0.95, size=6144, rate=25.0, owed=100, full=200, count=4)
        assert wait_s(fits, need_tokens=300) == 0.0
        short = snap("a", inflight=4, kv=0.99, size=6144, rate=25.0, owed=100, full=200, count=4)
        d = choose([short, idle], **kw)  # type: ignore[arg-type]
        assert d.endpoint_id == "b"
        assert next(s.note for s in d.scores if s.id == "a") == "over wait"
        unknown = snap("a", inflight=4, rate=25.0, owed=100, full=200, count=4)
        d = choose([unknown, snap("b", rate=25.0)], **kw)  # type: ignore[arg-type]
        assert d.endpoint_id == "b"
        assert next(s.note for s in d.scores if s.id == "a") == "over bound"

    def test_the_common_share_is_what_every_replica_holds(self) -> None:
        """The policy's shares: a and b hold 20 blocks, a 4 more; every replica holding
        the 20 is the common share, a's 4 its gain; nobody holding any, none."""
        gains, common = _shares({"a": 24, "b": 20}, ["a", "b"], 32)
        assert common == pytest.approx(block_end(19) / block_end(31))
        assert gains["a"] == pytest.approx((block_end(23) - block_end(19)) / block_end(31))
        assert gains["b"] == 0.0
        assert _shares({"a": 24}, ["a", "b"], 32)[1] == 0.0
