"""Token usage on the router: counts per request, the ledger of totals, their delivery."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.controller.store.usage import Figures, RowKey, merge, totals
from llmgw.router.control.tokenusage import ROWS_PER_REPORT, TokenCounts, TokenLedger
from llmgw.router.control.usagereports import UsageReporter, deliver
from llmgw.router.errors import ControllerCallFailed, ReportRefused
from llmgw.testing import ManualClock
from llmgw.wire.answerusage import Usage
from llmgw.wire.usage import MAX_COUNT, TokenUsage, UsageReport

H = 1_800_000_000  # ManualClock's start: the start of an hour


def used(prompt: int, completion: int) -> Usage:
    return Usage(prompt=prompt, completion=completion, cached=0)


def row(
    key: str = "alice", *, requests: int, prompt: int, completion: int, hour: int = H
) -> TokenUsage:
    return TokenUsage(
        hour=hour,
        key=key,
        team="research",
        model="m1",
        requests=requests,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


class TestTokenCounts:
    """Per-request counting and the drain."""

    def test_counts_requests_and_tokens_per_key_and_model(self) -> None:
        """Two requests of one key and model make one row; another key another row."""
        c = TokenCounts(clock=ManualClock())
        c.count("alice", "research", "m1", used(10, 5))
        c.count("alice", "research", "m1", used(3, 2))
        c.count("bob", "infra", "m1", used(1, 1))
        assert c.drain() == [
            row(requests=2, prompt=13, completion=7),
            TokenUsage(
                hour=H,
                key="bob",
                team="infra",
                model="m1",
                requests=1,
                prompt_tokens=1,
                completion_tokens=1,
            ),
        ]

    def test_an_answer_without_usage_adds_a_request_only(self) -> None:
        """No engine usage: the request counts, no token is invented."""
        c = TokenCounts(clock=ManualClock())
        c.count("alice", "research", "m1", None)
        assert c.drain() == [row(requests=1, prompt=0, completion=0)]

    def test_drain_starts_over(self) -> None:
        """What was drained is not drained again."""
        c = TokenCounts(clock=ManualClock())
        c.count("alice", "research", "m1", used(1, 1))
        c.drain()
        assert c.drain() == []

    def test_requests_after_the_hour_go_in_the_next_hour(self) -> None:
        """A request ending in the next hour counts there."""
        clock = ManualClock()
        c = TokenCounts(clock=clock)
        c.count("alice", "research", "m1", used(1, 1))
        clock.advance(3600.0)
        c.count("alice", "research", "m1", used(2, 2))
        assert [(r.hour, r.prompt_tokens) for r in c.drain()] == [(H, 1), (H + 3600, 2)]

    @pytest.mark.parametrize("name", ["a\x00b", "tab\there", "x" * 300, "\u2028"])
    def test_odd_names_are_escaped_into_what_the_controller_takes(self, name: str) -> None:
        """A file key's name with control characters or over 256 characters is escaped and
        cut, so the controller's validation takes it."""
        c = TokenCounts(clock=ManualClock())
        c.count(name, name, "m1", None)
        (got,) = c.drain()
        assert got.key.isprintable()
        assert len(got.key) <= 256
        assert msgspec.convert(msgspec.to_builtins(got), TokenUsage) == got


class TestAbsurdCounts:
    """An engine's usage past what a report may carry saturates instead of blocking reports."""

    def test_counts_past_2_53_saturate_and_the_report_stays_valid(self) -> None:
        """An answer claiming 2**64 - 1 tokens, counted twice and totalled over two
        drains, is reported as 2**53 (the controller's bound): past it the controller
        refused every report holding the row, and with it every other key's usage and
        the router's leases, for the rest of the hour."""
        counts = TokenCounts(clock=ManualClock())
        ledger = TokenLedger(clock=ManualClock())
        for _ in range(2):
            counts.count("alice", "research", "m1", used(2**64 - 1, 2**60))
            counts.count("alice", "research", "m1", used(2**64 - 1, 2**60))
            ledger.add(counts.drain())
        body = {"router_id": "r", "sent_at": 1.0, "tokens": ledger.pending()}
        (got,) = msgspec.json.decode(msgspec.json.encode(body), type=UsageReport).tokens
        assert (got.requests, got.prompt_tokens, got.completion_tokens) == (4, MAX_COUNT, MAX_COUNT)


class TestTokenLedger:
    """Running totals, what is pending, and what is forgotten."""

    def test_pending_rows_are_totals_not_differences(self) -> None:
        """Two hand-overs for one row are pending as their sum."""
        ledger = TokenLedger(clock=ManualClock())
        ledger.add([row(requests=1, prompt=10, completion=5)])
        ledger.add([row(requests=2, prompt=20, completion=1)])
        assert ledger.pending() == [row(requests=3, prompt=30, completion=6)]

    def test_acked_rows_are_no_longer_pending(self) -> None:
        """Once a report with a row's figures is answered, the row is not sent again."""
        ledger = TokenLedger(clock=ManualClock())
        ledger.add([row(requests=1, prompt=10, completion=5)])
        ledger.acked(ledger.pending())
        assert ledger.pending() == []

    def test_a_row_counted_again_after_sending_stays_pending(self) -> None:
        """Counts added while a report was on its way keep the row pending, with its new total."""
        ledger = TokenLedger(clock=ManualClock())
        ledger.add([row(requests=1, prompt=10, completion=5)])
        sent = ledger.pending()
        ledger.add([row(requests=1, prompt=1, completion=1)])
        ledger.acked(sent)
        assert ledger.pending() == [row(requests=2, prompt=11, completion=6)]

    def test_acked_rows_of_past_hours_are_forgotten(self) -> None:
        """The current hour's rows stay (totals keep growing); a past hour's acked ones go."""
        clock = ManualClock()
        ledger = TokenLedger(clock=clock)
        ledger.add([row(requests=1, prompt=1, completion=1)])
        ledger.acked(ledger.pending())
        assert len(ledger) == 1
        clock.advance(3600.0)
        ledger.acked([])
        assert len(ledger) == 0

    def test_past_hour_rows_not_acked_are_kept(self) -> None:
        """A past hour's row the controller has not taken is kept and still pending."""
        clock = ManualClock()
        ledger = TokenLedger(clock=clock)
        ledger.add([row(requests=1, prompt=1, completion=1)])
        clock.advance(7200.0)
        ledger.acked([])
        assert ledger.pending() == [row(requests=1, prompt=1, completion=1)]

    def test_full_ledger_drops_the_oldest_hours_and_counts_them(self) -> None:
        """Past max_rows the oldest rows go, never the newest, and are counted."""
        ledger = TokenLedger(clock=ManualClock(), max_rows=2)
        ledger.add([row(requests=1, prompt=1, completion=1, hour=H + 3600 * i) for i in range(3)])
        assert [r.hour for r in ledger.pending()] == [H + 3600, H + 7200]
        assert ledger.dropped == 1

    def test_a_report_carries_at_most_rows_per_report(self) -> None:
        """A long backlog is sent over several reports, oldest first."""
        ledger = TokenLedger(clock=ManualClock())
        ledger.add([row(f"k{i:05}", requests=1, prompt=0, completion=0) for i in range(5_001)])
        first = ledger.pending()
        assert len(first) == ROWS_PER_REPORT
        ledger.acked(first)
        assert [r.key for r in ledger.pending()] == ["k05000"]


class _Sink:
    """A controller that keeps rows as the store does (largest figure per router row)."""

    def __init__(self) -> None:
        self.kept: dict[RowKey, Figures] = {}
        self.reports: list[UsageReport] = []
        # What the next post does: "ok", "down" (nothing arrives), "lost" (kept, answer
        # lost), "refused" (a 422).
        self.next = "ok"

    async def post_usage(self, report: UsageReport) -> None:
        mode, self.next = self.next, "ok"
        if mode == "down":
            raise ControllerCallFailed("connection refused")
        if mode == "refused":
            raise ReportRefused("POST /v1/usage answered 422", status=422)
        self.reports.append(report)
        merge(self.kept, report.counter_id or report.router_id, report.tokens)
        if mode == "lost":
            raise ControllerCallFailed("timed out")

    def team_tokens(self) -> list[tuple[int, int, int]]:
        return [
            (r.requests, r.prompt_tokens, r.completion_tokens)
            for r in totals(self.kept, since=0, by="team")
        ]


def _report(_reset: bool) -> UsageReport:
    return UsageReport(router_id="r", sent_at=1.0)


class TestDelivery:
    """Reports carry the ledger's pending rows; nothing is lost or counted twice."""

    async def test_a_failed_report_is_carried_by_the_next(self) -> None:
        """The controller down for one report: the next carries the rows, totals whole."""
        counts = TokenCounts(clock=ManualClock())
        sink = _Sink()
        rep = UsageReporter(build=_report, sink=sink, interval_s=1, drain=counts.drain)
        counts.count("alice", "research", "m1", used(10, 5))
        sink.next = "down"
        await rep.tick()
        counts.count("alice", "research", "m1", used(1, 1))
        await rep.tick()
        assert sink.team_tokens() == [(2, 11, 6)]
        assert rep.failures == 0

    async def test_a_report_whose_answer_was_lost_counts_once(self) -> None:
        """Kept by the controller but unanswered: sent again, and still counted once."""
        counts = TokenCounts(clock=ManualClock())
        sink = _Sink()
        rep = UsageReporter(build=_report, sink=sink, interval_s=1, drain=counts.drain)
        counts.count("alice", "research", "m1", used(10, 5))
        sink.next = "lost"
        await rep.tick()
        await rep.tick()
        assert len(sink.reports) == 2
        assert sink.reports[0].tokens == sink.reports[1].tokens
        assert sink.team_tokens() == [(1, 10, 5)]

    async def test_reports_name_their_counter(self) -> None:
        """Token rows go with a counter id new to this process, after the router_id."""
        counts = TokenCounts(clock=ManualClock())
        sink = _Sink()
        rep = UsageReporter(build=_report, sink=sink, interval_s=1, drain=counts.drain)
        other = UsageReporter(build=_report, sink=sink, interval_s=1, drain=counts.drain)
        counts.count("alice", "research", "m1", None)
        await rep.tick()
        counts.count("alice", "research", "m1", None)
        await other.tick()
        ids = [r.counter_id for r in sink.reports]
        assert all(i.startswith("r@") for i in ids)
        assert ids[0] != ids[1]
        assert sink.team_tokens() == [(2, 0, 0)]

    @given(st.integers(min_value=1, max_value=256))
    @settings(max_examples=30)
    def test_every_router_id_gives_a_counter_the_controller_takes(self, n: int) -> None:
        """Whatever router_id the config takes, the report with token rows decodes as the
        controller decodes it (its counter_id within bounds)."""
        sink = _Sink()
        ledger = TokenLedger(clock=ManualClock())
        report = UsageReport(router_id="r" * n, sent_at=1.0)
        sent, _ = asyncio.run(
            deliver(sink, ledger, report, [row(requests=1, prompt=1, completion=1)])
        )
        kept = msgspec.json.decode(msgspec.json.encode(sent), type=UsageReport)
        assert (kept.router_id, len(kept.tokens)) == ("r" * n, 1)

    async def test_long_router_ids_keep_distinct_counters(self) -> None:
        """Two long router_ids that share their first 200 characters count apart."""
        ledger = TokenLedger(clock=ManualClock())
        ids = []
        for last in "ab":
            report = UsageReport(router_id="r" * 200 + last, sent_at=1.0)
            sent, _ = await deliver(
                _Sink(), ledger, report, [row(requests=1, prompt=1, completion=1)]
            )
            ids.append(sent.counter_id)
        assert ids[0] != ids[1]
        assert all(i.startswith("r" * 64) for i in ids)

    async def test_once_acked_reports_carry_no_tokens(self) -> None:
        """With nothing new, a report carries no token rows."""
        counts = TokenCounts(clock=ManualClock())
        sink = _Sink()
        rep = UsageReporter(build=_report, sink=sink, interval_s=1, drain=counts.drain)
        counts.count("alice", "research", "m1", None)
        await rep.tick()
        await rep.tick()
        assert [len(r.tokens) for r in sink.reports] == [1, 0]

    async def test_a_refused_report_gives_its_rows_up(self) -> None:
        """A 4xx for what a report holds is not retried forever: its rows are given up."""
        ledger = TokenLedger(clock=ManualClock())
        sink = _Sink()
        sink.next = "refused"
        with pytest.raises(ReportRefused):
            await deliver(sink, ledger, _report(True), [row(requests=1, prompt=1, completion=1)])
        assert ledger.pending() == []

    async def test_without_a_controller_counts_are_dropped(self) -> None:
        """A router on its own drains its counts every tick and keeps nothing."""
        counts = TokenCounts(clock=ManualClock())
        rep = UsageReporter(build=_report, sink=None, interval_s=1, drain=counts.drain)
        counts.count("alice", "research", "m1", used(1, 1))
        await rep.tick()
        assert (counts.drain(), len(rep.ledger)) == ([], 0)

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 50)), max_size=4),
                st.sampled_from(["ok", "down", "lost"]),
                st.sampled_from([0.0, 1800.0]),
            ),
            max_size=12,
        )
    )
    def test_whatever_fails_the_controller_ends_with_the_true_totals(
        self, steps: list[tuple[list[tuple[str, int]], str, float]]
    ) -> None:
        """Any run of requests, reports down or answered-but-lost, and hours passing ends,
        after one good report, with the controller holding exactly what was counted."""
        clock = ManualClock()
        counts = TokenCounts(clock=clock)
        sink = _Sink()
        rep = UsageReporter(build=_report, sink=sink, interval_s=1, drain=counts.drain)
        truth: dict[tuple[int, str], int] = {}
        for requests, mode, advance_s in steps:
            for key, prompt in requests:
                counts.count(key, "t", "m", used(prompt, 1))
                hour = int(clock.wall() // 3600) * 3600
                truth[(hour, key)] = truth.get((hour, key), 0) + prompt
            sink.next = mode
            asyncio.run(rep.tick())
            clock.advance(advance_s)
        asyncio.run(rep.tick())
        got = {(r.hour, r.key or ""): r.prompt_tokens for r in totals(sink.kept, since=0, by="key")}
        assert got == truth
