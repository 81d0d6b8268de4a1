"""Metric names, help texts and buckets of the engines the sim-engine impersonates.

Copied as facts from the engines' own scrapes, kept in
tests/fixtures/engine-metrics/ (vllm-v1.txt, sglang.txt). Histograms are
keyed by a logical name the scheduler observes (`stats.EngineStats.observe`).
"""

from __future__ import annotations

from collections.abc import Mapping

# --- vLLM V1 ------------------------------------------------------------------


def _b(spec: str) -> tuple[float, ...]:
    """Bucket bounds from a space-separated list (compact, and copy-checkable against fixtures)."""
    return tuple(float(x) for x in spec.split())


_LAT_S = _b("0.3 0.5 0.8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920 7680")
_TTFT_S = _b(
    "0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10 20 40 80 160 640 2560"
)
_ITL_S = _b("0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1 2.5 5 7.5 10 20 40 80")
_ITERATION = _b("1 8 16 32 64 128 256 512 1024 2048 4096 8192 16384")


def buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, … up to max_value (vLLM's token-count buckets)."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(float(m * scale))
        scale *= 10


# logical name → (exposed name, help); buckets from `vllm_buckets`.
VLLM_HISTOGRAMS: Mapping[str, tuple[str, str]] = {
    "prompt_tokens": ("vllm:request_prompt_tokens", "Number of prefill tokens processed."),
    "generation_tokens": (
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
    ),
    "iteration_tokens": (
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
    ),
    "max_num_generation_tokens": (
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
    ),
    "params_n": ("vllm:request_params_n", "Histogram of the n request parameter."),
    "params_max_tokens": (
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
    ),
    "ttft": (
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
    ),
    "itl": ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    "tpot": (
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
    ),
    "e2e": ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    "queue": (
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
    ),
    "inference": (
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
    ),
    "prefill": (
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
    ),
    "decode": (
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
    ),
    "prefill_kv_computed": (
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    ),
    "num_preemptions": (
        "vllm:request_num_preemptions",
        "Histogram of number of preemptions per finished request.",
    ),
}


def vllm_buckets(max_model_len: int) -> dict[str, tuple[float, ...]]:
    tokens = buckets_1_2_5(max_model_len)
    return {
        "prompt_tokens": tokens,
        "generation_tokens": tokens,
        "iteration_tokens": _ITERATION,
        "max_num_generation_tokens": tokens,
        "params_n": _b("1 2 5 10 20"),
        "params_max_tokens": tokens,
        "ttft": _TTFT_S,
        "itl": _ITL_S,
        "tpot": _ITL_S,
        "e2e": _LAT_S,
        "queue": _LAT_S,
        "inference": _LAT_S,
        "prefill": _LAT_S,
        "decode": _LAT_S,
        "prefill_kv_computed": tokens,
        "num_preemptions": _b("1 2 3 4 5 10 20"),
    }


VLLM_HELP: Mapping[str, str] = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:num_requests_waiting_by_reason": (
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
        "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
        "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting."
    ),
    "vllm:engine_sleep_state": (
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
        "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."
    ),
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:external_prefix_cache_queries": (
        "External prefix cache queries from KV connector cross-instance cache sharing, in "
        "terms of number of queried tokens."
    ),
    "vllm:external_prefix_cache_hits": (
        "External prefix cache hits from KV connector cross-instance cache sharing, in terms "
        "of number of cached tokens."
    ),
    "vllm:mm_cache_queries": "Multi-modal cache queries, in terms of number of queried items.",
    "vllm:mm_cache_hits": "Multi-modal cache hits, in terms of number of cached items.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:prompt_tokens_by_source": "Number of prompt tokens by source.",
    "vllm:prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:request_success": "Count of successfully processed requests.",
    "vllm:cache_config_info": "Information of the LLMEngine CacheConfig",
}

# --- SGLang ---------------------------------------------------------------------

SGLANG_HISTOGRAMS: Mapping[str, tuple[str, str]] = {
    "queue": ("sglang:queue_time_seconds", "Histogram of queueing time in seconds."),
    "ttft": ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    "itl": ("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    "e2e": (
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
    ),
    "num_preemptions": ("sglang:num_retractions", "Histogram of retraction counts per request."),
}

SGLANG_BUCKETS: Mapping[str, tuple[float, ...]] = {
    "queue": _b(
        "0 0.1 0.2 0.5 1 2 3 4 5 10 15 20 30 40 50 60 70 80 90 100 200 300 400 500 600 700 800 "
        "900 1000 1200 1400 1600 1800 2000 2500 3000"
    ),
    "ttft": _b("0.1 0.2 0.4 0.6 0.8 1 2 4 6 8 10 20 40 60 80 100 200 400"),
    "itl": _b(
        "0.002 0.004 0.006 0.008 0.01 0.015 0.02 0.025 0.03 0.035 0.04 0.06 0.08 0.1 0.2 0.4 "
        "0.6 0.8 1 2 4 6 8"
    ),
    "e2e": _b("0.1 0.2 0.4 0.6 0.8 1 2 4 6 8 10 20 40 60 80 100 200 400 600 1200 1800 2400"),
    "num_preemptions": _b("0 1 2 3 4 5 6 7 8 9 10 15 20 25 30 40 50 75 100"),
}

SGLANG_HELP: Mapping[str, str] = {
    "sglang:num_running_reqs": "The number of running requests.",
    "sglang:num_used_tokens": "The number of used tokens.",
    "sglang:token_usage": "The token usage.",
    "sglang:num_queue_reqs": "The number of requests in the waiting queue.",
    "sglang:cache_hit_rate": "The prefix cache hit rate.",
    "sglang:max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "sglang:prompt_tokens_total": "Number of prefill tokens processed.",
    "sglang:generation_tokens_total": "Number of generation tokens processed.",
    "sglang:cached_tokens_total": "Number of cached prompt tokens.",
    "sglang:num_requests_total": "Number of requests processed.",
    "sglang:num_aborted_requests_total": "Number of requests aborted.",
}


def histogram_buckets(dialect: str, max_model_len: int) -> dict[str, tuple[float, ...]]:
    """The histograms a dialect exposes, by logical name, with their buckets."""
    if dialect == "sglang":
        return dict(SGLANG_BUCKETS)
    return vllm_buckets(max_model_len)
