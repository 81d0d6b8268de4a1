"""sim-engine scheduler: continuous batching, chunked prefill, waiting, preemption, outputs."""

from __future__ import annotations

import zlib

from llmgw.simengine import tokenizer
from llmgw.simengine.batcher import Scheduler, SimRequest, Status, mix_seed
from llmgw.simengine.kvcache import KVCache
from llmgw.simengine.stats import EngineStats


def make(
    *,
    blocks: int = 100,
    block_size: int = 4,
    max_seqs: int = 8,
    budget: int = 64,
    max_len: int = 256,
) -> Scheduler:
    return Scheduler(
        kv=KVCache(num_gpu_blocks=blocks, block_size=block_size),
        stats=EngineStats({"ttft": [0.1, 1.0], "iteration_tokens": [1, 8, 64]}),
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_len,
    )


def req(
    rid: str,
    prompt: list[int] | int = 8,
    *,
    max_tokens: int = 4,
    ignore_eos: bool = True,
    seed: int = 1,
    t: float = 0.0,
) -> SimRequest:
    # Distinct ids per request id, so prompts share nothing unless a test says so.
    base = 1000 + 1000 * (zlib.crc32(rid.encode()) % 1000)
    ids = list(range(base, base + prompt)) if isinstance(prompt, int) else prompt
    return SimRequest(
        rid, ids, arrival_s=t, max_tokens=max_tokens, seed=seed, ignore_eos=ignore_eos
    )


def run(s: Scheduler, *, steps: int = 1000, dt: float = 0.01, t0: float = 0.0) -> float:
    now = t0
    for _ in range(steps):
        if not s.has_work():
            break
        plan = s.schedule(now)
        now += dt
        s.finish_step(plan, now)
    return now


def preemptions(s: Scheduler, *, t0: float = 0.0, dt: float = 0.01) -> list[str]:
    """Run `s` until it is idle, as `run` does; the ids it preempted, in order."""
    out: list[str] = []
    now = t0
    while s.has_work():
        plan = s.schedule(now)
        out += [r.req_id for r in plan.preempted]
        now += dt
        s.finish_step(plan, now)
    return out


class TestSteps:
    """Batcher steps: prefill, decode and the token budget."""

    def test_prefill_step_yields_first_token(self) -> None:
        """The step that computes the last prompt token samples the first output token."""
        s = make()
        r = req("a", 8)
        s.add(r)
        plan = s.schedule(0.0)
        out = s.finish_step(plan, 0.05)
        assert ([r], 8, 1, 0.05) == (out, plan.prefill_tokens, r.num_output, r.first_token_s)

    def test_decode_steps_count_sequences(self) -> None:
        """After prefill each running request decodes one token per step."""
        s = make()
        a, b = req("a"), req("b", 12)
        s.add(a)
        s.add(b)
        s.finish_step(s.schedule(0.0), 0.1)
        plan = s.schedule(0.1)
        assert (plan.prefill_tokens, plan.decode_seqs, [n for _, n in plan.scheduled]) == (
            0,
            2,
            [1, 1],
        )

    def test_chunked_prefill_respects_budget(self) -> None:
        """A prompt longer than the token budget is computed over several steps."""
        s = make(budget=8)
        r = req("a", 20)
        s.add(r)
        chunks = []
        while r.num_output == 0:
            plan = s.schedule(0.0)
            chunks.append(plan.prefill_tokens)
            s.finish_step(plan, 0.0)
        assert chunks == [8, 8, 4]

    def test_budget_shared_with_decodes(self) -> None:
        """Decoding requests use the budget first; a new prompt gets what is left."""
        s = make(budget=8)
        s.add(req("a", 4, max_tokens=10))
        s.finish_step(s.schedule(0.0), 0.0)
        s.add(req("b", 20))
        plan = s.schedule(0.0)
        assert (plan.decode_seqs, plan.prefill_tokens) == (1, 7)

    def test_runs_to_completion(self) -> None:
        """With ignore_eos a request produces exactly max_tokens and finishes 'length'."""
        s = make()
        r = req("a", max_tokens=5)
        s.add(r)
        run(s)
        assert (r.num_output, r.finish_reason, r.status) == (5, "length", Status.FINISHED)

    def test_context_limit_ends_with_length(self) -> None:
        """A request stops when prompt plus output reach max_model_len."""
        s = make(max_len=12)
        r = req("a", 8, max_tokens=100)
        s.add(r)
        run(s)
        assert (r.num_output, r.finish_reason) == (4, "length")


class TestWaiting:
    """Requests wait for sequence slots and cache room."""

    def test_max_num_seqs_leaves_the_rest_waiting(self) -> None:
        """More requests than max_num_seqs: the extra ones wait."""
        s = make(max_seqs=2)
        for i in range(3):
            s.add(req(f"r{i}"))
        s.schedule(0.0)
        assert (s.num_running, s.num_waiting) == (2, 1)

    def test_full_cache_leaves_requests_waiting_then_serves_them(self) -> None:
        """A request that does not fit in the KV cache waits until blocks free up."""
        s = make(blocks=5, block_size=4)  # 4 usable blocks = 16 tokens
        a, b = req("a", 10, max_tokens=2), req("b", 10, max_tokens=2)
        s.add(a)
        s.add(b)
        s.schedule(0.0)
        waiting_at_first = s.num_waiting
        run(s)
        assert (waiting_at_first, a.finish_reason, b.finish_reason) == (1, "length", "length")

    def test_head_of_line_blocks(self) -> None:
        """A small request behind a waiting big one waits too (FCFS)."""
        s = make(blocks=5, block_size=4)
        s.add(req("a", 10, max_tokens=2))
        s.add(req("big", 14))
        s.add(req("small", 2))
        s.schedule(0.0)
        assert s.waiting_snapshot() == ["big", "small"]

    def test_queue_time_starts_at_arrival(self) -> None:
        """first_scheduled_s is the start of the step that first includes the request."""
        s = make(max_seqs=1)
        a, b = req("a", max_tokens=2), req("b", max_tokens=2)
        s.add(a)
        s.add(b)
        run(s, dt=1.0)
        assert (a.first_scheduled_s, b.first_scheduled_s) == (0.0, 2.0)


class TestPreemption:
    """Preemption when decode runs out of cache."""

    def test_newest_request_is_preempted_when_decode_runs_out(self) -> None:
        """When blocks run out during decode, the newest running request is preempted."""
        s = make(blocks=5, block_size=4)  # 16 tokens
        a, b = req("a", 7, max_tokens=8), req("b", 7, max_tokens=8)
        s.add(a)
        s.add(b)
        preempted = preemptions(s)
        assert (preempted[0], a.num_output, b.num_output) == ("b", 8, 8)
        assert (1, s.stats.preemptions) == (b.num_preemptions, 1)

    def test_preempted_request_keeps_its_output(self) -> None:
        """Recompute preemption keeps generated tokens; the whole sequence is prefilled again."""
        s = make(blocks=5, block_size=4)
        a, b = req("a", 7, max_tokens=8), req("b", 7, max_tokens=8)
        s.add(a)
        s.add(b)
        now = 0.0
        while not b.num_preemptions:
            plan = s.schedule(now)
            s.finish_step(plan, now)
        out_before = b.num_output
        assert (0, out_before >= 1, s.waiting_snapshot()) == (b.num_computed, True, ["b"])

    def test_preempted_request_goes_to_front(self) -> None:
        """A preempted request is put ahead of requests that arrived before its preemption."""
        s = make(blocks=5, block_size=4, max_seqs=2)
        s.add(req("a", 7, max_tokens=8))
        s.add(req("b", 7, max_tokens=8))
        s.add(req("c", 2))
        while not s.stats.preemptions:
            s.finish_step(s.schedule(0.0), 0.0)
        assert s.waiting_snapshot() == ["b", "c"]


class TestPrefixCache:
    """Prefix cache hits in the batcher."""

    def test_second_identical_prompt_hits(self) -> None:
        """A repeated prompt reuses the cached full blocks, minus the last token's block."""
        s = make(block_size=4)
        prompt = list(range(500, 516))
        a, b = req("a", prompt), req("b", prompt)
        s.add(a)
        run(s)
        s.add(b)
        plan = s.schedule(1.0)
        assert (b.num_cached_tokens, plan.prefill_tokens, s.stats.prefix_hits) == (12, 4, 12)
        assert s.stats.prefix_queries == 32

    def test_generated_tokens_are_cached_too(self) -> None:
        """A follow-up whose prompt contains the previous reply hits the decode blocks."""
        s = make(block_size=4)
        a = req("a", 8, max_tokens=9)  # 17 tokens, the last never computed: 4 full blocks
        s.add(a)
        run(s)
        follow = req("b", [*a.token_ids, 7, 7, 7, 7])
        s.add(follow)
        s.schedule(1.0)
        assert follow.num_cached_tokens == 16

    def test_cached_tokens_cost_nothing(self) -> None:
        """Only uncached prompt tokens are counted as prefill work."""
        s = make(block_size=4)
        prompt = list(range(500, 540))
        s.add(req("a", prompt))
        run(s)
        s.add(req("b", prompt))
        assert s.schedule(1.0).prefill_tokens == 4


class TestOutput:
    """Generated tokens by seed and stop rules."""

    def test_same_seed_same_tokens(self) -> None:
        """Two requests with the same seed generate the same ids."""
        s = make()
        a, b = req("a", seed=7, max_tokens=20), req("b", seed=7, max_tokens=20)
        s.add(a)
        s.add(b)
        run(s)
        assert a.output_ids() == b.output_ids()

    def test_different_seed_different_tokens(self) -> None:
        """Different seeds generate different text."""
        s = make()
        a, b = req("a", seed=7, max_tokens=20), req("b", seed=8, max_tokens=20)
        s.add(a)
        s.add(b)
        run(s)
        assert a.output_ids() != b.output_ids()

    def test_natural_stop_ends_with_end(self) -> None:
        """Without ignore_eos a reply stops with END and finish_reason 'stop'."""
        s = make(max_len=2000)
        r = req("a", max_tokens=1000, ignore_eos=False, seed=mix_seed(3, 0))
        s.add(r)
        run(s, steps=2000)
        assert ("stop", tokenizer.END, r.eos_at) == (
            r.finish_reason,
            r.token_ids[-1],
            r.num_output,
        )
        assert 32 <= r.num_output <= 512

    def test_min_tokens_delays_the_stop(self) -> None:
        """min_tokens holds END back until that many tokens were generated."""
        r = SimRequest("a", [1, 2], arrival_s=0, max_tokens=900, seed=5, min_tokens=600)
        assert r.eos_at == 600


class TestAbort:
    """Aborted requests free their blocks."""

    def test_abort_frees_blocks_and_counts(self) -> None:
        """An aborted request releases its blocks and counts as finished 'abort'."""
        s = make()
        r = req("a", 8)
        s.add(r)
        s.schedule(0.0)
        s.abort(r, reason="abort", now=0.1)
        assert (s.kv.num_free_blocks, s.num_running, s.stats.finished["abort"]) == (99, 0, 1)

    def test_abort_during_step_is_skipped(self) -> None:
        """A request aborted while its step runs gets no token."""
        s = make()
        r = req("a", 8)
        s.add(r)
        plan = s.schedule(0.0)
        s.abort(r, reason="error", now=0.0)
        assert (s.finish_step(plan, 0.1), r.num_output) == ([], 0)

    def test_abort_waiting(self) -> None:
        """A waiting request can be aborted too."""
        s = make(max_seqs=1)
        a, b = req("a"), req("b")
        s.add(a)
        s.add(b)
        s.schedule(0.0)
        s.abort(b, reason="abort", now=0.0)
        assert (s.num_waiting, b.finish_reason) == (0, "abort")


class TestStats:
    """The batcher's counters."""

    def test_counters_after_one_request(self) -> None:
        """Prompt and generation tokens and the finish reason are counted once."""
        s = make()
        s.add(req("a", 8, max_tokens=3))
        run(s)
        st = s.stats
        assert (
            st.prompt_tokens,
            st.generation_tokens,
            st.finished["length"],
            st.hist["ttft"].count,
        ) == (8, 3, 1, 1)
