"""Engine metrics parser against every fixture's `# fixture:` header."""

from __future__ import annotations

import math
import re
from pathlib import Path
from statistics import fmean

import pytest

from llmgw.router.errors import MetricsParseError
from llmgw.router.replicas.enginemetrics import ENGINES, parse, samples
from llmgw.router.replicas.registry import Stats

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engine-metrics"
FILES = sorted(p.name for p in FIXTURES.glob("*.txt"))
STATS_FIELDS = (
    "running",
    "waiting",
    "kv_usage",
    "block_size",
    "num_gpu_blocks",
    "prompt_tokens",
    "generation_tokens",
    "success_total",
)


def header(text: str) -> dict[str, str]:
    """`# fixture: key=value` lines; the value is the first word after `=`."""
    return dict(re.findall(r"^# fixture: ([a-z_0-9]+)=(\S+)", text, flags=re.MULTILINE))


def expected(raw: str) -> float | None:
    return None if raw == "null" else float(raw)


def kv_usage_of_engine(text: str, engine: str) -> float:
    [value] = [
        v for labels, v in samples(text, "vllm:kv_cache_usage_perc") if labels["engine"] == engine
    ]
    return value


class TestFixtures:
    """The engine metrics parser against every fixture."""

    def test_every_fixture_is_covered(self) -> None:
        """The fixture directory holds one file per engine dialect and version: seven."""
        assert len(FILES) == 7

    @pytest.mark.parametrize("name", FILES)
    def test_fixture_values_are_extracted_exactly(self, name: str) -> None:
        """Every `# fixture:` key of the file is matched exactly (null is None)."""
        text = (FIXTURES / name).read_text()
        keys = header(text)
        stats = parse(text.encode(), keys.pop("engine"))
        checked = {}
        for key, _raw in keys.items():
            if key in STATS_FIELDS:
                actual = getattr(stats, key)
            elif key == "kv_usage_max":
                actual = stats.kv_usage  # the routing choice: the most loaded engine
            elif key == "kv_usage_mean":
                actual = fmean(v for _l, v in samples(text, "vllm:kv_cache_usage_perc"))
            elif m := re.fullmatch(r"kv_usage_engine(\d+)", key):
                actual = kv_usage_of_engine(text, m.group(1))
            elif key == "success_total_stop_length":
                actual = sum(
                    v
                    for labels, v in samples(text, "vllm:request_success_total")
                    if labels["finished_reason"] in ("stop", "length")
                )
            else:
                raise AssertionError(f"{name}: unknown fixture key {key}")
            checked[key] = actual
        assert checked == {k: expected(v) for k, v in keys.items()}
        # Every Stats field that the header names is covered, kv_usage via kv_usage_max.
        assert set(STATS_FIELDS) - set(keys) <= {"kv_usage"}

    @pytest.mark.parametrize(
        ("name", "capacity"),
        [
            ("vllm-v1.txt", 41927 * 16),
            ("vllm-v1-dp2.txt", 2 * 41927 * 16),
            ("vllm-legacy.txt", 27962 * 16),
            ("sglang.txt", 462321),
            ("tgi.txt", 381824),
            ("llamacpp.txt", None),
        ],
    )
    def test_kv_capacity_tokens_per_engine(self, name: str, capacity: int | None) -> None:
        """KV capacity: blocks × block size summed over DP engines, SGLang's token pool,
        TGI's token budget; llama.cpp has none."""
        text = (FIXTURES / name).read_bytes()
        assert parse(text, header(text.decode())["engine"]).kv_capacity_tokens == capacity

    def test_str_input_equals_bytes_input(self) -> None:
        """A str body parses to the same Stats as its bytes."""
        text = (FIXTURES / "vllm-v1.txt").read_text()
        assert parse(text) == parse(text.encode())


class TestRules:
    """The engine metrics parser's rules, one each."""

    def test_missing_running_is_an_error(self) -> None:
        """Running is mandatory: a body without it is refused, not read as zero."""
        with pytest.raises(MetricsParseError, match="num_requests_running"):
            parse(b"vllm:num_requests_waiting 1.0\n")

    def test_missing_waiting_is_an_error(self) -> None:
        """Waiting is mandatory too."""
        with pytest.raises(MetricsParseError, match="num_requests_waiting"):
            parse(b"vllm:num_requests_running 1.0\n")

    def test_unknown_engine_is_an_error(self) -> None:
        """An engine name outside the contract is refused with the list of known ones."""
        with pytest.raises(MetricsParseError, match="unknown engine"):
            parse(b"", "ollama")
        assert {"", "vllm", "sglang", "llamacpp", "llama.cpp", "tgi"} == ENGINES

    def test_non_numeric_value_is_an_error(self) -> None:
        """A value that is not a number is a parse error, not a silent zero."""
        with pytest.raises(MetricsParseError, match="not a number"):
            parse(b"vllm:num_requests_running abc\nvllm:num_requests_waiting 0\n")

    def test_first_line_needs_no_preceding_newline(self) -> None:
        """A wanted series on the very first line is found."""
        assert parse(b"vllm:num_requests_running 3\nvllm:num_requests_waiting 4").running == 3

    def test_longer_names_sharing_a_prefix_do_not_match(self) -> None:
        """`_by_reason`, `_created` and histogram series are not the wanted gauge."""
        body = (
            b"vllm:num_requests_running 1\n"
            b'vllm:num_requests_waiting_by_reason{reason="capacity"} 7\n'
            b"vllm:num_requests_waiting 2\n"
            b"vllm:request_success_created 1.7e+09\n"
            b'vllm:request_success_total{finished_reason="stop"} 5\n'
        )
        stats = parse(body)
        assert (stats.waiting, stats.success_total) == (2, 5.0)

    def test_help_and_type_lines_are_not_samples(self) -> None:
        """Comment lines naming a metric are skipped."""
        body = (
            b"# HELP vllm:num_requests_running 99 requests\n"
            b"# TYPE vllm:num_requests_running gauge\n"
            b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
        )
        assert parse(body).running == 1

    def test_label_values_with_braces_blanks_and_timestamps(self) -> None:
        """Quoted label values may hold `}`, `,` and blanks; a trailing timestamp is ignored."""
        body = (
            b'vllm:num_requests_running{lora="a} b, c",engine="0"} 5.0 1795893512204\r\n'
            b"vllm:num_requests_waiting 0\r\n"
        )
        assert parse(body).running == 5

    def test_label_sets_are_summed_and_kv_takes_the_max(self) -> None:
        """Counts sum across DP ranks; KV usage is the most loaded rank's."""
        body = (
            b'sglang:num_running_reqs{dp_rank="0"} 3\nsglang:num_running_reqs{dp_rank="1"} 4\n'
            b'sglang:num_queue_reqs{dp_rank="0"} 1\nsglang:num_queue_reqs{dp_rank="1"} 0\n'
            b'sglang:token_usage{dp_rank="0"} 0.2\nsglang:token_usage{dp_rank="1"} 0.6\n'
        )
        stats = parse(body, "sglang")
        assert (stats.running, stats.waiting, stats.kv_usage) == (7, 1, 0.6)

    def test_legacy_kv_gauge_is_the_fallback_only(self) -> None:
        """`gpu_cache_usage_perc` is read only when `kv_cache_usage_perc` is absent."""
        base = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        both = base + b"vllm:kv_cache_usage_perc 0.3\nvllm:gpu_cache_usage_perc 0.9\n"
        legacy = base + b"vllm:gpu_cache_usage_perc 0.9\n"
        assert (parse(both).kv_usage, parse(legacy).kv_usage, parse(base).kv_usage) == (
            0.3,
            0.9,
            None,
        )

    def test_nan_kv_usage_is_unknown(self) -> None:
        """A NaN gauge is no measurement: KV usage is None."""
        body = (
            b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
            b"vllm:kv_cache_usage_perc NaN\n"
        )
        assert parse(body).kv_usage is None

    def test_tgi_counters_without_total_suffix(self) -> None:
        """TGI's success counter has no `_total`; the name is matched as written."""
        body = b"tgi_batch_current_size 2\ntgi_queue_size 0\ntgi_request_success 12\n"
        stats = parse(body, "tgi")
        assert (stats.success_total, stats.kv_usage) == (12.0, None)

    def test_llamacpp_g_formatting_is_read_as_rendered(self) -> None:
        """`%g` exponent values are read as the number they render."""
        body = (
            b"llamacpp:requests_processing 8\nllamacpp:requests_deferred 0\n"
            b"llamacpp:prompt_tokens_total 1.84302e+07\n"
        )
        assert parse(body, "llama.cpp").prompt_tokens == 18430200.0

    def test_cache_config_before_engine_start_is_unknown(self) -> None:
        """vLLM renders unset config as "None": block counts stay None, not 0."""
        body = (
            b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
            b'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="None"} 1.0\n'
        )
        stats = parse(body)
        assert (stats.block_size, stats.num_gpu_blocks, stats.kv_capacity_tokens) == (None,) * 3

    def test_num_gpu_blocks_is_per_engine(self) -> None:
        """With DP engines, num_gpu_blocks is one engine's (the smallest) and capacity the sum."""
        body = (
            b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
            b'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100",'
            b'num_gpu_blocks_override="7"} 1.0\n'
            b'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="90"} 1.0\n'
        )
        stats = parse(body)
        assert (stats.num_gpu_blocks, stats.kv_capacity_tokens) == (90, 190 * 16)

    def test_garbled_label_set_fails_fast(self) -> None:
        """An unterminated label set is no sample, and costs no regex backtracking."""
        body = (
            b"\nvllm:num_requests_running{"
            + b'a="x",b c ' * 5000
            + b"\nvllm:num_requests_waiting 0\n"
        )
        with pytest.raises(MetricsParseError, match="num_requests_running"):
            parse(body)

    def test_result_is_plain_stats(self) -> None:
        """The parser returns the registry's Stats value."""
        stats = parse(b"vllm:num_requests_running 1\nvllm:num_requests_waiting 2\n")
        assert stats == Stats(running=1, waiting=2, kv_usage=None)
        assert not math.isnan(stats.running)


class TestHostileValues:
    """Values no engine means are a failed scrape or an unknown figure, never a raise."""

    OK = b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"

    @pytest.mark.parametrize(
        "body",
        [
            b'vllm:num_requests_running +Inf\nvllm:num_requests_running{a="1"} -Inf\n'
            b"vllm:num_requests_waiting 0\n",
            b'vllm:num_requests_running{a="1"} 1e308\nvllm:num_requests_running{a="2"} 1e308\n'
            b"vllm:num_requests_waiting 0\n",
            b"vllm:num_requests_running 1e300\nvllm:num_requests_waiting 0\n",
            b"vllm:num_requests_running -5\nvllm:num_requests_waiting 0\n",
            OK + b'vllm:prompt_tokens_total{a="1"} 1e308\nvllm:prompt_tokens_total{a="2"} 1e308\n',
        ],
        ids=["inf-minus-inf", "sum-past-a-float", "count-past-2-53", "negative", "counter-sum"],
    )
    def test_a_count_or_sum_no_float_holds_is_a_parse_error(self, body: bytes) -> None:
        """Infinities that cancel, sums past a float's range and counts outside 0 to
        2**53 are MetricsParseError (fsum's ValueError and OverflowError ended the loop)."""
        with pytest.raises(MetricsParseError):
            parse(body)

    def test_an_infinite_counter_is_unknown(self) -> None:
        """A counter of +Inf is left out, as NaN is: the counter is unknown."""
        stats = parse(self.OK + b"vllm:prompt_tokens_total +Inf\n")
        assert stats.prompt_tokens is None

    @pytest.mark.parametrize("digits", [10, 300, 5000])
    def test_a_label_number_of_many_digits_is_unknown(self, digits: int) -> None:
        """A cache_config_info number past nine digits is no block count: the capacity is
        unknown (5,000 digits made int() raise; 300, a capacity past any float)."""
        big = b"9" * digits
        body = self.OK + b'vllm:cache_config_info{block_size="16",num_gpu_blocks="' + big
        stats = parse(body + b'"} 1\n')
        assert (stats.num_gpu_blocks, stats.kv_capacity_tokens) == (None, None)

    def test_a_capacity_past_2_53_is_unknown(self) -> None:
        """SGLang's token capacity of 1e308 is unknown, not an int no float holds."""
        body = b"sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n"
        stats = parse(body + b"sglang:max_total_num_tokens 1e308\n", "sglang")
        assert stats.kv_capacity_tokens is None
