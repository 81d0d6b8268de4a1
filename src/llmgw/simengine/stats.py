"""What the engine counts, in plain values; `metrics` renders it in a dialect's names.

Counters start at zero with the process: a restarted engine's counters go
backwards, which is how the router detects a restart.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping

# vLLM V1 pre-creates these finished_reason label values.
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class Histogram:
    """Prometheus-style histogram: `counts[i]` = observations ≤ buckets[i] and > buckets[i-1]."""

    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: Iterable[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """Record `value` n times (a whole batch's identical inter-token gap at once)."""
        self.counts[bisect_left(self.buckets, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[int]:
        out, total = [], 0
        for c in self.counts:
            total += c
            out.append(total)
        return out


class EngineStats:
    """Counters and histograms the scheduler updates as requests move through it."""

    def __init__(self, histograms: Mapping[str, Iterable[float]]) -> None:
        # Token counts. prompt_tokens counts every prompt token once per request,
        # cached ones included (vLLM's vllm:prompt_tokens_total).
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self.generation_tokens = 0
        # Prefix-cache lookups of new requests, in tokens.
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preemptions = 0
        self.steps = 0
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        # Logical name → histogram; which exist (and their buckets) is the dialect's choice.
        self.hist = {name: Histogram(b) for name, b in histograms.items()}

    def observe(self, name: str, value: float, n: int = 1) -> None:
        h = self.hist.get(name)
        if h is not None:
            h.observe(value, n)
