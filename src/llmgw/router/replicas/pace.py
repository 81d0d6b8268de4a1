"""What two scrapes of one engine say about its pace: drain rate and prefill cost.

Pure: the registry (registry.py) hands over the previous and the new scrape and
keeps what comes back. Both figures are exponentially smoothed (`ALPHA`), so one
interval with an odd mix of requests moves them only part of the way.

- Drain rate: finished requests per second (AIBrix's load signal). 0.0 until two
  scrapes with a finished-request counter have been seen; it breaks ties.
- Decode rate: tokens per second one running sequence gets (the generated-token
  counter's rate over the mean of the two scrapes' running): the engine's step rate,
  whatever its load. The scheduler turns the decode its requests still owe into the
  seconds a queue there costs with it. The drain rate cannot: it is the engine's
  throughput, which below saturation is far less than how fast a full batch turns
  over, and a queue priced at it looks several times longer than it is.
- Prefill cost: seconds of prefill per prompt token the engine computed (not found
  in its prefix cache): the prefill-time histogram's sum over the prompt tokens less
  the cache hits, over the same interval. What recomputing a prefix on another
  engine costs, learned from the engines instead of a calibration job. None until
  an interval with prefill work has been seen, and always for engines that do not
  export the three counters (then the scheduler places by counts alone).
"""

from __future__ import annotations

from typing import Final

from llmgw.router.replicas.stats import Stats

# Exponential smoothing factor of both rates (seed: alpha = 0.3).
ALPHA: Final = 0.3
# Fewer computed prompt tokens than this in an interval teach nothing: the few
# requests that prefilled in it may have waited in a batch of decodes.
MIN_PREFILL_TOKENS: Final = 64.0


def went_backwards(old: Stats | None, new: Stats) -> bool:
    """Whether any counter decreased: the engine restarted.

    The seed watched only the finished-request counter; llama.cpp has none, so
    the token counters count too. %g rounding (llama.cpp) is monotonic and can
    never make a counter decrease.
    """
    if old is None:
        return False
    for a, b in (
        (old.success_total, new.success_total),
        (old.prompt_tokens, new.prompt_tokens),
        (old.generation_tokens, new.generation_tokens),
    ):
        if a is not None and b is not None and b < a:
            return True
    return False


def drain_rate(rate: float, before: Stats, after: Stats, dt: float) -> float:
    """The smoothed finished-requests rate after one more interval of `dt` seconds."""
    b, a = before.success_total, after.success_total
    if dt <= 0 or b is None or a is None:
        return rate
    return ALPHA * (a - b) / dt + (1 - ALPHA) * rate


def decode_rate(rate: float, before: Stats, after: Stats, dt: float) -> float:
    """The smoothed tokens per second per running sequence after one more interval."""
    g0, g1 = before.generation_tokens, after.generation_tokens
    running = (before.running + after.running) / 2
    if dt <= 0 or g0 is None or g1 is None or g1 <= g0 or running < 1:
        return rate
    sample = (g1 - g0) / dt / running
    return sample if rate <= 0 else ALPHA * sample + (1 - ALPHA) * rate


def prefill_cost(cost: float | None, before: Stats, after: Stats) -> float | None:
    """The smoothed seconds of prefill per computed prompt token (module docstring)."""
    values = (
        before.prefill_seconds,
        after.prefill_seconds,
        before.prompt_tokens,
        after.prompt_tokens,
        before.prefix_hit_tokens,
        after.prefix_hit_tokens,
    )
    if any(v is None for v in values):
        return cost
    s0, s1, p0, p1, h0, h1 = (float(v or 0.0) for v in values)
    computed = (p1 - p0) - (h1 - h0)
    seconds = s1 - s0
    if computed < MIN_PREFILL_TOKENS or seconds <= 0:
        return cost
    sample = seconds / computed
    return sample if cost is None else ALPHA * sample + (1 - ALPHA) * cost
