"""Token usage and events past their retention: deleted by the leader in bounded batches."""

from __future__ import annotations

import pytest

from llmgw.controller.config import parse_args
from llmgw.controller.fleet.records import Changes, Event
from llmgw.controller.store import StoreError
from llmgw.controller.store.memory import MemoryStore
from llmgw.controller.tick.retention import DAY_S, EventRetention, UsageRetention
from llmgw.runtime.clock import ManualClock
from llmgw.wire.usage import HOUR_S, TokenUsage

# ManualClock's wall starts at 1.8e9: the UTC hour that holds it.
NOW_HOUR = int(1.8e9 // HOUR_S) * HOUR_S


def usage(hour: int, key: str = "alice") -> TokenUsage:
    return TokenUsage(
        hour=hour, key=key, team="t", model="m", requests=1, prompt_tokens=1, completion_tokens=1
    )


def hours(store: MemoryStore) -> list[int]:
    return sorted({r.hour for r in store.usage(since=0, by="model")})


class BrokenStore(MemoryStore):
    def prune_usage(self, *, before: int, limit: int) -> int:
        raise StoreError("database away")


class TestUsageRetention:
    """What the control loop deletes, and how often."""

    def store(self) -> MemoryStore:
        """Usage of 5 hours 32 days ago (3 keys each) and of the current hour."""
        store = MemoryStore()
        old = NOW_HOUR - 32 * DAY_S
        for i in range(5):
            store.record_usage("r1", [usage(old + i * HOUR_S, k) for k in ("a", "b", "c")])
        store.record_usage("r1", [usage(NOW_HOUR)])
        return store

    async def test_a_backlog_drains_a_batch_per_tick_then_waits(self) -> None:
        """Fifteen old rows, batches of four: four ticks in a row, then nothing until
        every_s has passed; the current hour stays."""
        clock, store = ManualClock(), self.store()
        r = UsageRetention(store, retention_days=31, clock=clock, batch_rows=4, every_s=600.0)
        assert [await r.tick() for _ in range(6)] == [4, 4, 4, 3, 0, 0]
        assert hours(store) == [NOW_HOUR]
        store.record_usage("r1", [usage(NOW_HOUR - 40 * DAY_S)])
        clock.advance(599.0)
        assert await r.tick() == 0
        clock.advance(1.0)
        assert await r.tick() == 1

    async def test_hours_within_the_retention_stay(self) -> None:
        """With 40 days kept, rows 32 days old are not touched."""
        store = self.store()
        r = UsageRetention(store, retention_days=40, clock=ManualClock())
        assert await r.tick() == 0
        assert len(hours(store)) == 6

    async def test_the_hour_that_holds_the_cutoff_is_kept_whole(self) -> None:
        """The cutoff is the start of the hour it falls in: that hour stays entire."""
        clock = ManualClock()
        clock.advance(1800.0)
        r = UsageRetention(MemoryStore(), retention_days=32, clock=clock)
        assert r.cutoff() == int((1.8e9 + 1800.0 - 32 * DAY_S) // HOUR_S) * HOUR_S
        assert r.cutoff() % HOUR_S == 0

    async def test_zero_keeps_everything(self) -> None:
        """Retention 0 days: nothing is ever deleted."""
        store = self.store()
        r = UsageRetention(store, retention_days=0, clock=ManualClock())
        assert await r.tick() == 0
        assert len(hours(store)) == 6

    async def test_a_failed_delete_is_tried_again_later(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The database refusing is logged, not raised, and retried after every_s."""
        clock = ManualClock()
        r = UsageRetention(BrokenStore(), retention_days=32, clock=clock, every_s=60.0)
        assert await r.tick() == 0
        assert "usage retention failed" in caplog.text
        caplog.clear()
        assert await r.tick() == 0
        assert caplog.text == ""
        clock.advance(60.0)
        assert await r.tick() == 0
        assert "usage retention failed" in caplog.text


def event(at: float) -> Event:
    return Event(
        id=0, at=at, kind="replica.ready", subject="replica", subject_id="r1", model="m",
        message="ready",
    )  # fmt: skip


class BrokenEvents(MemoryStore):
    def prune_events(self, *, before: float | None, keep: int | None, limit: int) -> int:
        raise StoreError("database away")


class TestEventRetention:
    """Which events the control loop deletes, and how often."""

    def store(self) -> MemoryStore:
        """Ten events 31 days old, then two of the last minute."""
        store = MemoryStore()
        old = 1.8e9 - 31 * DAY_S
        store.apply(Changes(events=[event(old + i) for i in range(10)]))
        store.apply(Changes(events=[event(1.8e9 - 60), event(1.8e9 - 1)]))
        return store

    def ats(self, store: MemoryStore) -> list[float]:
        return [e.at for e in store.events(limit=100)]

    async def test_a_backlog_drains_a_batch_per_tick_then_waits(self) -> None:
        """Ten old events, batches of four: three ticks in a row, then nothing until
        every_s has passed; the recent events stay."""
        clock, store = ManualClock(), self.store()
        r = EventRetention(
            store, retention_days=30, max_rows=0, clock=clock, batch_rows=4, every_s=600.0
        )
        assert [await r.tick() for _ in range(5)] == [4, 4, 2, 0, 0]
        assert self.ats(store) == [1.8e9 - 60, 1.8e9 - 1]
        clock.advance(30 * DAY_S)
        assert await r.tick() == 2

    async def test_the_row_cap_keeps_the_newest(self) -> None:
        """A cap of five keeps the five newest events, however recent all are."""
        store = self.store()
        r = EventRetention(store, retention_days=0, max_rows=5, clock=ManualClock())
        assert await r.tick() == 7
        assert len(self.ats(store)) == 5
        assert self.ats(store)[-1] == 1.8e9 - 1

    async def test_zero_and_zero_keep_everything(self) -> None:
        """No age limit and no cap: nothing is ever deleted."""
        store = self.store()
        r = EventRetention(store, retention_days=0, max_rows=0, clock=ManualClock())
        assert await r.tick() == 0
        assert len(self.ats(store)) == 12

    async def test_a_failed_delete_is_tried_again_later(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The database refusing is logged, not raised, and retried after every_s."""
        clock = ManualClock()
        r = EventRetention(BrokenEvents(), retention_days=30, max_rows=0, clock=clock, every_s=60.0)
        assert await r.tick() == 0
        assert "event retention failed" in caplog.text
        caplog.clear()
        assert await r.tick() == 0
        assert caplog.text == ""
        clock.advance(60.0)
        assert await r.tick() == 0
        assert "event retention failed" in caplog.text


class TestEventRetentionFlags:
    """--event-retention-days and --event-retention-rows: 30 days and 1,000,000 rows."""

    def test_defaults_and_zero(self) -> None:
        """Thirty days and a million events unless told; 0 turns either rule off."""
        c = parse_args([])
        assert (c.event_retention_days, c.event_retention_rows) == (30.0, 1_000_000)
        c = parse_args(["--event-retention-days", "0", "--event-retention-rows", "0"])
        assert (c.event_retention_days, c.event_retention_rows) == (0.0, 0)

    @pytest.mark.parametrize(
        ("flag", "value"),
        [("--event-retention-days", "-1"), ("--event-retention-rows", "-5")],
    )
    def test_negative_is_refused(
        self, flag: str, value: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A negative retention is a typo: exit 2 naming the flag."""
        with pytest.raises(SystemExit) as ex:
            parse_args([flag, value])
        assert ex.value.code == 2
        assert flag in capsys.readouterr().err


class TestRetentionFlag:
    """--usage-retention-days: 90 by default, 0 or at least a month and a day."""

    def test_default_and_zero(self) -> None:
        """Ninety days unless told; 0 keeps usage forever."""
        assert parse_args([]).usage_retention_days == 90.0
        assert parse_args(["--usage-retention-days", "0"]).usage_retention_days == 0.0

    def test_shorter_than_a_monthly_budget_is_refused(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Ten days would forget a monthly budget's spend: exit 2, saying why."""
        with pytest.raises(SystemExit) as ex:
            parse_args(["--usage-retention-days", "10"])
        assert ex.value.code == 2
        assert "monthly budget" in capsys.readouterr().err
