"""One scrape of an engine, as the registry keeps it: `Stats`.

What enginemetrics.py reads off an engine's /metrics page, what the registry
derives its load figures from, and what the workers' channel carries to the
other workers (workers/ipc.py). A module of its own, apart from the registry
and the snapshot: the router's config imports enginemetrics.py (its dialects)
before the compiled build is loaded, and must import none of the compiled
modules (compiled.py); msgspec also reads its annotations at run time, which a
compiled module does not keep.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Stats:
    """One scrape, read through the engine metric contract (enginemetrics.py).

    None means the engine does not expose the figure, never zero.
    """

    # Mandatory: requests in the running batch, and waiting for a place in it.
    running: int
    waiting: int
    # Fraction 0..1 of the KV cache pinned by live requests (max across DP engines).
    kv_usage: float | None
    # Tokens per KV block, and KV blocks per engine (vLLM `cache_config_info`).
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    # Raw counters, kept so rates can be derived: prompt and generated tokens, and
    # finished requests.
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    success_total: float | None = None
    # Tokens the endpoint's KV cache holds in all: num_gpu_blocks × block_size
    # summed over DP engines (vLLM), `max_total_num_tokens` (SGLang), or the token
    # budget `tgi_batch_max_total_tokens` (TGI).
    kv_capacity_tokens: int | None = None
    # Raw counters for the engine's prefill speed (pace.py learns seconds per
    # computed prompt token from their rates): seconds spent in prefill (the sum of
    # vLLM's prefill-time histogram) and prompt tokens found in the prefix cache.
    prefill_seconds: float | None = None
    prefix_hit_tokens: float | None = None
