"""The quiet wait before a sleep (agent/quiet.py) and the warm-up's backoff (agent/waking.py)."""

from __future__ import annotations

from llmgw.agent.quiet import Load, QuietWait, parse_load, undo_sleep
from llmgw.agent.waking import WarmUpRetry

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 9.0
"""


class TestParseLoad:
    """The engine's load read from its /metrics text."""

    def test_sums_over_engines(self) -> None:
        """Each gauge summed over its label sets; the longer name sharing a prefix ignored."""
        assert parse_load(VLLM) == Load(running=3, waiting=4)

    def test_without_labels(self) -> None:
        """A gauge with no label set reads as well."""
        text = "vllm:num_requests_running 0\nvllm:num_requests_waiting 1\n"
        assert parse_load(text) == Load(running=0, waiting=1)

    def test_a_missing_gauge_is_unknown(self) -> None:
        """Without either gauge the engine does not say: None, not zero."""
        assert parse_load("vllm:num_requests_running 0\n") is None

    def test_garbage_is_unknown(self) -> None:
        """A value that is no number is None, not a guess."""
        assert parse_load("vllm:num_requests_running x\nvllm:num_requests_waiting 0\n") is None


class TestQuietWait:
    """A sleep is postponed while requests are there, for a bounded time."""

    def test_idle_never_waits(self) -> None:
        """An idle engine, or one that does not say, sleeps at once."""
        q = QuietWait(wait_s=30.0)
        assert not q.postpone(("r", 0), Load(running=0, waiting=0), 0.0)
        assert not q.postpone(("r", 0), None, 0.0)

    def test_busy_waits_until_the_bound(self) -> None:
        """Busy: postponed, and no longer once wait_s has passed since the first time."""
        q = QuietWait(wait_s=30.0)
        busy = Load(running=1, waiting=0)
        assert q.postpone(("r", 0), busy, 100.0)
        for t in range(101, 130):
            assert q.postpone(("r", 0), busy, float(t))
        assert q.waited_s(("r", 0), 129.0) == 29.0
        assert not q.postpone(("r", 0), busy, 130.0)

    def test_a_wait_left_alone_starts_again(self) -> None:
        """A shard not looked at for a while (listed awake in between) waits afresh."""
        q = QuietWait(wait_s=30.0)
        busy = Load(running=0, waiting=2)
        assert q.postpone(("r", 0), busy, 0.0)
        assert q.postpone(("r", 0), busy, 100.0)
        assert q.waited_s(("r", 0), 100.0) == 0.0


class TestUndoSleep:
    """A sleep is undone when it caught requests, unless it was forced past the quiet wait."""

    def test_requests_caught_by_a_quiet_sleep_undo_it(self) -> None:
        """Idle (or not said) before, a request running or waiting after: undone."""
        idle = Load(running=0, waiting=0)
        assert undo_sleep(idle, Load(running=0, waiting=1))
        assert undo_sleep(idle, Load(running=1, waiting=0))
        assert undo_sleep(None, Load(running=0, waiting=1))

    def test_nothing_caught_keeps_it(self) -> None:
        """Idle after, or an engine that does not say after: the sleep stays done."""
        idle = Load(running=0, waiting=0)
        assert not undo_sleep(idle, idle)
        assert not undo_sleep(idle, None)
        assert not undo_sleep(None, None)

    def test_a_forced_sleep_is_kept(self) -> None:
        """Busy before (the quiet wait ran out): kept, or force and undo would loop."""
        busy = Load(running=0, waiting=3)
        assert not undo_sleep(busy, busy)


class TestWarmUpRetry:
    """The warm-up's backoff doubles, up to its cap."""

    def test_doubles_to_the_cap(self) -> None:
        """1, 2, 4, 8, then 8 seconds."""
        r = WarmUpRetry(tries=6, first_backoff_s=1.0, max_backoff_s=8.0)
        assert [r.backoff_s(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 8.0]
