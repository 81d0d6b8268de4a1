"""Engine /metrics → `Stats`, reading only the lines the router needs (DESIGN §2.3).

A vLLM scrape is tens of kilobytes, nearly all histogram buckets the router
never looks at; TGI's is over a hundred. A general Prometheus parser builds
every one of those samples (and `prometheus_client.parser` also renames TGI's
counters, ENGINES.md §7.2). Here each wanted series is found with `bytes.find`
for "\\n<name>" — a C-speed scan — and only its own line is decoded, so the
cost is a handful of scans of the buffer and a dozen short lines, whatever the
histograms hold (bench/enginemetrics.py: ~100× faster than prometheus_client).

Matching is on the exact exposed name, `_total` included as written, followed
by `{` or a blank; so `_bucket`/`_sum`/`_count`/`_created` series and longer
names sharing a prefix (`vllm:num_requests_waiting_by_reason`) never match, and
the TGI `_sum`s that are wanted are asked for by their full names.

Aggregation across label sets (vLLM `engine`, SGLang `dp_rank`): counts and
counters are summed; KV usage takes the maximum — the most loaded engine is the
one a new request may meet, and the mean would hide it (vLLM's own log line
uses the mean; ENGINES.md §7.4).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

from llmgw.router.endpoint import Stats


class MetricsParseError(ValueError):
    """The scrape lacks a mandatory figure or has one that is not a number."""


# Every `engine` value an EndpointInfo may carry ("" means vLLM's names).
ENGINES = frozenset({"", "vllm", "sglang", "llamacpp", "llama.cpp", "tgi"})

# After the name: an optional label set (quotes may hold `}`, `,` or blanks),
# blanks, the value; an optional timestamp after it is ignored.
_TAIL = re.compile(rb'(\{(?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*\})?[ \t]+([^ \t\r\n]+)')
_LABEL = re.compile(rb'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')


def _lines(buf: bytes, name: bytes) -> Iterator[tuple[bytes | None, bytes]]:
    """(label set or None, value) of every sample line of exactly `name`."""
    needle = b"\n" + name
    skip = len(needle)
    if buf.startswith(name):
        pos = -1  # as if a newline stood before the buffer
    else:
        pos = buf.find(needle)
        if pos == -1:
            return
    while True:
        m = _TAIL.match(buf, pos + skip)
        if m is not None:
            yield m.group(1), m.group(2)
        pos = buf.find(needle, pos + skip)
        if pos == -1:
            return


def _value(raw: bytes, name: bytes) -> float:
    try:
        return float(raw)
    except ValueError:
        raise MetricsParseError(f"{name.decode()}: not a number: {raw[:40]!r}") from None


def _values(buf: bytes, name: bytes) -> list[float]:
    return [_value(raw, name) for _labels, raw in _lines(buf, name)]


def _sum(buf: bytes, name: bytes) -> float | None:
    """Sum over every label set; None when the series is absent."""
    vals = [v for v in _values(buf, name) if not math.isnan(v)]
    return math.fsum(vals) if vals else None


def _max_fraction(buf: bytes, name: bytes) -> float | None:
    """Largest finite value over label sets, clamped to 0..1; None when absent."""
    vals = [v for v in _values(buf, name) if math.isfinite(v)]
    return min(1.0, max(0.0, max(vals))) if vals else None


def _count(buf: bytes, name: bytes) -> int:
    """A mandatory gauge summed over label sets, as a whole number of requests."""
    total = _sum(buf, name)
    if total is None or not math.isfinite(total):
        raise MetricsParseError(f"mandatory metric {name.decode()} is missing")
    return round(total)


def _as_int(v: float | None) -> int | None:
    return None if v is None or not math.isfinite(v) else round(v)


def samples(text: bytes | str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of exactly `name` with its labels, in file order (tests, debugging)."""
    buf = text.encode() if isinstance(text, str) else text
    key = name.encode()
    out = []
    for labels, raw in _lines(buf, key):
        parsed = {k.decode(): v.decode() for k, v in _LABEL.findall(labels or b"")}
        out.append((parsed, _value(raw, key)))
    return out


def parse(text: bytes | str, engine: str = "") -> Stats:
    """Read one /metrics body with the names of `engine` (one of ENGINES)."""
    buf = text.encode() if isinstance(text, str) else text
    if engine in ("", "vllm"):
        return _vllm(buf)
    if engine == "sglang":
        return _sglang(buf)
    if engine in ("llamacpp", "llama.cpp"):
        return _llamacpp(buf)
    if engine == "tgi":
        return _tgi(buf)
    raise MetricsParseError(f"unknown engine {engine!r}; expected one of {sorted(ENGINES)}")


def _vllm(buf: bytes) -> Stats:
    kv = _max_fraction(buf, b"vllm:kv_cache_usage_perc")
    if kv is None:
        # vLLM ≤ 0.9.1 (and V0) only has the old name; 0.9.2–0.11 have both, equal.
        kv = _max_fraction(buf, b"vllm:gpu_cache_usage_perc")
    block_size, num_gpu_blocks, capacity = _vllm_cache_config(buf)
    return Stats(
        running=_count(buf, b"vllm:num_requests_running"),
        waiting=_count(buf, b"vllm:num_requests_waiting"),
        kv_usage=kv,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        prompt_tokens=_sum(buf, b"vllm:prompt_tokens_total"),
        generation_tokens=_sum(buf, b"vllm:generation_tokens_total"),
        # Every finished_reason, abort and error included: each one left the engine.
        success_total=_sum(buf, b"vllm:request_success_total"),
        kv_capacity_tokens=capacity,
    )


def _label(labels: bytes, key: bytes) -> int | None:
    """An integer label value (vLLM renders config values as strings, "None" when unset)."""
    m = re.search(rb"[{,]" + key + rb'="([0-9]+)"', labels)
    return int(m.group(1)) if m else None


def _vllm_cache_config(buf: bytes) -> tuple[int | None, int | None, int | None]:
    """block_size, num_gpu_blocks per engine, and the endpoint's KV capacity in tokens.

    `num_gpu_blocks` is per DP engine, as vLLM reports it (ENGINES.md §2.2); when
    engines disagree the smallest is kept, the capacity any one engine surely
    has. The capacity sums blocks × block size over engines: the API server
    spreads requests over all of them, so together they hold that many tokens.
    The gauge appears only after engine start-up; until then all three are None.
    """
    per_engine: dict[bytes, tuple[int, int | None]] = {}
    for labels, _raw in _lines(buf, b"vllm:cache_config_info"):
        if labels is None:
            continue
        blocks = _label(labels, b"num_gpu_blocks")
        if blocks is None:
            continue
        m = re.search(rb'[{,]engine="([^"]*)"', labels)
        # Keyed by engine: multiprocess mode may repeat a label set per process.
        per_engine[m.group(1) if m else b""] = (blocks, _label(labels, b"block_size"))
    if not per_engine:
        return None, None, None
    block_size = next((bs for _b, bs in per_engine.values() if bs is not None), None)
    num_gpu_blocks = min(b for b, _bs in per_engine.values())
    capacity = None
    if block_size is not None:
        capacity = sum(b * (bs or block_size) for b, bs in per_engine.values())
    return block_size, num_gpu_blocks, capacity


def _sglang(buf: bytes) -> Stats:
    return Stats(
        running=_count(buf, b"sglang:num_running_reqs"),
        waiting=_count(buf, b"sglang:num_queue_reqs"),
        kv_usage=_max_fraction(buf, b"sglang:token_usage"),
        # No blocks: the KV pool is counted in tokens (page size is a server argument).
        kv_capacity_tokens=_as_int(_sum(buf, b"sglang:max_total_num_tokens")),
        prompt_tokens=_sum(buf, b"sglang:prompt_tokens_total"),
        generation_tokens=_sum(buf, b"sglang:generation_tokens_total"),
        success_total=_sum(buf, b"sglang:num_requests_total"),
    )


def _llamacpp(buf: bytes) -> Stats:
    # Values are C++ %g (6 significant digits): large counters are approximate,
    # but still never decrease, so restart detection holds.
    return Stats(
        running=_count(buf, b"llamacpp:requests_processing"),
        waiting=_count(buf, b"llamacpp:requests_deferred"),
        # Removed in May 2025 (llama.cpp PR #13660); older builds still have it.
        kv_usage=_max_fraction(buf, b"llamacpp:kv_cache_usage_ratio"),
        prompt_tokens=_sum(buf, b"llamacpp:prompt_tokens_total"),
        generation_tokens=_sum(buf, b"llamacpp:tokens_predicted_total"),
        # No finished-request counter exists.
        success_total=None,
    )


def _tgi(buf: bytes) -> Stats:
    budget = _sum(buf, b"tgi_batch_max_total_tokens")
    batch_tokens = _sum(buf, b"tgi_batch_current_max_tokens")
    kv = None
    if budget is not None and batch_tokens is not None and budget > 0:
        # TGI has no KV gauge; the running batch's token reservation over the
        # warm-up token budget is the closest proxy (ENGINES.md §5).
        kv = min(1.0, max(0.0, batch_tokens / budget))
    return Stats(
        running=_count(buf, b"tgi_batch_current_size"),
        waiting=_count(buf, b"tgi_queue_size"),
        kv_usage=kv,
        kv_capacity_tokens=_as_int(budget),
        # Counters carry no _total suffix; token totals are histogram sums.
        prompt_tokens=_sum(buf, b"tgi_request_input_length_sum"),
        generation_tokens=_sum(buf, b"tgi_request_generated_tokens_sum"),
        success_total=_sum(buf, b"tgi_request_success"),
    )
