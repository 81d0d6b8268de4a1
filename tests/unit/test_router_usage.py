"""Usage reports: the per-model tracker, the report, the reporter tick."""

from __future__ import annotations

import logging

import pytest

from llmgw.router.control.usagereports import LoadTracker, UsageReporter, build_report
from llmgw.runtime.repeats import REPEAT_S
from llmgw.testing import ManualClock
from llmgw.wire.usage import ModelLoad, UsageReport


class TestTracker:
    """The per-model usage tracker."""

    def test_started_and_inflight(self) -> None:
        """Requests started in the interval and in flight now are counted per model."""
        clock = ManualClock()
        t = LoadTracker(clock=clock)
        t.started("m")
        t.started("m")
        t.finished("m")
        clock.advance(2.0)
        assert t.load({}, reset=False) == {
            "m": ModelLoad(inflight=1, held=0, requests=2, interval_s=2.0)
        }

    def test_reset_starts_a_new_interval(self) -> None:
        """After a reset the interval's request count starts over; inflight stays."""
        clock = ManualClock()
        t = LoadTracker(clock=clock)
        t.started("m")
        t.load({}, reset=True)
        clock.advance(1.0)
        assert t.load({}, reset=False)["m"] == ModelLoad(
            inflight=1, held=0, requests=0, interval_s=1.0
        )

    def test_held_models_appear(self) -> None:
        """A model with only held requests appears with its held count."""
        t = LoadTracker(clock=ManualClock())
        assert t.load({"cold": 3}, reset=False)["cold"].held == 3

    def test_finished_models_leave(self) -> None:
        """A model with nothing in flight and nothing started is absent after a reset."""
        t = LoadTracker(clock=ManualClock())
        t.started("m")
        t.finished("m")
        t.load({}, reset=True)
        assert t.load({}, reset=False) == {}


class TestReport:
    """The usage report's unknowns and ordering."""

    def test_unknown_last_used_stays_absent(self) -> None:
        """Endpoints the registry left out of last_used are absent, not zero."""
        r = build_report(
            router_id="r", sent_at=5.0, last_used={}, inflight={"a": 0}, demand={}, load={}
        )
        assert r.last_used == {}
        assert r.inflight == {"a": 0}

    def test_maps_are_sorted(self) -> None:
        """Maps come out sorted by key."""
        r = build_report(
            router_id="r",
            sent_at=5.0,
            last_used={"b": 2.0, "a": 1.0},
            inflight={},
            demand={"z": 1, "y": 2},
            load={},
        )
        assert (list(r.last_used), list(r.demand)) == (["a", "b"], ["y", "z"])


class _Sink:
    def __init__(self, *, fail: bool) -> None:
        self.fail = fail
        self.got: list[UsageReport] = []

    async def post_usage(self, report: UsageReport) -> None:
        if self.fail:
            raise RuntimeError("controller down")
        self.got.append(report)


def _report(_reset: bool) -> UsageReport:
    return UsageReport(router_id="r", sent_at=1.0)


class TestReporter:
    """The usage reporter's tick and failures."""

    async def test_tick_posts(self) -> None:
        """A tick builds one report and posts it."""
        sink = _Sink(fail=False)
        rep = UsageReporter(build=_report, sink=sink, interval_s=1)
        await rep.tick()
        assert sink.got == [UsageReport(router_id="r", sent_at=1.0)]
        assert rep.last == sink.got[0]

    async def test_failed_post_is_counted_not_raised(self) -> None:
        """A sink that fails is counted and the loop survives."""
        rep = UsageReporter(build=_report, sink=_Sink(fail=True), interval_s=1)
        await rep.tick()
        await rep.tick()
        assert rep.failures == 2

    async def test_without_sink_the_report_is_kept(self) -> None:
        """Without a controller the report is still built (for /admin/usage)."""
        rep = UsageReporter(build=_report, sink=None, interval_s=1)
        assert await rep.tick() == rep.last

    async def test_failures_said_once_then_every_few_minutes_then_cleared(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """'usage report failed' was logged at every report (every 2 s) while the
        controller was away; now once, again after REPEAT_S with the count, and once
        when a report is delivered again."""
        clock = ManualClock()
        sink = _Sink(fail=True)
        rep = UsageReporter(build=_report, sink=sink, interval_s=2, clock=clock)
        n = int(REPEAT_S / 2)
        with caplog.at_level(logging.INFO):
            for _ in range(n):
                await rep.tick()
                clock.advance(2.0)
            assert len(_lines(caplog, "usage report failed")) == 1
            await rep.tick()
            again = _lines(caplog, "usage report failed")
            assert len(again) == 2
            assert f"reports_failed={n}" in again[1]
            sink.fail = False
            await rep.tick()
            await rep.tick()
        (back,) = _lines(caplog, "usage reports delivered again")
        assert f"reports_failed={n + 1}" in back
        assert rep.failures == 0


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]
