"""Token usage per hour, key, team and model: counted per request, reported as totals.

Two halves (docs/tenants.md#usage):

- `TokenCounts`, in every process that serves requests: what each key used since
  the last `drain()`, bucketed by the UTC hour the request ended in. Per request
  one wall-clock read and one dict update.
- `TokenLedger`, in the process that reports to the controller (the router, or
  the supervisor of its workers): the running totals of this router process,
  which is what a report carries, never a difference. A row stays *dirty* until a
  report holding its current figures was answered 2xx; the controller keeps the
  largest figure of each row it has seen, so sending a row again (the answer was
  lost) or late (after a newer one) changes nothing. Clean rows of hours that are
  over are forgotten, so the ledger holds roughly the current hour.

A worker that dies takes the counts it had not handed over yet with it, as it
takes its requests in flight. While the controller cannot be reached the ledger
grows by one row per key and model each hour, up to `max_rows`; past that the
oldest hours are dropped (and counted), never the newest.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Final

from llmgw.runtime.clock import Clock
from llmgw.runtime.logs import kv
from llmgw.wire.answerusage import Usage
from llmgw.wire.usage import HOUR_S, MAX_COUNT, TokenUsage

log: Final = logging.getLogger(__name__)

# (hour, key, team, model)
RowKey = tuple[int, str, str, str]
# A name the controller refuses (control characters, over 256 characters) is sent
# escaped and cut instead: one odd key must not block every other row's report.
NAME_MAX = 256
# Rows per report: a router back after a long outage sends its backlog over several.
ROWS_PER_REPORT = 5_000


class TokenCounts:
    """One process's counts since the last drain: [requests, prompt, completion] per row."""

    __slots__ = ("_clock", "_rows")

    def __init__(self, *, clock: Clock) -> None:
        self._clock = clock
        self._rows: dict[RowKey, list[int]] = {}

    def count(self, key: str, team: str, model: str, usage: Usage | None) -> None:
        """One request of `key` routed to `model`; its tokens when the engine counted them."""
        hour = int(self._clock.wall() // HOUR_S) * HOUR_S
        row = (hour, key, team, model)
        figures = self._rows.get(row)
        if figures is None:
            figures = self._rows[row] = [0, 0, 0]
        figures[0] += 1
        if usage is not None:
            # Saturated at the report's bound: an engine's absurd count (2**64) made
            # every report holding the row a 422, and the report's other rows and the
            # router's leases went with it. The controller's sums saturate there too.
            figures[1] = min(MAX_COUNT, figures[1] + usage.prompt)
            figures[2] = min(MAX_COUNT, figures[2] + usage.completion)

    def drain(self) -> list[TokenUsage]:
        """The counts since the last drain, as rows (each a difference, not a total)."""
        rows, self._rows = self._rows, {}
        return [
            TokenUsage(
                hour=k[0],
                key=_name(k[1]),
                team=_name(k[2]),
                model=_name(k[3]),
                requests=f[0],
                prompt_tokens=f[1],
                completion_tokens=f[2],
            )
            for k, f in sorted(rows.items())
        ]


def _name(text: str) -> str:
    if len(text) <= NAME_MAX and text.isprintable():
        return text
    shown = text.encode("unicode_escape").decode("ascii")
    return shown[:NAME_MAX] or "?"


class TokenLedger:
    """This router process's running totals, and which of them the controller has."""

    def __init__(self, *, clock: Clock, max_rows: int = 100_000) -> None:
        self._clock = clock
        self.max_rows = max_rows
        self._totals: dict[RowKey, tuple[int, int, int]] = {}
        self._dirty: set[RowKey] = set()
        # Sent as UsageReport.counter_id (with the router_id before it): these totals
        # started at zero in this process.
        self.incarnation = os.urandom(6).hex()
        # Rows dropped for want of room while the controller was away.
        self.dropped = 0

    def add(self, deltas: Iterable[TokenUsage]) -> None:
        """Fold counts handed over by `TokenCounts.drain` into the totals."""
        for d in deltas:
            k = (d.hour, d.key, d.team, d.model)
            r, p, c = self._totals.get(k, (0, 0, 0))
            self._totals[k] = (
                min(MAX_COUNT, r + d.requests),
                min(MAX_COUNT, p + d.prompt_tokens),
                min(MAX_COUNT, c + d.completion_tokens),
            )
            self._dirty.add(k)
        if len(self._totals) > self.max_rows:
            self._drop_oldest()

    def pending(self) -> list[TokenUsage]:
        """The dirty rows, oldest hour first, at most ROWS_PER_REPORT: what to send."""
        return [
            TokenUsage(
                hour=k[0],
                key=k[1],
                team=k[2],
                model=k[3],
                requests=t[0],
                prompt_tokens=t[1],
                completion_tokens=t[2],
            )
            for k in sorted(self._dirty)[:ROWS_PER_REPORT]
            for t in (self._totals[k],)
        ]

    def acked(self, sent: Iterable[TokenUsage]) -> None:
        """A report holding `sent` was answered 2xx: those figures are the controller's.

        A row counted again since it was sent stays dirty (its newer total is not
        there yet). Clean rows of hours that are over are forgotten.
        """
        for s in sent:
            k = (s.hour, s.key, s.team, s.model)
            if self._totals.get(k) == (s.requests, s.prompt_tokens, s.completion_tokens):
                self._dirty.discard(k)
        hour = int(self._clock.wall() // HOUR_S) * HOUR_S
        for k in [k for k in self._totals if k[0] < hour and k not in self._dirty]:
            del self._totals[k]

    def _drop_oldest(self) -> None:
        excess = len(self._totals) - self.max_rows
        oldest = sorted(self._totals)[:excess]
        for k in oldest:
            del self._totals[k]
            self._dirty.discard(k)
        self.dropped += len(oldest)
        log.warning(
            kv(
                "token usage dropped",
                rows=len(oldest),
                reason="the controller has not taken the router's usage for long",
                max_rows=self.max_rows,
            )
        )

    def __len__(self) -> int:
        return len(self._totals)
