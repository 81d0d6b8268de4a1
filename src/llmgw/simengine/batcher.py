"""Continuous batching, after vLLM V1's scheduler (chunked prefill, recompute preemption).

`--scheduling-policy` is vLLM's: `fcfs` (the default) serves the waiting
queue in arrival order; `priority` serves it by (priority, arrival), lower
first, each request's `priority` an integer (default 0). The queues are in
waiting.py.

One step:
1. Running requests first, in order: each gets the tokens it still has to
   compute (1 when decoding; the rest of its prompt, capped by the step's token
   budget, when prefilling). If its blocks cannot grow, a victim is preempted
   (its blocks freed, its tokens recomputed later) until they can, or until the
   request itself is the victim. Under fcfs the victim is the newest running
   request and goes back to the front of the waiting queue; under priority it
   is the running request with the largest (priority, arrival), and goes back
   to its place in the queue. A priority victim already given tokens this step
   (one before the request in the running order) gives them back to the budget.
2. Then, if nothing was preempted, waiting requests in queue order while the
   budget lasts and fewer than `max_num_seqs` run: a new request first takes
   its longest cached prefix, then needs blocks for the rest. The head of the
   queue that does not fit blocks everyone behind it, as in vLLM; a request
   that arrived after the step began is not in the queue yet (waiting.py).
   With LoRA on (`max_loras`), a request naming an adapter beyond the
   `max_loras` distinct ones the batch already uses is passed over for this
   step, not blocking those behind it, and keeps its place (vLLM's
   `scheduled_loras` check); requests of the base model never count.
3. After the step's time has passed (`finish_step`), every request whose known
   tokens are all computed samples one token.

Output tokens
    Deterministic per request: `seed` (the request's, else a fingerprint of its
    prompt, mixed with the engine's --seed) drives a 64-bit LCG
    (`x = x * 6364136223846793005 + 1442695040888963407 mod 2**64`); token k is
    `OUTPUT_IDS[x_k >> 58]`. The reply ends with END (finish_reason "stop") after
    `32 + seed_mix % 481` tokens (32..512) unless `ignore_eos` is set, not before
    `min_tokens`; it ends with "length" at `max_tokens` or at the context limit, and
    with "stop" at a token that completes one of its stop strings, once past
    `min_tokens` (stops.py). A reply whose text is fixed (`script`, structured output)
    is that text's tokens, then END; past it, with `ignore_eos`, the words again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from llmgw.simengine import tokenizer
from llmgw.simengine.kvcache import KVCache, extend_block_hashes
from llmgw.simengine.stats import EngineStats
from llmgw.simengine.stops import StopScan
from llmgw.simengine.waiting import FcfsQueue, PriorityQueue, WaitingQueue

_MASK = (1 << 64) - 1
_LCG_A = 6364136223846793005
_LCG_C = 1442695040888963407
MIN_NATURAL_TOKENS = 32
MAX_NATURAL_TOKENS = 512
# vLLM's --scheduling-policy values.
FCFS = "fcfs"
PRIORITY = "priority"
SCHEDULING_POLICIES = (FCFS, PRIORITY)


def mix_seed(seed: int, engine_seed: int) -> int:
    """A 64-bit starting state from a request seed and the engine's seed (splitmix64)."""
    z = (seed * 0x9E3779B97F4A7C15 + engine_seed + 0x632BE59BD9B4E019) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class SimRequest:
    """One request's state inside the engine. Times are monotonic seconds."""

    __slots__ = (
        "adapter",
        "arrival_s",
        "block_hashes",
        "eos_at",
        "finish_reason",
        "finished_s",
        "first_scheduled_s",
        "first_token_s",
        "ignore_eos",
        "last_token_s",
        "max_tokens",
        "min_tokens",
        "num_cached_tokens",
        "num_computed",
        "num_preemptions",
        "num_prompt",
        "params_max_tokens",
        "params_n",
        "priority",
        "req_id",
        "rng",
        "script",
        "status",
        "stop_reason",
        "stop_scan",
        "text_end",
        "token_ids",
    )

    def __init__(
        self,
        req_id: str,
        prompt_ids: list[int],
        *,
        arrival_s: float,
        max_tokens: int,
        seed: int,
        ignore_eos: bool = False,
        min_tokens: int = 0,
        params_max_tokens: int | None = None,
        priority: int = 0,
        adapter: str | None = None,
        params_n: int | None = 1,
        stop: StopScan | None = None,
        script: str | None = None,
    ) -> None:
        self.req_id = req_id
        self.priority = priority  # lower is served first under the priority policy
        # The LoRA adapter it names (lora.py); None: the base model.
        self.adapter = adapter
        self.token_ids = list(prompt_ids)  # prompt, then generated ids as they come
        self.num_prompt = len(prompt_ids)
        self.arrival_s = arrival_s
        self.max_tokens = max_tokens
        self.params_max_tokens = params_max_tokens  # as the client sent it; None: not given
        # The request's `n`, observed once per request: None for choices after the first.
        self.params_n = params_n
        self.ignore_eos = ignore_eos
        self.rng = seed & _MASK
        span = MAX_NATURAL_TOKENS - MIN_NATURAL_TOKENS + 1
        self.eos_at = max(MIN_NATURAL_TOKENS + self.rng % span, min_tokens)
        # A reply whose text is fixed (structured output): its pieces, then END.
        self.script = _pieces(script) if script is not None else None
        if self.script is not None:
            self.eos_at = max(len(self.script) + 1, min_tokens)
        self.min_tokens = min_tokens
        self.stop_scan = stop  # its stop strings; None: none
        self.stop_reason: str | None = None  # the stop string that ended it
        self.text_end: int | None = None  # characters of output text kept; None: all
        self.status = Status.WAITING
        self.num_computed = 0
        self.block_hashes: list[bytes] = []
        self.num_cached_tokens: int | None = None  # None: not scheduled yet
        self.num_preemptions = 0
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.finished_s: float | None = None
        self.finish_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt

    def output_ids(self, start: int = 0) -> list[int]:
        return self.token_ids[self.num_prompt + start :]

    def text_of(self, start: int = 0, end: int | None = None) -> str:
        """The text of output tokens `start` to `end` (to the last when None), uncut."""
        out = self.token_ids[self.num_prompt :]
        end = len(out) if end is None else end
        script = self.script
        if script is None:
            return tokenizer.output_text(out[start:end])
        return "".join(
            script[j] if j < len(script) and out[j] != tokenizer.END else ""
            for j in range(start, end)
        )

    def output_text(self) -> str:
        """The reply's text: cut where a stop string ended it."""
        text = self.text_of()
        return text if self.text_end is None else text[: self.text_end]

    def _hit_stop(self, token: int) -> bool:
        """Whether `token`, just generated, completes a stop string."""
        scan = self.stop_scan
        if scan is None:
            return False
        n = self.num_output
        found = scan.feed(self.text_of(n - 1, n), check=n > self.min_tokens)
        if found is None:
            return False
        self.stop_reason, self.text_end = found
        return True

    def _next_id(self) -> int:
        self.rng = (self.rng * _LCG_A + _LCG_C) & _MASK
        k, script = self.num_output, self.script
        if script is not None and k < len(script):
            return tokenizer.piece_id(script[k])
        return tokenizer.OUTPUT_IDS[self.rng >> 58]


@dataclass(slots=True)
class StepPlan:
    """What one step computes: (request, tokens) pairs and the step's cost drivers."""

    scheduled: list[tuple[SimRequest, int]] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_seqs: int = 0
    preempted: list[SimRequest] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs


class Scheduler:
    """The waiting queue, the running batch and the step rules above; pure (no I/O, no clock)."""

    def __init__(
        self,
        *,
        kv: KVCache,
        stats: EngineStats,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        policy: str = FCFS,
        max_loras: int | None = None,
    ) -> None:
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling policy must be one of {', '.join(SCHEDULING_POLICIES)}")
        self.kv = kv
        self.stats = stats
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self._by_priority = policy == PRIORITY
        # Distinct adapters one batch may mix (`--max-loras`); None: LoRA off, no limit.
        self.max_loras = max_loras
        self._waiting: WaitingQueue = PriorityQueue() if self._by_priority else FcfsQueue()
        self._running: list[SimRequest] = []
        # False while a sleep in "wait" mode lets the running requests finish: nothing
        # waiting is started (vLLM's paused scheduler), else steady arrivals would keep
        # the engine from ever falling asleep.
        self.admitting = True

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def add(self, req: SimRequest) -> None:
        extend_block_hashes(req.block_hashes, req.token_ids, self.kv.block_size)
        self._waiting.add(req)

    def abort(self, req: SimRequest, *, reason: str, now: float) -> None:
        """Take a request out wherever it is (client gone, injected error); idempotent."""
        if req.status is Status.FINISHED:
            return
        if req.status is Status.RUNNING:
            self._running.remove(req)
        else:
            self._waiting.remove(req)
        self._finish(req, reason, now)

    def schedule(self, now: float) -> StepPlan:
        """Pick the next step's work; `now` is when the step starts."""
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        kv = self.kv
        running = self._running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            while not kv.allocate(
                req.req_id, req.num_computed + n, req.block_hashes, token_ids=req.token_ids
            ):
                if self._by_priority:
                    v = max(range(len(running)), key=lambda j: _rank(running[j]))
                    victim = running.pop(v)
                    if v < i:
                        # Planned earlier in this step: its tokens go back to the budget,
                        # and the request at `i` moved down one place.
                        budget += _unplan(plan, victim)
                        i -= 1
                else:
                    victim = running.pop()
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is req:
                    break
            else:
                self._add_to_plan(plan, req, n)
                budget -= n
                i += 1
                continue
            break
        if plan.preempted:
            return plan
        waiting = self._waiting
        bs = kv.block_size
        loras = self._batch_adapters()
        skipped: list[SimRequest] = []
        while self.admitting and budget > 0 and len(running) < self.max_num_seqs:
            head = waiting.head(now)
            if head is None:
                break  # empty, or nothing there had arrived when this step began (waiting.py)
            req = head
            if loras is not None and self._one_adapter_too_many(req, loras):
                # Passed over for this step, not blocking those behind it.
                skipped.append(waiting.pop_head())
                continue
            hits = kv.lookup(req.block_hashes, req.num_tokens)
            num_hit = len(hits) * bs
            n = min(req.num_tokens - num_hit, budget)
            if not kv.allocate(
                req.req_id, num_hit + n, req.block_hashes, hits, token_ids=req.token_ids
            ):
                break
            waiting.pop_head()
            running.append(req)
            if loras is not None and req.adapter is not None:
                loras.add(req.adapter)
            req.status = Status.RUNNING
            req.num_computed = num_hit
            if req.num_cached_tokens is None:
                # First scheduling only: a preempted request's second lookup is not a query.
                req.num_cached_tokens = num_hit
                self.stats.prefix_queries += req.num_tokens
                self.stats.prefix_hits += num_hit
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now
                self.stats.observe("queue", now - req.arrival_s)
            self._add_to_plan(plan, req, n)
            budget -= n
        for req in reversed(skipped):
            waiting.prepend(req)  # at the front again, in their order
        return plan

    def _one_adapter_too_many(self, req: SimRequest, loras: set[str]) -> bool:
        """Whether `req` names an adapter beyond the `max_loras` the batch mixes."""
        limit = self.max_loras
        return (
            req.adapter is not None
            and req.adapter not in loras
            and limit is not None
            and len(loras) >= limit
        )

    def _batch_adapters(self) -> set[str] | None:
        """The adapters the running batch uses (None: no `max_loras` limit)."""
        if self.max_loras is None:
            return None
        return {r.adapter for r in self._running if r.adapter is not None}

    @staticmethod
    def _add_to_plan(plan: StepPlan, req: SimRequest, n: int) -> None:
        plan.scheduled.append((req, n))
        if _is_decode(req, n):
            plan.decode_seqs += 1
        else:
            plan.prefill_tokens += n

    def _preempt(self, req: SimRequest) -> None:
        self.kv.free(req.req_id)
        req.status = Status.WAITING
        req.num_computed = 0
        req.num_preemptions += 1
        self.stats.preemptions += 1
        self._waiting.prepend(req)

    def finish_step(self, plan: StepPlan, now: float) -> list[SimRequest]:
        """Apply a step that ended at `now`; returns the requests with a new token."""
        out: list[SimRequest] = []
        finished = False
        stats = self.stats
        bs = self.kv.block_size
        for req, n in plan.scheduled:
            if req.status is not Status.RUNNING:
                continue  # aborted while the step ran
            req.num_computed += n
            if req.num_computed < req.num_tokens:
                continue  # a chunk of a longer prefill
            self._sample(req, now)
            if len(req.token_ids) // bs > len(req.block_hashes):
                extend_block_hashes(req.block_hashes, req.token_ids, bs)
            out.append(req)
            if req.finish_reason is not None:
                finished = True
        if finished:
            self._running = [r for r in self._running if r.status is Status.RUNNING]
        stats.steps += 1
        stats.observe("iteration_tokens", plan.num_tokens)
        return out

    def _sample(self, req: SimRequest, now: float) -> None:
        stats = self.stats
        n_out = req.num_output + 1
        eos = not req.ignore_eos and n_out >= req.eos_at
        token = tokenizer.END if eos else req._next_id()
        req.token_ids.append(token)
        stats.generation_tokens += 1
        if req.first_token_s is None:
            req.first_token_s = now
            cached = req.num_cached_tokens or 0
            stats.prompt_tokens += req.num_prompt
            stats.prompt_tokens_cached += cached
            stats.observe("ttft", now - req.arrival_s)
            stats.observe("prefill_kv_computed", req.num_prompt - cached)
        elif req.last_token_s is not None:
            stats.observe("itl", now - req.last_token_s)
        req.last_token_s = now
        if eos or req._hit_stop(token):
            self._finish(req, "stop", now)
        elif n_out >= req.max_tokens or len(req.token_ids) >= self.max_model_len:
            self._finish(req, "length", now)

    def _finish(self, req: SimRequest, reason: str, now: float) -> None:
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.finished_s = now
        self.kv.free(req.req_id)
        s = self.stats
        s.finished[reason] = s.finished.get(reason, 0) + 1
        n_out = req.num_output
        s.observe("e2e", now - req.arrival_s)
        s.observe("prompt_tokens", req.num_prompt)
        s.observe("generation_tokens", n_out)
        s.observe("max_num_generation_tokens", req.max_tokens)
        if req.params_max_tokens is not None:
            s.observe("params_max_tokens", req.params_max_tokens)
        if req.params_n is not None:
            s.observe("params_n", req.params_n)
        s.observe("num_preemptions", req.num_preemptions)
        if req.first_scheduled_s is not None:
            s.observe("inference", now - req.first_scheduled_s)
            if req.first_token_s is not None:
                s.observe("prefill", req.first_token_s - req.first_scheduled_s)
                s.observe("decode", now - req.first_token_s)
                if n_out > 1:
                    s.observe("tpot", (now - req.first_token_s) / (n_out - 1))

    def waiting_snapshot(self) -> list[str]:
        """Waiting request ids in the order they would be served."""
        return self._waiting.ids()

    def running_snapshot(self) -> list[str]:
        return [r.req_id for r in self._running]


def _pieces(text: str) -> tuple[str, ...]:
    """The tokens of `text`, as the sim's tokenizer cuts it."""
    n = tokenizer.PIECE_CHARS
    return tuple(text[i : i + n] for i in range(0, len(text), n))


def _rank(req: SimRequest) -> tuple[int, float]:
    """Lower is served first, higher preempted first (vLLM: (priority, arrival_time))."""
    return req.priority, req.arrival_s


def _is_decode(req: SimRequest, n: int) -> bool:
    return n == 1 and req.num_computed >= req.num_prompt


def _unplan(plan: StepPlan, req: SimRequest) -> int:
    """Take a request's work out of the plan; returns its tokens (0: it had none)."""
    for k, (r, n) in enumerate(plan.scheduled):
        if r is req:
            del plan.scheduled[k]
            if _is_decode(r, n):
                plan.decode_seqs -= 1
            else:
                plan.prefill_tokens -= n
            return n
    return 0
