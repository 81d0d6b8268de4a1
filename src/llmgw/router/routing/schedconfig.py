"""The scheduler's settings (scheduler.py): each with why it has its value.

Apart from the scheduler only to keep each module short; the scheduler re-exports
both names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    # Batch capacity assumed until an engine has been seen running more at once:
    # a fresh engine that ran 2 requests has not shown its limit, and dividing by
    # 2 would make it look overloaded (capacity = max(learned, this)).
    default_capacity: int = 8
    # Total at or above which an endpoint is saturated: a new request would
    # queue. Pool preference moves down a priority only when all above are.
    saturated_load: float = 1.0
    # Added to a stale endpoint's total (no fresh scrape): as much as one full
    # batch. Scored down, never dropped — a replica whose metrics port broke may
    # serve perfectly well.
    stale_penalty: float = 1.0
    # The engine's KV usage is not part of the total. It is a sample from the last
    # scrape (up to scrape_interval_s old), and with shared prefixes it is mostly the
    # prefix every running request pins once, not what a new request would add; an
    # engine short of KV shows it where the load sees it, as waiting requests, and
    # the load is corrected by the live in-flight count. Counted as pressure above
    # 0.8 (as it was), bench/routing.py's 24 KiB preamble past capacity: an engine
    # whose batch had just finished looked full for the rest of the scrape interval
    # while the others queued, and p99 TTFT was several times the oracle's (the
    # figures: bench/RESULTS.md, "Figures once quoted in the router's source").
    # How far (in total-score units, 1.0 = a full batch) the longest prefix holder
    # may be above the least loaded candidate and still win; at the bound it loses.
    # A full batch: below it the holder admits the request at its next step, so
    # staying costs a slightly slower step, while leaving costs a whole prefill on
    # a replica that must also pin a second copy of the prefix (evicting what it
    # held). At half a batch, bench/routing.py's cache-starved variant sent holders'
    # requests to cold replicas at moderate load (a lower hit rate than the oracle's,
    # a longer p99 TTFT); at a full batch it matched the oracle, and past capacity
    # stayed bounded (the figures: bench/RESULTS.md, as above).
    affinity_load_bound: float = 1.0
    # A holder's bound is affinity_load_bound × min(1, gain / full_gain_at), gain
    # being the share of the prompt it holds beyond what every candidate holds
    # (Ours computes it; 1.0 when not given). bench/routing.py --suite, the 24 KiB
    # shared preamble past capacity: with the full bound for a holder whose extra
    # was only a small system prompt, requests piled onto its holders (p99 TTFT
    # several times the oracle's). At 0.5 the bound went the other way: a holder of
    # that system prompt got a quarter of a batch, the rest went to engines without
    # it, each engine ran more distinct system prompts at once than its KV cache
    # holds, and requests queued for blocks. At 0.25, close to the oracle (the
    # figures: bench/RESULTS.md, as above). The cut is for a holder that would queue
    # the request: one with room to start it now (no wait, the rest of the prompt
    # fitting its free KV) and a known saving keeps the whole bound, since staying
    # costs a slightly slower step and leaving a whole system prompt's prefill
    # (bench/RESULTS.md, issue 35: preamble-24k at 85 %).
    full_gain_at: float = 0.25
    # How far the rendezvous home of an unseen prefix may be above the least
    # loaded; smaller than the affinity bound, as nothing is cached there yet.
    home_load_bound: float = 0.25
    # How far the endpoint that served the request's session last may be above the
    # content's own choice (an equally long holder) and still take the request: by
    # default not at all, so the hint breaks ties of load as well as of prefix. What
    # it can add is the conversation's tail the blocks are too coarse to show, at most
    # a block (a sixteenth of the prefix past the first KiB) and usually a few hundred
    # bytes of a prompt of kilobytes: scaled like a holder's bound (affinity_load_bound
    # x gain / full_gain_at) that is a few hundredths of a batch. bench/routing.py with
    # `user` hints: the whole affinity bound or a quarter batch lengthened p99 TTFT,
    # ties only did no worse than no hints (the figures: bench/RESULTS.md, as above).
    session_load_bound: float = 0.0
    # Matches shorter than this many blocks do not count as holding the prefix
    # (a few blocks of shared boilerplate are not worth a detour).
    min_prefix_blocks: int = 1
    # Streamed requests awaiting their first token (`Snapshot.pending`) count this
    # many times more: they are queued or in prefill at the engine, ahead of a new
    # request, and the router sees them live where the engine's `waiting` is a
    # scrape old.
    pending_weight: float = 1.0
    # A holder within the bound whose queue would cost more seconds than recomputing
    # its extra prefix on the least loaded (`wait_s`, the prefill cost learned from
    # the engines) loses it. bench/routing.py's decode-heavy variants: answers that
    # hold a slot for seconds made a queue the request-count bound allowed cost
    # seconds; the prefix it saved cost a few hundred milliseconds elsewhere.
    weigh_queue_time: bool = True


DEFAULT_CONFIG: Final = SchedulerConfig()
