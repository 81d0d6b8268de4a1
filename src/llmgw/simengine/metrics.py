"""The /metrics text, rendered directly in the impersonated engine's exposition format.

vLLM (default): what a single-API-server vLLM V1 process prints through
prometheus_client: labels sorted, `engine="0"` and
`model_name` on every engine metric (not on cache_config_info), counters with
`_total` and a `_created` gauge family, values formatted like
`prometheus_client.utils.floatToGoString`. The process-level families
(`python_gc_*`, `process_*`, `http_*`) are left out: nothing reads them.

SGLang: multiprocess-mode layout (no `_created`, histogram `_sum` first),
scheduler labels on gauges and tokenizer labels on counters and histograms.
`sglang:cache_hit_rate` is cumulative hits / queries here (SGLang's is recent).

Rendering by hand keeps prometheus_client out of the sim-engine's import time:
tests and `llmgw up` start many of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.simengine.metricsnames import (
    SGLANG_HELP,
    SGLANG_HISTOGRAMS,
    VLLM_HELP,
    VLLM_HISTOGRAMS,
)
from llmgw.simengine.stats import FINISH_REASONS, EngineStats, Histogram


@dataclass(frozen=True, slots=True)
class EngineView:
    """The gauges at scrape time."""

    running: int
    waiting: int
    kv_usage: float  # 0..1, vLLM semantics (blocks pinned by live requests)
    used_blocks: int
    capacity_blocks: int
    block_size: int
    # sleep.py: "awake", "paused" (level 0), "weights_offloaded" (1), "discard_all" (2).
    sleep_state: str = "awake"
    # GPU memory the engine holds per GPU (sleep.py's model); 0: not modelled.
    gpu_bytes: int = 0


def go_float(v: float) -> str:
    """A number as prometheus_client prints it: `87.0`, `1.84302117e+08`."""
    d = float(v)
    if d == float("inf"):
        return "+Inf"
    if d == float("-inf"):
        return "-Inf"
    if d != d:
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    # Go switches to exponent form sooner than Python: past 7 integer digits.
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def label_value(v: str) -> str:
    """`v` escaped as the text format needs (and prometheus_client does): a bare quote in
    a served name ended the value, and the whole page failed to parse."""
    if "\\" in v or '"' in v or "\n" in v:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return v


def label_str(labels: Mapping[str, str]) -> str:
    return ",".join(f'{k}="{label_value(labels[k])}"' for k in sorted(labels))


class _Out:
    """Accumulates exposition lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, help_: str, kind: str) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Mapping[str, str], value: float) -> None:
        self.lines.append(f"{name}{{{label_str(labels)}}} {go_float(value)}")

    def histogram(
        self, name: str, labels: Mapping[str, str], h: Histogram, *, sum_first: bool = False
    ) -> None:
        if sum_first:
            self.sample(f"{name}_sum", labels, h.sum)
        for bound, total in zip((*h.buckets, float("inf")), h.cumulative(), strict=True):
            self.sample(f"{name}_bucket", {**labels, "le": go_float(bound)}, total)
        self.sample(f"{name}_count", labels, h.count)
        if not sum_first:
            self.sample(f"{name}_sum", labels, h.sum)

    def text(self) -> bytes:
        self.lines.append("")
        return "\n".join(self.lines).encode("utf-8")


def render_vllm(
    stats: EngineStats,
    view: EngineView,
    *,
    model_name: str,
    cache_info: Mapping[str, str],
    created_wall: float,
) -> bytes:
    out = _Out()
    base = {"engine": "0", "model_name": model_name}

    def gauge(name: str, value: float) -> None:
        out.family(name, VLLM_HELP[name], "gauge")
        out.sample(name, base, value)

    def counter(name: str, values: Mapping[tuple[str, str] | None, float]) -> None:
        help_ = VLLM_HELP[name]
        out.family(f"{name}_total", help_, "counter")
        for extra, v in values.items():
            out.sample(f"{name}_total", base if extra is None else {**base, extra[0]: extra[1]}, v)
        out.family(f"{name}_created", help_, "gauge")
        for extra in values:
            labels = base if extra is None else {**base, extra[0]: extra[1]}
            out.sample(f"{name}_created", labels, created_wall)

    gauge("vllm:num_requests_running", view.running)
    gauge("vllm:num_requests_waiting", view.waiting)
    name = "vllm:num_requests_waiting_by_reason"
    out.family(name, VLLM_HELP[name], "gauge")
    out.sample(name, {**base, "reason": "capacity"}, view.waiting)
    out.sample(name, {**base, "reason": "deferred"}, 0)
    name = "vllm:engine_sleep_state"
    out.family(name, VLLM_HELP[name], "gauge")
    for state in ("awake", "weights_offloaded", "discard_all"):
        out.sample(name, {**base, "sleep_state": state}, int(view.sleep_state == state))
    if view.gpu_bytes:
        # Not a vLLM metric: the sim-engine's modelled GPU memory (sleep.py).
        name = "llmgw_sim_gpu_memory_used_bytes"
        out.family(name, "GPU memory the simulated engine holds per GPU.", "gauge")
        out.sample(name, base, view.gpu_bytes)
    gauge("vllm:kv_cache_usage_perc", view.kv_usage)
    s = stats
    counter("vllm:prefix_cache_queries", {None: s.prefix_queries})
    counter("vllm:prefix_cache_hits", {None: s.prefix_hits})
    counter("vllm:external_prefix_cache_queries", {None: 0})
    counter("vllm:external_prefix_cache_hits", {None: 0})
    counter("vllm:mm_cache_queries", {None: 0})
    counter("vllm:mm_cache_hits", {None: 0})
    counter("vllm:num_preemptions", {None: s.preemptions})
    counter("vllm:prompt_tokens", {None: s.prompt_tokens})
    counter(
        "vllm:prompt_tokens_by_source",
        {
            ("source", "local_compute"): s.prompt_tokens - s.prompt_tokens_cached,
            ("source", "local_cache_hit"): s.prompt_tokens_cached,
            ("source", "external_kv_transfer"): 0,
        },
    )
    counter("vllm:prompt_tokens_cached", {None: s.prompt_tokens_cached})
    counter("vllm:generation_tokens", {None: s.generation_tokens})
    counter(
        "vllm:request_success",
        {("finished_reason", r): s.finished.get(r, 0) for r in FINISH_REASONS},
    )
    for key, (name, help_) in VLLM_HISTOGRAMS.items():
        h = s.hist.get(key)
        if h is None:
            continue
        out.family(name, help_, "histogram")
        out.histogram(name, base, h)
        out.family(f"{name}_created", help_, "gauge")
        out.sample(f"{name}_created", base, created_wall)
    name = "vllm:cache_config_info"
    out.family(name, VLLM_HELP[name], "gauge")
    out.sample(name, {**cache_info, "engine": "0"}, 1)
    return out.text()


def render_sglang(stats: EngineStats, view: EngineView, *, model_name: str) -> bytes:
    out = _Out()
    sched = {
        "engine_type": "unified",
        "model_name": model_name,
        "moe_ep_rank": "0",
        "pp_rank": "0",
        "tp_rank": "0",
    }
    tok = {"engine_type": "unified", "model_name": model_name}
    s = stats
    capacity = view.capacity_blocks * view.block_size

    def one(name: str, kind: str, labels: Mapping[str, str], value: float) -> None:
        out.family(name, SGLANG_HELP[name], kind)
        out.sample(name, labels, value)

    queue_name, queue_help = SGLANG_HISTOGRAMS["queue"]
    if "queue" in s.hist:
        out.family(queue_name, queue_help, "histogram")
        out.histogram(queue_name, sched, s.hist["queue"], sum_first=True)
    one("sglang:num_running_reqs", "gauge", sched, view.running)
    one("sglang:num_used_tokens", "gauge", sched, view.used_blocks * view.block_size)
    one("sglang:token_usage", "gauge", sched, view.kv_usage)
    one("sglang:num_queue_reqs", "gauge", sched, view.waiting)
    hit_rate = s.prefix_hits / s.prefix_queries if s.prefix_queries else 0.0
    one("sglang:cache_hit_rate", "gauge", sched, hit_rate)
    one("sglang:max_total_num_tokens", "gauge", sched, capacity)
    one("sglang:prompt_tokens_total", "counter", tok, s.prompt_tokens)
    one("sglang:generation_tokens_total", "counter", tok, s.generation_tokens)
    one("sglang:cached_tokens_total", "counter", tok, s.prompt_tokens_cached)
    one("sglang:num_requests_total", "counter", tok, sum(s.finished.values()))
    one("sglang:num_aborted_requests_total", "counter", tok, s.finished.get("abort", 0))
    for key, (name, help_) in SGLANG_HISTOGRAMS.items():
        if key == "queue" or key not in s.hist:
            continue
        out.family(name, help_, "histogram")
        out.histogram(name, tok, s.hist[key], sum_first=True)
    return out.text()
