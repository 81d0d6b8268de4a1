"""The engine's answer checks the index's guess (docs/routing.md).

The prefix index is a guess: what the router sent where, bounded by a capacity
estimate. The engine knows what it really had: vLLM (and the sim-engine)
report `usage.prompt_tokens_details.cached_tokens`, the prompt tokens it found
in its cache. After each successful request the router compares that with the
prefix the index said the chosen endpoint held when it was chosen, counts the
outcome, and corrects the index when the guess was clearly too high
`STREAK` answers in a row from that endpoint (one miss proves little: two
requests with a new prefix dispatched together both miss, as the second is
scheduled before the first's blocks are stored; a queue that waited long
finds its prefix evicted):

- nothing cached where the index expected at least `RESTART_TOKENS`: the
  engine's cache was emptied (restart, reset) or everything the index thought
  it held is gone; the endpoint's entries are forgotten (the chain just served
  is recorded again: the engine holds it now).
- less than half the predicted prefix: the engine evicts sooner than its KV
  capacity suggests (other traffic, other routers, a smaller cache); the
  endpoint's capacity scale drops by `SHRINK` (never below 1/16) and its
  oldest entries are trimmed to match.
- a prediction that held: the scale recovers by `GROW` towards 1.

Tokens are compared through `CHARS_PER_TOKEN` (prefix blocks are bytes), so
only a miss by more than half counts as wrong: a tokenizer a little off the
assumed ratio never triggers a correction. An engine that had more than
predicted (another router's traffic, or the index forgot) is counted as
`under` and changes nothing.

Exported as `llmgw_router_prefix_predictions_total{outcome}` (outcome: hit,
over, under, cleared) and the predicted and reported token sums, so a
dashboard shows how far the guess is from the engines' truth.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.router.routing.blockhash import block_end
from llmgw.router.routing.prefix import PrefixIndex

CHARS_PER_TOKEN = 4.0
# Below this many predicted tokens an empty cache is no evidence of a reset.
RESTART_TOKENS = 256
SHRINK = 0.8
GROW = 1.02
STREAK = 3
_MAX_TRACKED = 4096  # endpoints with a running streak; beyond, the streaks restart
OUTCOMES = ("hit", "over", "under", "cleared")


def predicted_tokens(blocks: int) -> int:
    """Prompt tokens the index's match of `blocks` leading blocks stands for."""
    return 0 if blocks <= 0 else int(block_end(blocks - 1) / CHARS_PER_TOKEN)


class PredictionCheck(Collector):
    """Compares predictions with engine answers, corrects the index, and counts."""

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index
        self.counts = dict.fromkeys(OUTCOMES, 0)
        self.predicted_total = 0
        self.cached_total = 0
        self.corrections = 0
        self._streak: dict[str, int] = {}

    def check(
        self,
        endpoint_id: str,
        hashes: tuple[int, ...],
        predicted_blocks: int,
        cached_tokens: int,
        capacity_units: int | None,
    ) -> str:
        """One answer: the outcome (see the module docstring), the index corrected."""
        predicted = predicted_tokens(predicted_blocks)
        self.predicted_total += predicted
        self.cached_total += cached_tokens
        idx = self.index
        if cached_tokens * 2 < predicted:
            outcome = "cleared" if cached_tokens == 0 and predicted >= RESTART_TOKENS else "over"
            streak = self._streak.get(endpoint_id, 0) + 1
            if streak >= STREAK:
                streak = 0
                self.corrections += 1
                if outcome == "cleared":
                    idx.purge(endpoint_id)
                    idx.record(endpoint_id, hashes, capacity_units=capacity_units)
                else:
                    idx.set_scale(endpoint_id, idx.scale(endpoint_id) * SHRINK)
                    idx.trim(endpoint_id, idx.capacity(endpoint_id, capacity_units))
            if len(self._streak) >= _MAX_TRACKED and endpoint_id not in self._streak:
                self._streak.clear()
            self._streak[endpoint_id] = streak
        else:
            outcome = "under" if predicted * 2 < cached_tokens else "hit"
            self._streak.pop(endpoint_id, None)
            if outcome == "hit" and predicted and idx.scale(endpoint_id) < 1.0:
                idx.set_scale(endpoint_id, idx.scale(endpoint_id) * GROW)
        self.counts[outcome] += 1
        return outcome

    def collect(self) -> Iterator[Metric]:
        preds = CounterMetricFamily(
            "llmgw_router_prefix_predictions",
            "Requests whose cached prompt tokens (engine's usage) were compared with the "
            "prefix index's prediction, by outcome: hit (within 2x), over (index predicted "
            "more), under (engine had more), cleared (engine had nothing; index reset).",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            preds.add_metric([outcome], float(self.counts[outcome]))
        yield preds
        yield CounterMetricFamily(
            "llmgw_router_prefix_predicted_tokens",
            "Prompt tokens the prefix index predicted cached, over compared requests.",
            value=float(self.predicted_total),
        )
        yield CounterMetricFamily(
            "llmgw_router_prefix_cached_tokens",
            "Prompt tokens the engines reported cached, over the same requests.",
            value=float(self.cached_total),
        )
        yield CounterMetricFamily(
            "llmgw_router_prefix_corrections",
            "Times the prefix index was corrected after the engines' answers disagreed.",
            value=float(self.corrections),
        )
