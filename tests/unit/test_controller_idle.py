"""Idle tracking: merge across routers, unknown is not idle."""

from __future__ import annotations

from llmgw.controller.idle import IdleTracker, ModelLoadSum
from llmgw.testing import ManualClock
from llmgw.wire.usage import FlowQueued, ModelLoad, UsageReport

NOW = 1.8e9


def report(router: str, sent_at: float = NOW, **fields: object) -> UsageReport:
    return UsageReport(router_id=router, sent_at=sent_at, **fields)  # type: ignore[arg-type]


class TestLastUsedMerge:
    """Last-used times merged across routers keep unknown apart from idle."""

    def test_unknown_is_none_not_zero(self) -> None:
        """A replica no router has reported has no idle time at all."""
        t = IdleTracker(clock=ManualClock())
        assert (t.last_used("r"), t.idle_for("r", now=NOW)) == (None, None)

    def test_newest_timestamp_wins_across_routers(self) -> None:
        """An older timestamp from another router never moves last_used backwards."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", last_used={"r": NOW - 10}))
        t.ingest(report("b", last_used={"r": NOW - 500}))
        assert t.last_used("r") == NOW - 10
        t.ingest(report("b", last_used={"r": NOW - 2}))
        assert t.idle_for("r", now=NOW) == 2.0

    def test_restarted_router_nominates_nothing(self) -> None:
        """A new router id with an empty map changes no known time and makes nothing idle."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", last_used={"r1": NOW - 30}))
        t.ingest(report("a-restarted", last_used={}))
        assert (t.idle_for("r1", now=NOW), t.idle_for("r2", now=NOW)) == (30.0, None)

    def test_absence_never_overwrites_a_known_timestamp(self) -> None:
        """The same router omitting a replica later does not forget it."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", sent_at=NOW - 5, last_used={"r": NOW - 100}))
        t.ingest(report("a", sent_at=NOW, last_used={"other": NOW - 1}))
        assert t.last_used("r") == NOW - 100

    def test_idle_is_never_negative(self) -> None:
        """A router clock ahead of ours gives idle 0, not a negative duration."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", last_used={"r": NOW + 3}))
        assert t.idle_for("r", now=NOW) == 0.0

    def test_a_future_timestamp_does_not_pin_a_replica(self) -> None:
        """A use reported far ahead of our clock counts as a use when it was heard of:
        once that router goes quiet the replica grows idle, not idle 0 for ever."""
        clock = ManualClock()
        t = IdleTracker(clock=clock)
        t.ingest(report("a", last_used={"r": NOW + 1e12}))
        clock.advance(600.0)
        assert t.idle_for("r", now=clock.wall()) == 600.0

    def test_non_finite_timestamps_are_ignored(self) -> None:
        """NaN or infinity is not a measurement; the replica stays unknown."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", last_used={"r": float("nan"), "s": float("inf")}))
        assert (t.last_used("r"), t.last_used("s")) == (None, None)

    def test_forget_makes_a_replica_unknown_again(self) -> None:
        """forget() drops a gone replica's time."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", last_used={"r": NOW - 1}))
        t.forget("r")
        t.forget("never-seen")
        assert t.idle_for("r", now=NOW) is None

    def test_retain_keeps_only_live_replicas(self) -> None:
        """retain() forgets every replica not named."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", last_used={"r1": NOW - 1, "r2": NOW - 2}))
        t.retain({"r2"})
        assert (t.last_used("r1"), t.last_used("r2")) == (None, NOW - 2)


class TestDemandAndLoad:
    """Demand and load summed from the routers' latest fresh reports."""

    def test_demand_sums_fresh_routers(self) -> None:
        """Held requests for one model add up across routers."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", demand={"m": 2}))
        t.ingest(report("b", demand={"m": 3, "n": 0}))
        assert t.demand() == {"m": 5}

    def test_flow_queues_sum_fresh_routers_by_band_then_team(self) -> None:
        """Queued requests add up across fresh routers, first served band first."""
        clock = ManualClock()
        t = IdleTracker(clock=clock, fresh_s=10.0)
        q = FlowQueued
        t.ingest(report("a", flow_queued=[q(band="batch", team="x", requests=4)]))
        t.ingest(
            report(
                "b",
                flow_queued=[
                    q(band="batch", team="x", requests=1),
                    q(band="critical", team="ops", requests=2),
                ],
            )
        )
        assert t.flow_queued() == [
            q(band="critical", team="ops", requests=2),
            q(band="batch", team="x", requests=5),
        ]
        clock.advance(11.0)
        assert t.flow_queued() == []

    def test_a_router_that_stopped_reporting_holds_no_demand(self) -> None:
        """Past fresh_s since its last report, a router's demand no longer counts."""
        clock = ManualClock()
        t = IdleTracker(clock=clock, fresh_s=10.0)
        t.ingest(report("a", demand={"m": 2}))
        clock.advance(5.0)
        t.ingest(report("b", demand={"m": 1}))
        clock.advance(6.0)
        assert t.demand() == {"m": 1}

    def test_only_each_routers_latest_report_counts(self) -> None:
        """A router's new report replaces its old one; it is not added to it."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", sent_at=NOW, demand={"m": 2}))
        t.ingest(report("a", sent_at=NOW + 2, demand={"m": 1}))
        assert t.demand() == {"m": 1}

    def test_a_late_report_does_not_replace_a_newer_one(self) -> None:
        """A report sent earlier but received later is ignored for demand and load."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", sent_at=NOW + 2, demand={"m": 1}))
        t.ingest(report("a", sent_at=NOW, demand={"m": 9}))
        assert t.demand() == {"m": 1}

    def test_load_sums_inflight_held_and_rate(self) -> None:
        """Requests per second is each router's requests / interval, summed."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(
            report("a", load={"m": ModelLoad(inflight=3, held=1, requests=20, interval_s=2.0)})
        )
        t.ingest(
            report("b", load={"m": ModelLoad(inflight=1, held=0, requests=10, interval_s=2.0)})
        )
        assert t.load() == {"m": ModelLoadSum(inflight=4, held=1, requests_per_s=15.0, routers=2)}

    def test_rate_is_unknown_without_an_interval(self) -> None:
        """No measured interval means no rate, not a rate of zero."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", load={"m": ModelLoad(inflight=1)}))
        assert t.load()["m"].requests_per_s is None

    def test_inflight_is_unknown_until_reported(self) -> None:
        """In-flight per replica sums fresh routers; None when no router mentions it."""
        t = IdleTracker(clock=ManualClock())
        t.ingest(report("a", inflight={"r": 2}))
        t.ingest(report("b", inflight={"r": 1}))
        assert (t.inflight("r"), t.inflight("x")) == (3, None)
