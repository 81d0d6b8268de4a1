"""The process_* metrics (runtime/procmetrics.py) where the boot clock is missing."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llmgw.runtime.procmetrics import register_process_metrics


class TestWithoutTheBootClock:
    """A platform without CLOCK_BOOTTIME (not Linux) still starts its programs."""

    def test_registering_does_not_raise(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """No CLOCK_BOOTTIME: the collector reads the boot time the stock way (/proc/stat,
        here on Linux), where it raised AttributeError and the router, its supervisor and
        the controller failed to start (macOS has no such clock, nor /proc: no series)."""
        monkeypatch.delattr(time, "CLOCK_BOOTTIME")
        registry = CollectorRegistry()
        register_process_metrics(registry)
        assert b"process_start_time_seconds" in generate_latest(registry)
