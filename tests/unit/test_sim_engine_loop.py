"""sim-engine loop: step timing in simulated time, catch-up after lag, stream bookkeeping."""

from __future__ import annotations

import pytest

from llmgw.simengine.batcher import Scheduler, SimRequest
from llmgw.simengine.engine import Engine, Stream
from llmgw.simengine.kvcache import KVCache
from llmgw.simengine.stats import EngineStats
from llmgw.simengine.timing import TimingModel
from llmgw.testing import ManualClock

# 10 ms per step plus 1 ms per decoding sequence, nothing for prefill: easy arithmetic.
TIMING = TimingModel(decode_base_ms=10.0, decode_ms_per_seq=1.0, prefill_ms_per_token=0.0)


def make(clock: ManualClock, *, max_lag_s: float = 1.0) -> Engine:
    s = Scheduler(
        kv=KVCache(num_gpu_blocks=100, block_size=4),
        stats=EngineStats({}),
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=128,
    )
    return Engine(s, TIMING, max_lag_s=max_lag_s, clock=clock.monotonic)


def req(rid: str, clock: ManualClock, *, max_tokens: int = 3) -> SimRequest:
    return SimRequest(
        rid, [1, 2, 3], arrival_s=clock.monotonic(), max_tokens=max_tokens, seed=1, ignore_eos=True
    )


class TestSteps:
    """Step timing in simulated time and catch-up after lag."""

    def test_idle_engine_starts_now(self) -> None:
        """The first step after idling starts at the current time."""
        clock = ManualClock()
        e = make(clock)
        e.submit(req("a", clock))
        step = e.begin_step(clock.monotonic())
        assert step is not None
        _, start, end = step
        assert (start, end) == (clock.monotonic(), pytest.approx(clock.monotonic() + 0.010))

    def test_next_step_starts_at_previous_end_despite_lag(self) -> None:
        """A step starts where the last one ended even if the process woke up late."""
        clock = ManualClock()
        e = make(clock)
        e.submit(req("a", clock))
        plan, _, end = e.begin_step(clock.monotonic())
        clock.advance(0.050)  # woke 40 ms late
        e.end_step(plan, end)
        step = e.begin_step(clock.monotonic())
        assert step is not None
        assert (step[1], step[2]) == (end, pytest.approx(end + 0.011))

    def test_falling_too_far_behind_slips_the_timeline(self) -> None:
        """Beyond max_lag_s the timeline restarts from now, and the slip is counted."""
        clock = ManualClock()
        e = make(clock, max_lag_s=0.1)
        e.submit(req("a", clock))
        plan, _, end = e.begin_step(clock.monotonic())
        e.end_step(plan, end)
        clock.advance(0.5)
        step = e.begin_step(clock.monotonic())
        assert step is not None
        assert (step[1], e.lag_resets) == (clock.monotonic(), 1)

    def test_late_arrival_waits_for_a_step_that_starts_after_it(self) -> None:
        """A request that arrived after the catch-up start is not in that step."""
        clock = ManualClock()
        e = make(clock)
        e.submit(req("a", clock, max_tokens=5))
        plan, _, end = e.begin_step(clock.monotonic())
        clock.advance(0.030)
        e.submit(req("b", clock))
        e.end_step(plan, end)
        step = e.begin_step(clock.monotonic())
        assert step is not None
        assert [r.req_id for r, _ in step[0].scheduled] == ["a"]

    def test_only_late_work_starts_now(self) -> None:
        """When all pending work arrived after the catch-up start, the step starts now."""
        clock = ManualClock()
        e = make(clock)
        e.submit(req("a", clock, max_tokens=1))
        plan, _, end = e.begin_step(clock.monotonic())
        clock.advance(0.030)
        e.submit(req("b", clock))
        e.end_step(plan, end)  # "a" finished
        step = e.begin_step(clock.monotonic())
        assert step is not None
        assert ([r.req_id for r, _ in step[0].scheduled], step[1]) == (["b"], clock.monotonic())

    def test_abort_releases_the_request(self) -> None:
        """Aborting a stream takes its request out of the batch."""
        clock = ManualClock()
        e = make(clock)
        stream = e.submit(req("a", clock))
        e.begin_step(clock.monotonic())
        e.abort(stream)
        assert (e.scheduler.num_running, stream.req.finish_reason) == (0, "abort")


class TestStream:
    """Stream bookkeeping of the engine loop."""

    def test_take_respects_limit(self) -> None:
        """take(limit) hands out at most `limit` unsent tokens and remembers them."""
        r = SimRequest("a", [1], arrival_s=0.0, max_tokens=9, seed=1)
        r.token_ids += [7, 8, 9]
        s = Stream(r)
        assert (s.take(2), s.take(), s.sent) == ([7, 8], [9], 3)

    def test_non_streaming_waits_for_the_end(self) -> None:
        """Without per_token a stream is ready only at the end or at its wake count."""
        r = SimRequest("a", [1], arrival_s=0.0, max_tokens=9, seed=1)
        s = Stream(r)
        s.per_token = False
        r.token_ids.append(7)
        idle = s.ready()
        s.wake_at = 1
        assert (idle, s.ready()) == (False, True)
