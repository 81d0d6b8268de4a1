"""ctl bench's pure decisions: levels, the stop rule, the peak and the weight."""

from __future__ import annotations

import pytest

from llmgw.ctl import capacity
from llmgw.ctl.capacity import Level
from llmgw.ctl.commands.bench import benched_peers
from tests.unit.test_ctl_commands import replica_view


def level(
    c: int, tok_s: float, *, p50: float = 1.0, failed: int = 0, completed: int = 100
) -> Level:
    return Level(
        concurrency=c,
        completed=completed,
        failed=failed,
        tokens=int(tok_s * 10),
        elapsed_s=10.0,
        latency_p50_s=p50,
        latency_p95_s=p50 * 1.5,
    )


class TestLevels:
    """The concurrency levels ctl bench tries, and its percentile."""

    def test_doubling_up_to_the_cap(self) -> None:
        """Concurrency doubles from 1 and ends at the cap."""
        assert capacity.concurrency_levels(64) == [1, 2, 4, 8, 16, 32, 64]

    def test_cap_not_a_power_of_two(self) -> None:
        """A cap between powers of two is still the last level."""
        assert capacity.concurrency_levels(12) == [1, 2, 4, 8, 12]

    def test_cap_of_one(self) -> None:
        """--max-concurrency 1 runs one level."""
        assert capacity.concurrency_levels(1) == [1]

    def test_percentile(self) -> None:
        """Nearest-rank percentiles; None for no values."""
        assert capacity.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
        assert capacity.percentile([], 0.5) is None


class TestStopRule:
    """When ctl bench stops raising the concurrency."""

    def test_rising_goes_on(self) -> None:
        """Throughput still rising: keep ramping."""
        assert capacity.stop_reason([level(1, 100), level(2, 190), level(4, 350)]) is None

    def test_two_flat_steps_stop(self) -> None:
        """Less than 5% gain over two steps is a plateau."""
        levels = [level(1, 100), level(2, 190), level(4, 350), level(8, 360), level(16, 362)]
        assert "less than 5% over two steps" in (capacity.stop_reason(levels) or "")

    def test_one_flat_step_is_not_enough(self) -> None:
        """A single flat step may be noise: go on."""
        levels = [level(1, 100), level(2, 190), level(4, 350), level(8, 355)]
        assert capacity.stop_reason(levels) is None

    def test_latency_explosion_stops(self) -> None:
        """Median latency over 10x the single-request latency stops the ramp."""
        levels = [level(1, 100, p50=0.5), level(2, 300, p50=6.0)]
        assert "median latency" in (capacity.stop_reason(levels) or "")

    def test_failures_stop(self) -> None:
        """More than 10% failed requests at a level stops the ramp."""
        levels = [level(1, 100), level(2, 150, failed=20, completed=80)]
        assert "20 of 100 requests failed" in (capacity.stop_reason(levels) or "")


class TestPeakAndWeight:
    """The peak level ctl bench reports and the weight it derives."""

    def test_peak_is_the_best_mostly_successful_level(self) -> None:
        """The peak ignores a level whose throughput came with many failures."""
        best = level(4, 350)
        levels = [level(1, 100), best, level(8, 900, failed=50, completed=50)]
        assert capacity.peak(levels) == best

    def test_first_benched_is_one(self) -> None:
        """With no benched peers the weight is 1.0."""
        assert capacity.weight(420.0, []) == 1.0

    def test_relative_to_mean_of_peers(self) -> None:
        """Weight is capacity over the mean capacity of the benched peers."""
        assert capacity.weight(300.0, [100.0, 200.0]) == pytest.approx(2.0)

    def test_peers_exclude_self_unbenched_and_stopped(self) -> None:
        """Only other, live replicas with a measured capacity count as peers."""
        from msgspec import structs

        rs = [
            structs.replace(replica_view("a"), capacity_tok_s=100.0),
            structs.replace(replica_view("b"), capacity_tok_s=None),
            structs.replace(replica_view("c", state="stopped"), capacity_tok_s=50.0),
            structs.replace(replica_view("d"), capacity_tok_s=300.0),
        ]
        assert benched_peers(rs, "d") == [100.0]
