"""sim-engine scheduler: vLLM's per-batch limit of `--max-loras` distinct adapters."""

from __future__ import annotations

import zlib

from llmgw.simengine.batcher import PRIORITY, Scheduler, SimRequest
from llmgw.simengine.kvcache import KVCache
from llmgw.simengine.stats import EngineStats


def make(*, max_loras: int | None, policy: str = "fcfs") -> Scheduler:
    return Scheduler(
        kv=KVCache(num_gpu_blocks=100, block_size=4),
        stats=EngineStats({"ttft": [0.1, 1.0], "iteration_tokens": [1, 8, 64]}),
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=256,
        policy=policy,
        max_loras=max_loras,
    )


def req(rid: str, adapter: str | None, *, max_tokens: int = 4, priority: int = 0) -> SimRequest:
    base = 1000 + 1000 * (zlib.crc32(rid.encode()) % 1000)
    return SimRequest(
        rid,
        list(range(base, base + 8)),
        arrival_s=0.0,
        max_tokens=max_tokens,
        seed=1,
        ignore_eos=True,
        priority=priority,
        adapter=adapter,
    )


def running(s: Scheduler) -> list[str]:
    return sorted(s.running_snapshot())


class TestMaxLoras:
    """A batch mixes at most `max_loras` adapters; the base model's requests are not counted."""

    def test_a_request_of_one_adapter_too_many_waits(self) -> None:
        """With one adapter allowed, B's request waits while A's and the base's run."""
        s = make(max_loras=1)
        for r in (req("a1", "A"), req("b1", "B"), req("base", None), req("a2", "A")):
            s.add(r)
        s.schedule(0.0)
        assert (running(s), s.waiting_snapshot()) == (["a1", "a2", "base"], ["b1"])

    def test_skipped_requests_keep_their_order(self) -> None:
        """Requests passed over for the limit stay at the front, first come first."""
        s = make(max_loras=1)
        for r in (req("a1", "A"), req("b1", "B"), req("c1", "C"), req("b2", "B")):
            s.add(r)
        s.schedule(0.0)
        assert s.waiting_snapshot() == ["b1", "c1", "b2"]

    def test_the_waiting_adapter_runs_once_the_batch_has_room(self) -> None:
        """When A's requests leave the batch, B's request is scheduled."""
        s = make(max_loras=1)
        a, b = req("a1", "A", max_tokens=2), req("b1", "B", max_tokens=2)
        s.add(a)
        s.add(b)
        now = 0.0
        while s.has_work():
            plan = s.schedule(now)
            now += 0.01
            s.finish_step(plan, now)
        assert a.first_scheduled_s == 0.0
        assert a.first_token_s is not None
        assert b.first_scheduled_s is not None
        assert b.first_scheduled_s > a.first_token_s

    def test_no_limit_without_lora(self) -> None:
        """An engine without LoRA settings (max_loras None) admits every adapter at once."""
        s = make(max_loras=None)
        for r in (req("a1", "A"), req("b1", "B"), req("c1", "C")):
            s.add(r)
        s.schedule(0.0)
        assert (running(s), s.num_waiting) == (["a1", "b1", "c1"], 0)

    def test_under_priority_a_skipped_request_keeps_its_place(self) -> None:
        """Priority scheduling: a request passed over stays ahead of later, lower ones."""
        s = make(max_loras=1, policy=PRIORITY)
        for r in (
            req("a1", "A", priority=0),
            req("b1", "B", priority=1),
            req("b2", "B", priority=2),
        ):
            s.add(r)
        s.schedule(0.0)
        assert (running(s), s.waiting_snapshot()) == (["a1"], ["b1", "b2"])
