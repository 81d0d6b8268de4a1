"""The sim-engine's sleep model: levels, tags, wake times, GPU memory (simengine/sleep.py)."""

from __future__ import annotations

import pytest

from llmgw.simengine import sleep
from llmgw.simengine.sleep import Sleeper, SleepRefused, SleepSettings

ON = SleepSettings(enabled=True, dev_mode=True)


class TestWakeTime:
    """Wake times by model size, level and settings."""

    def test_small_model_wakes_within_the_published_range(self) -> None:
        """An 8B model on one card wakes from level 1 in 0.1-0.8 s, as vLLM's figures."""
        assert 0.1 <= ON.wake_s(level=1, tp=1, speed=1.0) <= 0.8

    def test_30b_on_one_card_wakes_in_about_three_seconds(self) -> None:
        """A 30B model (61 GB of weights) on one card wakes from level 1 in about 2.9 s."""
        s = SleepSettings(enabled=True, weights_gb=61.0)
        assert s.wake_s(level=1, tp=1, speed=1.0) == pytest.approx(2.9, abs=0.15)

    def test_235b_on_four_cards_wakes_in_five_to_six_seconds(self) -> None:
        """A 235B model (470 GB) over four cards wakes from level 1 in 5.27-5.66 s."""
        s = SleepSettings(enabled=True, weights_gb=470.0)
        assert 5.2 <= s.wake_s(level=1, tp=4, speed=1.0) <= 5.7

    def test_level_two_costs_more_than_level_one(self) -> None:
        """Level 2 reloads the weights: its wake is slower than level 1's."""
        assert ON.wake_s(level=2, tp=1, speed=1.0) > ON.wake_s(level=1, tp=1, speed=1.0)

    def test_overrides_and_speed(self) -> None:
        """A fixed wake time replaces the size model and --speed divides it."""
        s = SleepSettings(enabled=True, wake_l1_s=3.0, wake_l2_s=8.0)
        assert s.wake_s(level=1, tp=8, speed=2.0) == 1.5
        assert s.wake_s(level=2, tp=1, speed=1.0) == 8.0

    def test_bad_settings_are_refused(self) -> None:
        """Zero weights or a cold factor below 1 are refused with a message."""
        with pytest.raises(ValueError, match="weights-gb"):
            SleepSettings(weights_gb=0)
        with pytest.raises(ValueError, match="cold-factor"):
            SleepSettings(cold_factor=0.5)
        with pytest.raises(ValueError, match="sleep-s"):
            SleepSettings(sleep_s=-1.0)


class TestSleeper:
    """The sleeper's levels, tags and GPU memory."""

    def test_sleep_needs_sleep_mode(self) -> None:
        """Without --enable-sleep-mode a sleep is refused with 400 and the flag's name."""
        with pytest.raises(SleepRefused, match="--enable-sleep-mode") as err:
            Sleeper(SleepSettings()).sleep(1)
        assert err.value.status == 400

    def test_unknown_level_is_refused(self) -> None:
        """Levels are 0, 1 and 2 only."""
        with pytest.raises(SleepRefused, match="level"):
            Sleeper(ON).sleep(3)

    def test_level_one_offloads_and_frees_gpu_memory(self) -> None:
        """Level 1 is 'weights_offloaded' and holds the asleep figure per GPU."""
        s = Sleeper(ON)
        assert s.gpu_bytes() == int(sleep.AWAKE_GIB * sleep.GIB)
        s.sleep(1)
        assert (s.sleeping, s.state) == (True, "weights_offloaded")
        assert s.gpu_bytes() == int(sleep.ASLEEP_GIB * sleep.GIB)

    def test_partial_wake_stays_asleep(self) -> None:
        """Waking the weights alone leaves the KV cache asleep, as vLLM's tags do."""
        s = Sleeper(ON)
        s.sleep(2)
        awake, cost = s.wake(["weights"])
        assert (awake, s.state, cost > 0) == (False, "discard_all", True)
        awake, cost = s.wake(["kv_cache"])
        assert (awake, s.state, cost, s.wakes) == (True, "awake", 0.0, 1)

    def test_level_zero_pauses_without_freeing(self) -> None:
        """Level 0 pauses scheduling only: sleeping, all memory kept, a free wake."""
        s = Sleeper(ON)
        s.sleep(0)
        assert (s.sleeping, s.state, s.gpu_bytes()) == (True, "paused", s.gpu_bytes())
        assert s.wake(None) == (True, 0.0)

    def test_unknown_tag_is_refused(self) -> None:
        """A tag other than weights, kv_cache (or scheduling) is a 400."""
        s = Sleeper(ON)
        s.sleep(1)
        with pytest.raises(SleepRefused, match="unknown tag"):
            s.wake(["everything"])
