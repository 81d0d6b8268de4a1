"""Engine /metrics → `Stats`, reading only the lines the router needs.

A vLLM scrape is tens of kilobytes, nearly all histogram buckets the router
never looks at; TGI's is over a hundred. A general Prometheus parser builds
every one of those samples (and `prometheus_client.parser` also renames TGI's
counters). Here one regex pass, anchored on the literal
"\\n<dialect prefix>", finds the few wanted series and decodes only their own
lines, whatever the histograms hold (bench/enginemetrics.py against
prometheus_client; the figures are in bench/RESULTS.md).

Matching is on the exact exposed name, `_total` included as written, followed
by `{` or a blank; so `_bucket`/`_sum`/`_count`/`_created` series and longer
names sharing a prefix (`vllm:num_requests_waiting_by_reason`) never match, and
the TGI `_sum`s that are wanted are asked for by their full names.

Aggregation across label sets (vLLM `engine`, SGLang `dp_rank`): counts and
counters are summed; KV usage takes the maximum — the most loaded engine is the
one a new request may meet, and the mean would hide it (vLLM's own log line
uses the mean).
"""

from __future__ import annotations

import math
import re

from llmgw.router.errors import MetricsParseError
from llmgw.router.replicas.stats import Stats

# Every `engine` value an EndpointInfo may carry ("" means vLLM's names).
ENGINES = frozenset({"", "vllm", "sglang", "llamacpp", "llama.cpp", "tgi"})
# The largest request count or token capacity taken from a scrape (2**53, the largest
# whole number a float holds exactly): past it (or below 0) a count fails the scrape and
# a capacity is unknown. A count of 10**308 requests scraped whole made the load sums
# overflow: an int too large for a float raised OverflowError in the router's scoring.
MAX_FIGURE = 2**53

# After the name: an optional label set (quotes may hold `}`, `,` or blanks),
# blanks, the value; an optional timestamp after it is ignored. The quantifiers
# are possessive (`++`, `*+`): a garbled line fails at once instead of sending the
# regex engine into exponential backtracking on the router's event loop.
_TAIL = rb'(\{(?:[^"}\n]++|"(?:[^"\\\n]++|\\.)*+")*+\})?[ \t]+([^ \t\r\n]+)'
_LABEL = re.compile(rb'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')

# name → (label set or None, raw value) of each of its sample lines, in file order.
_Found = dict[bytes, list[tuple[bytes | None, bytes]]]


class _Names:
    """The series one dialect wants, found in a single regex pass over the body.

    The pattern starts with the literal "\\n<common prefix>" (e.g. "\\nvllm:"), which
    the regex engine searches for directly, so one pass costs about as much as
    two `bytes.find` scans — a quarter of finding each name separately.
    """

    def __init__(self, *names: bytes) -> None:
        common = min(names)
        while not all(n.startswith(common) for n in names):
            common = common[:-1]
        alts = b"|".join(re.escape(n[len(common) :]) for n in sorted(names, key=len, reverse=True))
        self._prefix = common
        self._rx = re.compile(rb"\n" + re.escape(common) + rb"(" + alts + rb")" + _TAIL)

    def scan(self, buf: bytes) -> _Found:
        found: _Found = {}
        prefix, rx = self._prefix, self._rx
        if buf.startswith(prefix):  # the first line has no newline before it
            end = buf.find(b"\n")
            m = rx.match(b"\n" + (buf if end == -1 else buf[:end]))
            if m is not None:
                found[prefix + m.group(1)] = [(m.group(2), m.group(3))]
        for m in rx.finditer(buf):
            found.setdefault(prefix + m.group(1), []).append((m.group(2), m.group(3)))
        return found


def _value(raw: bytes, name: bytes) -> float:
    try:
        return float(raw)
    except ValueError:
        raise MetricsParseError(f"{name.decode()}: not a number: {raw[:40]!r}") from None


def _values(found: _Found, name: bytes) -> list[float]:
    return [_value(raw, name) for _labels, raw in found.get(name, ())]


def _sum(found: _Found, name: bytes) -> float | None:
    """Sum of the finite values over every label set; None when there is none.

    `+Inf` and `-Inf` in one series, or two values near a float's bound, made
    `math.fsum` raise ValueError or OverflowError out of the scrape loop, which then
    scraped no endpoint again for the router's life."""
    vals = [v for v in _values(found, name) if math.isfinite(v)]
    if not vals:
        return None
    try:
        return math.fsum(vals)
    except OverflowError:
        raise MetricsParseError(f"{name.decode()}: the sum is past a float's range") from None


def _max_fraction(found: _Found, name: bytes) -> float | None:
    """Largest finite value over label sets, clamped to 0..1; None when absent."""
    vals = [v for v in _values(found, name) if math.isfinite(v)]
    return min(1.0, max(0.0, max(vals))) if vals else None


def _count(found: _Found, name: bytes) -> int:
    """A mandatory gauge summed over label sets, as a whole number of requests."""
    total = _sum(found, name)
    if total is None:
        raise MetricsParseError(f"mandatory metric {name.decode()} is missing")
    if not 0 <= total <= MAX_FIGURE:
        raise MetricsParseError(f"{name.decode()}: not a count of requests: {total:g}")
    return round(total)


def _as_int(v: float | None) -> int | None:
    """A whole figure (a capacity in tokens); None when absent or out of range."""
    return None if v is None or not 0 <= v <= MAX_FIGURE else round(v)


def samples(text: bytes | str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of exactly `name` with its labels, in file order (tests, debugging)."""
    buf = text.encode() if isinstance(text, str) else text
    key = name.encode()
    out = []
    for labels, raw in _Names(key).scan(buf).get(key, ()):
        parsed = {k.decode(): v.decode() for k, v in _LABEL.findall(labels or b"")}
        out.append((parsed, _value(raw, key)))
    return out


def parse(text: bytes | str, engine: str = "") -> Stats:
    """Read one /metrics body with the names of `engine` (one of ENGINES)."""
    buf = text.encode() if isinstance(text, str) else text
    if engine in ("", "vllm"):
        return _vllm(_VLLM.scan(buf))
    if engine == "sglang":
        return _sglang(_SGLANG.scan(buf))
    if engine in ("llamacpp", "llama.cpp"):
        return _llamacpp(_LLAMACPP.scan(buf))
    if engine == "tgi":
        return _tgi(_TGI.scan(buf))
    raise MetricsParseError(f"unknown engine {engine!r}; expected one of {sorted(ENGINES)}")


_VLLM = _Names(
    b"vllm:num_requests_running",
    b"vllm:num_requests_waiting",
    b"vllm:kv_cache_usage_perc",
    b"vllm:gpu_cache_usage_perc",
    b"vllm:prompt_tokens_total",
    b"vllm:generation_tokens_total",
    b"vllm:request_success_total",
    b"vllm:cache_config_info",
    b"vllm:request_prefill_time_seconds_sum",
    b"vllm:prefix_cache_hits_total",
)


def _vllm(found: _Found) -> Stats:
    kv = _max_fraction(found, b"vllm:kv_cache_usage_perc")
    if kv is None:
        # vLLM ≤ 0.9.1 (and V0) only has the old name; 0.9.2–0.11 have both, equal.
        kv = _max_fraction(found, b"vllm:gpu_cache_usage_perc")
    block_size, num_gpu_blocks, capacity = _vllm_cache_config(found)
    return Stats(
        running=_count(found, b"vllm:num_requests_running"),
        waiting=_count(found, b"vllm:num_requests_waiting"),
        kv_usage=kv,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        prompt_tokens=_sum(found, b"vllm:prompt_tokens_total"),
        generation_tokens=_sum(found, b"vllm:generation_tokens_total"),
        # Every finished_reason, abort and error included: each one left the engine.
        success_total=_sum(found, b"vllm:request_success_total"),
        kv_capacity_tokens=capacity,
        prefill_seconds=_sum(found, b"vllm:request_prefill_time_seconds_sum"),
        prefix_hit_tokens=_sum(found, b"vllm:prefix_cache_hits_total"),
    )


# At most nine digits: a label of thousands of digits made int() raise out of the scrape
# loop (Python's 4,300-digit bound), and hundreds of them a capacity past any float.
_INT_LABEL = {
    key: re.compile(rb"[{,]" + key + rb'="([0-9]{1,9})"')
    for key in (b"num_gpu_blocks", b"block_size")
}
_ENGINE_LABEL = re.compile(rb'[{,]engine="([^"]*)"')


def _label(labels: bytes, key: bytes) -> int | None:
    """An integer label value (vLLM renders config values as strings, "None" when unset)."""
    m = _INT_LABEL[key].search(labels)
    return int(m.group(1)) if m else None


def _vllm_cache_config(found: _Found) -> tuple[int | None, int | None, int | None]:
    """block_size, num_gpu_blocks per engine, and the endpoint's KV capacity in tokens.

    `num_gpu_blocks` is per DP engine, as vLLM reports it; when
    engines disagree the smallest is kept, the capacity any one engine surely
    has. The capacity sums blocks × block size over engines: the API server
    spreads requests over all of them, so together they hold that many tokens.
    The gauge appears only after engine start-up; until then all three are None.
    """
    per_engine: dict[bytes, tuple[int, int | None]] = {}
    for labels, _raw in found.get(b"vllm:cache_config_info", ()):
        blocks = None if labels is None else _label(labels, b"num_gpu_blocks")
        if labels is None or blocks is None:
            continue
        m = _ENGINE_LABEL.search(labels)
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


_SGLANG = _Names(
    b"sglang:num_running_reqs",
    b"sglang:num_queue_reqs",
    b"sglang:token_usage",
    b"sglang:max_total_num_tokens",
    b"sglang:prompt_tokens_total",
    b"sglang:generation_tokens_total",
    b"sglang:num_requests_total",
)


def _sglang(found: _Found) -> Stats:
    return Stats(
        running=_count(found, b"sglang:num_running_reqs"),
        waiting=_count(found, b"sglang:num_queue_reqs"),
        kv_usage=_max_fraction(found, b"sglang:token_usage"),
        # No blocks: the KV pool is counted in tokens (page size is a server argument).
        kv_capacity_tokens=_as_int(_sum(found, b"sglang:max_total_num_tokens")),
        prompt_tokens=_sum(found, b"sglang:prompt_tokens_total"),
        generation_tokens=_sum(found, b"sglang:generation_tokens_total"),
        success_total=_sum(found, b"sglang:num_requests_total"),
    )


_LLAMACPP = _Names(
    b"llamacpp:requests_processing",
    b"llamacpp:requests_deferred",
    b"llamacpp:kv_cache_usage_ratio",
    b"llamacpp:prompt_tokens_total",
    b"llamacpp:tokens_predicted_total",
)


def _llamacpp(found: _Found) -> Stats:
    # Values are C++ %g (6 significant digits): large counters are approximate,
    # but still never decrease, so restart detection holds.
    return Stats(
        running=_count(found, b"llamacpp:requests_processing"),
        waiting=_count(found, b"llamacpp:requests_deferred"),
        # Removed in May 2025 (llama.cpp PR #13660); older builds still have it.
        kv_usage=_max_fraction(found, b"llamacpp:kv_cache_usage_ratio"),
        prompt_tokens=_sum(found, b"llamacpp:prompt_tokens_total"),
        generation_tokens=_sum(found, b"llamacpp:tokens_predicted_total"),
        # No finished-request counter exists.
        success_total=None,
    )


_TGI = _Names(
    b"tgi_batch_current_size",
    b"tgi_queue_size",
    b"tgi_batch_current_max_tokens",
    b"tgi_batch_max_total_tokens",
    b"tgi_request_input_length_sum",
    b"tgi_request_generated_tokens_sum",
    b"tgi_request_success",
)


def _tgi(found: _Found) -> Stats:
    budget = _sum(found, b"tgi_batch_max_total_tokens")
    batch_tokens = _sum(found, b"tgi_batch_current_max_tokens")
    kv = None
    if budget is not None and batch_tokens is not None and budget > 0:
        # TGI has no KV gauge; the running batch's token reservation over the
        # warm-up token budget is the closest proxy.
        kv = min(1.0, max(0.0, batch_tokens / budget))
    return Stats(
        running=_count(found, b"tgi_batch_current_size"),
        waiting=_count(found, b"tgi_queue_size"),
        kv_usage=kv,
        kv_capacity_tokens=_as_int(budget),
        # Counters carry no _total suffix; token totals are histogram sums.
        prompt_tokens=_sum(found, b"tgi_request_input_length_sum"),
        generation_tokens=_sum(found, b"tgi_request_generated_tokens_sum"),
        success_total=_sum(found, b"tgi_request_success"),
    )
