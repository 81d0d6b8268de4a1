"""A model spec's sleep settings: sleep_mode, sleep_level, weights_gb, and who may sleep."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from llmgw.controller.api.validate import check_spec
from llmgw.wire.models import ModelSpec, sleep_problem


def spec(**kw: Any) -> ModelSpec:
    base: dict[str, Any] = {"name": "m", "engine": "vllm", "gpu_classes": ["H100-80G"]}
    return msgspec.convert({**base, **kw}, ModelSpec)


class TestSleepSpec:
    """A spec's sleep settings and which engines may sleep."""

    def test_defaults_keep_today_s_behaviour(self) -> None:
        """Without the fields a spec does not sleep and has no level or size."""
        s = spec()
        assert (s.sleep_mode, s.sleep_level, s.weights_gb) == (False, None, None)
        assert sleep_problem(s) is None

    def test_vllm_and_sim_may_sleep(self) -> None:
        """vllm and sim engines accept sleep_mode with either level."""
        for engine in ("vllm", "sim"):
            for level in (1, 2, None):
                assert (
                    sleep_problem(spec(engine=engine, sleep_mode=True, sleep_level=level)) is None
                )

    def test_llamacpp_is_refused_with_the_reason(self) -> None:
        """A llama.cpp spec with sleep_mode is refused, naming the field and why."""
        field, why = sleep_problem(spec(engine="llamacpp", sleep_mode=True)) or ("", "")
        assert field == "sleep_mode"
        assert "llama-server cannot sleep" in why
        assert check_spec(spec(engine="llamacpp", sleep_mode=True)) == (field, why)

    def test_sglang_is_refused(self) -> None:
        """SGLang is refused too, saying which engines can sleep."""
        got = sleep_problem(spec(engine="sglang", sleep_mode=True))
        assert got is not None
        assert "engines that can: vllm, sim" in got[1]

    def test_level_without_sleep_mode_is_refused(self) -> None:
        """sleep_level alone would do nothing: refused."""
        assert sleep_problem(spec(sleep_level=2)) == (
            "sleep_level",
            "only used with sleep_mode: true",
        )

    def test_sleep_after_s_needs_sleep_mode_and_sets_the_eviction_threshold(self) -> None:
        """sleep_after_s alone is refused; with sleep_mode it replaces idle_timeout_s."""
        assert sleep_problem(spec(sleep_after_s=5)) == (
            "sleep_after_s",
            "only used with sleep_mode: true",
        )
        assert spec(idle_timeout_s=600, sleep_after_s=5).evictable_after_s == 600
        assert spec(idle_timeout_s=600, sleep_mode=True, sleep_after_s=5).evictable_after_s == 5
        assert spec(idle_timeout_s=600, sleep_mode=True).evictable_after_s == 600

    def test_bad_level_and_size_fail_decoding(self) -> None:
        """A level other than 1 or 2, or a size not above zero, is a validation error."""
        with pytest.raises(msgspec.ValidationError, match="sleep_level"):
            spec(sleep_mode=True, sleep_level=3)
        with pytest.raises(msgspec.ValidationError, match="weights_gb"):
            spec(weights_gb=0)
