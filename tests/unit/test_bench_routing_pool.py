"""bench/routing.py's multi-seed suite: what a pooled row holds and how it is judged."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "routing.py"


@pytest.fixture(scope="module")
def routing() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_routing_under_test", BENCH)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while building
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    return mod


def run(routing: ModuleType, policy: str, ttfts: list[float], hits: tuple[float, float]) -> object:
    st = routing.RunStats(policy, "85%", 50.0)
    st.ttfts = ttfts
    st.ttft_p99 = routing.pct(ttfts, 0.99)
    st.hits = hits
    st.hit_rate = hits[0] / hits[1]
    st.sent = len(ttfts)
    st.max_share = 1.0
    st.machine_busy = 0.5
    return st


class TestPooledSuite:
    """bench/routing.py pools the seeds' rows and judges the pooled rows."""

    def test_pool_takes_percentiles_over_every_request_and_hits_over_summed_counters(
        self,
        routing: ModuleType,
    ) -> None:
        """Pool takes percentiles over every request and hits over summed counters."""
        a = run(routing, "ours", [0.01] * 98 + [1.0, 1.0], (90.0, 100.0))
        b = run(routing, "ours", [0.02] * 100, (10.0, 100.0))
        p = routing.pool([a, b])
        # Two slow requests are 2 % of one run but 1 % of both: the pooled p99 is below them.
        assert p.ttft_p99 == pytest.approx(0.02)
        assert a.ttft_p99 == pytest.approx(1.0)
        assert p.ttft_p50 == pytest.approx(0.02)  # the 100th of 200
        assert p.hit_rate == pytest.approx(0.5)  # 100 of 200, not the mean of the rates
        assert p.sent == 200

    def test_suite_verdicts_judge_the_pooled_rows(self, routing: ModuleType) -> None:
        """Suite verdicts judge the pooled rows."""

        def row(policy: str, hints: str, *runs: object) -> object:
            return routing.SuiteRow("few-prompts", hints, routing.pool(list(runs)), list(runs))

        fast = [0.05] * 100
        rows = [
            row("oracle", "none", run(routing, "oracle", fast, (90, 100))),
            row("ours", "none", run(routing, "ours", [0.06] * 100, (89, 100))),
            # One seed slow, one fast: pooled, the hinted row is judged on both.
            row(
                "ours",
                "user",
                run(routing, "ours", [0.06] * 100, (89, 100)),
                run(routing, "ours", [0.06] * 98 + [0.5, 0.5], (89, 100)),
            ),
            row("ours", "header", run(routing, "ours", [0.09] * 100, (85, 100))),
        ]
        lines, checks = routing.suite_table(rows)
        assert len(lines) == 2 + len(rows)
        assert "60 / 500" in lines[4]  # each seed's p99 beside the pooled one
        none, user, header = checks
        assert "p99 1.20× the oracle's (met" in none
        assert "hit rate -1.0 points (met" in none
        assert "against no hints p99 1.00×" in user
        assert "(not worse" in user
        assert "p99 1.80× the oracle's (MISSED" in header
        assert "hit rate -5.0 points (MISSED" in header
        assert "(WORSE" in header


class TestSuiteSubset:
    """bench/routing.py's suite runs only the policies and hint modes asked for."""

    def test_defaults_run_every_policy_and_each_variants_hint_modes(
        self, routing: ModuleType
    ) -> None:
        """Without the options every policy runs, ours once per hint mode of the variant."""
        opts = routing.parse_args(["--suite"])
        assert routing.suite_runs(("none", "header", "user"), opts) == [
            ("round_robin", "none"),
            ("oracle", "none"),
            ("ours", "none"),
            ("ours", "header"),
            ("ours", "user"),
        ]
        assert routing.suite_runs(("none",), opts)[-1] == ("ours", "none")

    def test_the_options_leave_out_policies_and_hint_modes(self, routing: ModuleType) -> None:
        """--suite-policies and --suite-hints leave the other runs out."""
        opts = routing.parse_args(
            ["--suite", "--suite-policies", "oracle", "ours", "--suite-hints", "none"]
        )
        assert routing.suite_runs(("none", "header", "user"), opts) == [
            ("oracle", "none"),
            ("ours", "none"),
        ]
        opts = routing.parse_args(["--suite", "--suite-hints", "user"])
        assert routing.suite_runs(("none",), opts) == [("round_robin", "none"), ("oracle", "none")]

    def test_verdicts_without_round_robin_or_hinted_rows(self, routing: ModuleType) -> None:
        """With only the oracle and unhinted ours, each ours row still gets its verdict."""
        rows = [
            routing.SuiteRow("customers", "none", run(routing, "oracle", [0.5] * 100, (70, 100))),
            routing.SuiteRow("customers", "none", run(routing, "ours", [0.7] * 100, (75, 100))),
        ]
        lines, checks = routing.suite_table(rows)
        assert len(lines) == 4
        (check,) = checks
        assert "p99 1.40× the oracle's (MISSED" in check
        assert "hit rate +5.0 points (met" in check
        assert "against no hints" not in check
