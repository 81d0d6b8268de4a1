"""sim-engine timing model and the default engine shape."""

from __future__ import annotations

import pytest

from llmgw.simengine.stats import Histogram
from llmgw.simengine.timing import TimingModel, default_num_gpu_blocks


class TestStepTime:
    """Step times of the timing model."""

    def test_decode_step(self) -> None:
        """A decode step costs the base plus the per-sequence cost, in seconds."""
        m = TimingModel(decode_base_ms=5.0, decode_ms_per_seq=0.1, prefill_ms_per_token=0.05)
        assert pytest.approx(0.015) == m.step_s(prefill_tokens=0, decode_seqs=100)

    def test_prefill_is_proportional_to_tokens(self) -> None:
        """Each computed prompt token adds prefill_ms_per_token."""
        m = TimingModel(decode_base_ms=0.0, prefill_ms_per_token=0.05)
        assert pytest.approx(0.1) == m.step_s(prefill_tokens=2000, decode_seqs=0)

    def test_speed_divides_time(self) -> None:
        """speed 10 makes every step ten times shorter."""
        slow, fast = TimingModel(), TimingModel(speed=10)
        ratio = slow.step_s(prefill_tokens=100, decode_seqs=3) / fast.step_s(
            prefill_tokens=100, decode_seqs=3
        )
        assert pytest.approx(10.0) == ratio

    def test_tensor_parallel_is_sublinear(self) -> None:
        """TP 2 is faster than TP 1 but less than twice as fast."""
        one, two = TimingModel(), TimingModel(tp=2)
        ratio = one.step_s(prefill_tokens=0, decode_seqs=1) / two.step_s(
            prefill_tokens=0, decode_seqs=1
        )
        assert 1.5 < ratio < 2.0

    def test_defaults_look_like_llama3_8b_on_h100(self) -> None:
        """One stream decodes at about 150 tokens/s; batch 256 at about 27 ms per token."""
        m = TimingModel()
        one = m.step_s(prefill_tokens=0, decode_seqs=1)
        many = m.step_s(prefill_tokens=0, decode_seqs=256)
        assert (0.006 < one < 0.008, 0.02 < many < 0.035) == (True, True)

    def test_rejects_nonsense(self) -> None:
        """Zero speed and negative costs are refused."""
        with pytest.raises(ValueError, match="speed"):
            TimingModel(speed=0)
        with pytest.raises(ValueError, match="negative"):
            TimingModel(decode_base_ms=-1)


class TestDefaultBlocks:
    """The default KV block count."""

    def test_one_h100(self) -> None:
        """About 440k tokens of KV for Llama-3-8B on one H100: 27.5k blocks of 16."""
        assert 27_000 < default_num_gpu_blocks(block_size=16) < 28_000

    def test_tensor_parallel_adds_memory(self) -> None:
        """Two GPUs hold more than twice one GPU's KV (the weights are paid once)."""
        assert default_num_gpu_blocks(block_size=16, tp=2) > 2 * default_num_gpu_blocks(
            block_size=16
        )


class TestHistogram:
    """Histogram bucket bounds."""

    def test_bucket_bounds_are_inclusive(self) -> None:
        """A value equal to a bound lands in that bucket (Prometheus `le`)."""
        h = Histogram([0.1, 1.0])
        h.observe(0.1)
        h.observe(5.0, n=2)
        assert ([1, 1, 3], 3, pytest.approx(10.1)) == (h.cumulative(), h.count, h.sum)
