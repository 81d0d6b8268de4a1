"""The engine's cached_tokens checks the prefix index: outcomes, corrections, metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from llmgw.router.request.tokens import usage_of
from llmgw.router.routing.blockhash import block_end
from llmgw.router.routing.feedback import STREAK, PredictionCheck, predicted_tokens
from llmgw.router.routing.prefix import PrefixIndex

CHAIN = tuple(range(100, 140))  # 40 blocks: 16 of 64 B, then growing


def indexed() -> tuple[PrefixIndex, PredictionCheck]:
    idx = PrefixIndex()
    idx.record("a", CHAIN, capacity_units=None)
    idx.record("a", tuple(range(500, 510)), capacity_units=None)
    return idx, PredictionCheck(idx)


class TestPredictedTokens:
    """Predicted cached tokens from prefix blocks."""

    def test_blocks_convert_at_four_bytes_a_token(self) -> None:
        """n leading blocks stand for block_end(n - 1) / 4 tokens; none for nothing."""
        assert predicted_tokens(0) == 0
        assert predicted_tokens(1) == 16
        assert predicted_tokens(30) == block_end(29) // 4


class TestOutcomes:
    """The engine's cached tokens confirm or correct the prefix index."""

    def test_close_enough_is_a_hit_and_changes_nothing(self) -> None:
        """Within a factor 2 either way the guess held."""
        idx, check = indexed()
        before = idx.units("a")
        assert check.check("a", CHAIN, 30, predicted_tokens(30) * 3 // 2, None) == "hit"
        assert check.check("a", CHAIN, 30, predicted_tokens(30) * 2 // 3, None) == "hit"
        assert (idx.units("a"), idx.scale("a"), check.counts["hit"]) == (before, 1.0, 2)

    def test_engine_had_more_is_under(self) -> None:
        """More than twice the prediction (another router's traffic): counted, no change."""
        idx, check = indexed()
        assert check.check("a", CHAIN, 2, 400, None) == "under"
        assert idx.scale("a") == 1.0

    def test_one_miss_is_no_evidence(self) -> None:
        """A single empty answer (a concurrent first request, say) corrects nothing."""
        idx, check = indexed()
        before = len(idx)
        assert check.check("a", CHAIN, 30, 0, None) == "cleared"
        assert (len(idx), check.corrections) == (before, 0)

    def test_a_streak_of_empty_answers_resets_the_endpoint(self) -> None:
        """STREAK empty answers in a row: the engine lost its cache; the index forgets the
        endpoint, except the chain just served (which the engine now holds)."""
        idx, check = indexed()
        for _ in range(STREAK):
            check.check("a", CHAIN, 30, 0, None)
        assert check.corrections == 1
        assert idx.match(tuple(range(500, 510)), ["a"]) == {}
        assert idx.match(CHAIN, ["a"]) == {"a": len(CHAIN)}

    def test_a_hit_breaks_the_streak(self) -> None:
        """Misses separated by a hit are not a streak."""
        _idx, check = indexed()
        for _ in range(STREAK - 1):
            check.check("a", CHAIN, 30, 0, None)
        check.check("a", CHAIN, 30, predicted_tokens(30), None)
        check.check("a", CHAIN, 30, 0, None)
        assert check.corrections == 0

    def test_a_streak_of_short_answers_shrinks_the_capacity(self) -> None:
        """Less than half the prediction, STREAK times: the capacity scale drops and the
        oldest entries are trimmed to it; hits then let it recover."""
        idx, check = indexed()
        cap = 2000
        for _ in range(STREAK):
            check.check("a", CHAIN, 30, 40, cap)
        assert idx.scale("a") < 1.0
        assert idx.units("a") <= idx.capacity("a", cap) < cap
        low = idx.scale("a")
        check.check("a", CHAIN, 30, predicted_tokens(30), cap)
        assert idx.scale("a") > low

    def test_metrics_show_counts_and_token_sums(self) -> None:
        """The collector exports outcomes (bounded labels) and both token sums."""
        _idx, check = indexed()
        check.check("a", CHAIN, 30, predicted_tokens(30), None)
        check.check("a", CHAIN, 2, 400, None)
        reg = CollectorRegistry()
        reg.register(check)
        text = generate_latest(reg).decode()
        assert 'llmgw_router_prefix_predictions_total{outcome="hit"} 1.0' in text
        assert 'llmgw_router_prefix_predictions_total{outcome="under"} 1.0' in text
        assert 'llmgw_router_prefix_predictions_total{outcome="cleared"} 0.0' in text
        want = predicted_tokens(30) + predicted_tokens(2)
        assert f"llmgw_router_prefix_predicted_tokens_total {float(want)}" in text
        assert (
            f"llmgw_router_prefix_cached_tokens_total {float(predicted_tokens(30) + 400)}" in text
        )


class TestCachedReported:
    """Absent cached-token details are unknown, not zero."""

    def test_absent_details_are_unknown_not_zero(self) -> None:
        """An engine that sends no prompt_tokens_details (vLLM without
        --enable-prompt-tokens-details) must not read as "nothing cached"."""
        bare = usage_of(b'{"usage":{"prompt_tokens":900,"completion_tokens":4}}')
        full = usage_of(
            b'{"usage":{"prompt_tokens":900,"prompt_tokens_details":{"cached_tokens":848}}}'
        )
        zero = usage_of(
            b'{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}}'
        )
        assert bare is not None
        assert full is not None
        assert zero is not None
        assert (bare.cached, bare.cached_reported) == (0, None)
        assert (full.cached, full.cached_reported) == (848, 848)
        assert zero.cached_reported == 0
