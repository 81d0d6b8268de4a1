"""Pure decisions for `ctl bench` (docs/ctl.md): when to stop ramping, what the weight is.

A replica's capacity is the peak throughput it reached while concurrency
doubled (1, 2, 4, …): continuous batching keeps throughput rising with load
until the batch or the KV cache is full, after which more concurrency only
queues. Throughput is generated tokens per second, not requests per second, so
two runs with different `--max-tokens` still measure the same thing.

Weights are relative within a model: the router divides a replica's load by
its weight, so only the ratios between one model's replicas matter. A replica
benched first gets 1.0; a later one gets its capacity over the mean capacity
of the model's other replicas benched so far (their raw figures are kept by the
controller next to the weight, `ReplicaView.capacity_tok_s`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Ramp stops once the last two levels together gained less than this over the
# best before them: one flat step may be noise, two are a plateau.
MIN_GAIN = 0.05
# …or once median latency is this many times the single-request latency: the
# replica is queueing, and more load only measures the queue.
LATENCY_EXPLODED = 10.0
# …or once this share of a level's requests failed.
MAX_FAILED_SHARE = 0.1


@dataclass(frozen=True, kw_only=True)
class Level:
    """What one concurrency level measured."""

    concurrency: int
    completed: int
    failed: int
    # Generated tokens of completed requests (usage.completion_tokens).
    tokens: int
    # From the first request sent to the last one finished.
    elapsed_s: float
    # Median and 95th percentile of completed requests; None when none completed.
    latency_p50_s: float | None
    latency_p95_s: float | None

    @property
    def tok_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def req_s(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s > 0 else 0.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[rank]


def concurrency_levels(max_concurrency: int) -> list[int]:
    """1, 2, 4, … up to the cap, the cap itself included."""
    levels, c = [], 1
    while c < max_concurrency:
        levels.append(c)
        c *= 2
    levels.append(max(1, max_concurrency))
    return levels


def stop_reason(levels: Sequence[Level]) -> str | None:
    """Why ramping should stop after these levels, or None to go on."""
    if not levels:
        return None
    last = levels[-1]
    sent = last.completed + last.failed
    if sent and last.failed / sent > MAX_FAILED_SHARE:
        return f"{last.failed} of {sent} requests failed at concurrency {last.concurrency}"
    base = levels[0].latency_p50_s
    if base and last.latency_p50_s and last.latency_p50_s > LATENCY_EXPLODED * base:
        return (
            f"median latency {last.latency_p50_s:.2f}s is over {LATENCY_EXPLODED:g}x "
            f"the single-request {base:.2f}s"
        )
    if len(levels) >= 3:
        before = max(level.tok_s for level in levels[:-2])
        recent = max(level.tok_s for level in levels[-2:])
        if recent < before * (1 + MIN_GAIN):
            return f"throughput rose less than {MIN_GAIN:.0%} over two steps"
    return None


def _sent(lv: Level) -> int:
    return lv.completed + lv.failed


def peak(levels: Sequence[Level]) -> Level | None:
    """The level with the highest throughput among those that mostly succeeded."""
    good = [
        lv
        for lv in levels
        if lv.completed and lv.failed <= MAX_FAILED_SHARE * (lv.completed + lv.failed)
    ]
    return max(good, key=lambda lv: lv.tok_s, default=None)


def weight(capacity_tok_s: float, others_tok_s: Sequence[float]) -> float:
    """Capacity over the mean capacity of the model's other benched replicas; 1.0 if none."""
    others = [c for c in others_tok_s if c > 0]
    if not others:
        return 1.0
    return capacity_tok_s / (sum(others) / len(others))
