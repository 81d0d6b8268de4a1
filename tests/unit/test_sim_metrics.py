"""sim-engine /metrics rendering: vLLM V1 and SGLang names, types, labels and number format."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.simengine.metrics import EngineView, go_float, render_sglang, render_vllm
from llmgw.simengine.metricsnames import buckets_1_2_5, histogram_buckets
from llmgw.simengine.stats import EngineStats

VIEW = EngineView(
    running=87, waiting=14, kv_usage=0.25, used_blocks=10, capacity_blocks=40, block_size=16
)
CACHE_INFO = {"block_size": "16", "num_gpu_blocks": "41", "enable_prefix_caching": "True"}
LINE = re.compile(r"^([^{ ]+)\{([^}]*)\} (\S+)$")


def families(text: str) -> dict[str, str]:
    """# TYPE lines: family name → type."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))


def samples(text: str) -> dict[tuple[str, frozenset[str]], str]:
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out[(m.group(1), frozenset(m.group(2).split(",")))] = m.group(3)
    return out


def label_keys(text: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            keys = {kv.split("=", 1)[0] for kv in m.group(2).split(",")}
            out.setdefault(m.group(1), set()).update(keys)
    return out


def stats(dialect: str) -> EngineStats:
    s = EngineStats(histogram_buckets(dialect, 8192))
    s.prompt_tokens, s.prompt_tokens_cached, s.generation_tokens = 184302117, 1000, 42
    s.prefix_queries, s.prefix_hits = 2000, 1000
    s.finished["stop"], s.finished["abort"] = 3, 1
    s.observe("ttft", 0.05)
    s.observe("ttft", 3.0)
    s.observe("itl", 0.02, n=10)
    return s


def vllm_text() -> str:
    return render_vllm(
        stats("vllm"), VIEW, model_name="m", cache_info=CACHE_INFO, created_wall=1.8e9
    ).decode()


class TestGoFloat:
    """Numbers formatted as prometheus_client does."""

    @pytest.mark.parametrize(
        ("value", "text"),
        [
            (87, "87.0"),
            (0.8734436864952535, "0.8734436864952535"),
            (184302117, "1.84302117e+08"),
            (1.795893512204e9, "1.795893512204e+09"),
            (1e10, "1e+010"),
            (float("inf"), "+Inf"),
        ],
    )
    def test_like_prometheus_client(self, value: float, text: str) -> None:
        """Numbers print as prometheus_client's floatToGoString prints them."""
        assert go_float(value) == text


class TestVllm:
    """The vLLM V1 metrics page."""

    def test_gauges(self) -> None:
        """Running, waiting and KV usage carry engine and model_name labels."""
        s = samples(vllm_text())
        labels = frozenset({'engine="0"', 'model_name="m"'})
        assert s[("vllm:num_requests_running", labels)] == "87.0"
        assert s[("vllm:num_requests_waiting", labels)] == "14.0"
        assert s[("vllm:kv_cache_usage_perc", labels)] == "0.25"

    def test_counters_have_total_and_created(self) -> None:
        """Counters are exposed with _total plus a _created gauge, as prometheus_client does."""
        text = vllm_text()
        fam = families(text)
        assert fam["vllm:prompt_tokens_total"] == "counter"
        assert fam["vllm:prompt_tokens_created"] == "gauge"
        labels = frozenset({'engine="0"', 'model_name="m"'})
        assert samples(text)[("vllm:prompt_tokens_total", labels)] == "1.84302117e+08"

    def test_success_by_finish_reason(self) -> None:
        """Every finished_reason vLLM pre-creates is present, with its count."""
        s = samples(vllm_text())
        got = {
            next(x for x in k[1] if x.startswith("finished_reason")): v
            for k, v in s.items()
            if k[0] == "vllm:request_success_total"
        }
        assert got == {
            'finished_reason="stop"': "3.0",
            'finished_reason="length"': "0.0",
            'finished_reason="abort"': "1.0",
            'finished_reason="error"': "0.0",
            'finished_reason="repetition"': "0.0",
        }

    def test_cache_config_info_has_no_model_name(self) -> None:
        """cache_config_info carries the CacheConfig labels and engine, not model_name."""
        keys = label_keys(vllm_text())["vllm:cache_config_info"]
        assert keys == {"block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"}

    def test_histogram_is_cumulative(self) -> None:
        """TTFT buckets are cumulative and +Inf equals the count."""
        fam = {f.name: f for f in text_string_to_metric_families(vllm_text())}
        ttft = fam["vllm:time_to_first_token_seconds"]
        buckets = [s.value for s in ttft.samples if s.name.endswith("_bucket")]
        count = next(s.value for s in ttft.samples if s.name.endswith("_count"))
        assert buckets == sorted(buckets)
        assert (buckets[-1], count) == (2.0, 2.0)

    def test_names_types_and_labels_match_the_fixture(self, fixtures_dir: Path) -> None:
        """Every family we print exists in a real vLLM V1 scrape with the same type and labels."""
        real = (fixtures_dir / "engine-metrics" / "vllm-v1.txt").read_text()
        ours = vllm_text()
        real_types, real_keys = families(real), label_keys(real)
        for name, kind in families(ours).items():
            assert real_types.get(name) == kind, name
        for name, keys in label_keys(ours).items():
            if name != "vllm:cache_config_info":
                assert keys == real_keys[name], name

    def test_contract_metrics_present(self) -> None:
        """The metrics the router and the issue require are all there."""
        fam = families(vllm_text())
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:cache_config_info",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:request_success_total",
            "vllm:time_to_first_token_seconds",
        ):
            assert name in fam

    def test_parses_as_prometheus_text(self) -> None:
        """The whole exposition parses with prometheus_client's parser."""
        assert len(list(text_string_to_metric_families(vllm_text()))) > 30

    def test_token_buckets_follow_max_model_len(self) -> None:
        """Token-count buckets are 1-2-5 steps up to max_model_len."""
        assert buckets_1_2_5(600) == (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)


class TestSglang:
    """The SGLang metrics page."""

    def sglang_text(self) -> str:
        return render_sglang(stats("sglang"), VIEW, model_name="m").decode()

    def test_gauges_and_capacity(self) -> None:
        """Running, queue, token usage and capacity in tokens use SGLang's names."""
        s = {k[0]: v for k, v in samples(self.sglang_text()).items()}
        assert (s["sglang:num_running_reqs"], s["sglang:num_queue_reqs"]) == ("87.0", "14.0")
        assert (s["sglang:token_usage"], s["sglang:max_total_num_tokens"]) == ("0.25", "640.0")
        assert s["sglang:cache_hit_rate"] == "0.5"
        assert s["sglang:num_requests_total"] == "4.0"

    def test_names_types_and_labels_match_the_fixture(self, fixtures_dir: Path) -> None:
        """Every SGLang family we print exists in a real scrape with the same type and labels."""
        real = (fixtures_dir / "engine-metrics" / "sglang.txt").read_text()
        ours = self.sglang_text()
        real_types, real_keys = families(real), label_keys(real)
        for name, kind in families(ours).items():
            assert real_types.get(name) == kind, name
        for name, keys in label_keys(ours).items():
            assert keys == real_keys[name], name

    def test_no_created_series(self) -> None:
        """SGLang runs prometheus in multiprocess mode: no _created series."""
        assert "_created" not in self.sglang_text()


class TestLabelValues:
    """A served name is a label value as prometheus_client writes it: escaped."""

    NAME = 'org/m"x\\y\nz'

    @pytest.mark.parametrize("dialect", ["vllm", "sglang"])
    def test_quote_backslash_and_line_feed_escaped(self, dialect: str) -> None:
        """A name with a quote, a backslash and a line feed parses back as itself (a
        bare quote ended the label value, and the page did not parse)."""
        if dialect == "vllm":
            body = render_vllm(
                stats("vllm"), VIEW, model_name=self.NAME, cache_info=CACHE_INFO, created_wall=1.0
            )
        else:
            body = render_sglang(stats("sglang"), VIEW, model_name=self.NAME)
        assert '"org/m\\"x\\\\y\\nz"' in body.decode()
        names = {
            s.labels["model_name"]
            for fam in text_string_to_metric_families(body.decode())
            for s in fam.samples
            if "model_name" in s.labels
        }
        assert names == {self.NAME}
