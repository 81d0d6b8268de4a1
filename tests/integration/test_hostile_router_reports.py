"""What a buggy, old or compromised router sends the controller (`POST /v1/usage`), against
a real controller process: each bad report is a 4xx naming the field, and none of them
stops the reconcile loop, makes a key's budget count an hour twice, or wedges the store.

One controller (SQLite in the test's folder, or a fresh PostgreSQL schema) on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration import pg
from tests.integration.controller_harness import Controller, Db, controller, spec
from tests.integration.hostile import log_lines

pytestmark = pytest.mark.timeout(120)

TOKEN = "hostile-reports-token"
HOUR = int(time.time() // 3600) * 3600
MAX_COUNT = 2**53


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Controller]:
    with controller(Db(f"sqlite:///{tmp_path}/c.db"), token=TOKEN, log_dir=tmp_path) as ctl:
        ctl.post("/admin/models", [spec("m1")])
        yield ctl


@dataclass(frozen=True)
class Budgeted:
    c: Controller
    # The budgeted key's SHA-256, as routers name it in their demand.
    sha256: str


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_c(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Budgeted]:
    """A controller on each store, with a key of a 1000-token daily budget (`bk`)."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            db = Db(f"sqlite:///{tmp_path}/c.db")
        else:
            schema = stack.enter_context(pg.fresh_schema())
            db = Db(schema.url, schema.schema)
        ctl = stack.enter_context(controller(db, token=TOKEN, log_dir=tmp_path))
        made = ctl.post(
            "/admin/keys", {"name": "bk", "team": "t", "budget": {"tokens": 1000, "per": "day"}}
        )
        yield Budgeted(ctl, hashlib.sha256(made["key"].encode()).hexdigest())


def row(key: str, model: str, prompt: int, *, hour: int = HOUR) -> dict[str, Any]:
    return {"hour": hour, "key": key, "team": "t", "model": model, "requests": 1,
            "prompt_tokens": prompt, "completion_tokens": 0}  # fmt: skip


def budget_left(b: Budgeted, router_id: str = "r9") -> float:
    """What the controller answers a plain report of `router_id` as left of bk's budget."""
    got = b.c.post("/v1/usage", {"router_id": router_id, "sent_at": time.time(),
                                 "key_demand": [{"sha256": b.sha256}]})  # fmt: skip
    (lease,) = got["leases"]
    return float(lease["budget_left"])


def usage(c: Controller, **fields: Any) -> Any:
    """POST /v1/usage as router `r1`, with `fields` on top of a minimal report."""
    return c.post("/v1/usage", {"router_id": "r1", "sent_at": time.time(), **fields})


class TestLoadCounts:
    """A report's load counts are bounded where the autoscaler can still do sums with them."""

    @pytest.mark.parametrize("field", ["inflight", "held", "requests"])
    @pytest.mark.parametrize("huge", [10**400, 10**308], ids=["1e400", "1e308"])
    def test_a_count_past_2_53_is_refused_and_the_tick_goes_on(
        self, c: Controller, field: str, huge: int
    ) -> None:
        """A count past 2**53 is a 422 naming it: not a 500 when it is too large for a
        float, nor, from two routers that each fit one, a tick crashing on their sum."""
        for router in ("r1", "r2"):
            body = {"router_id": router, "sent_at": time.time(), "load": {"m1": {field: huge}}}
            err = c.error("POST", "/v1/usage", body)
            assert (422, f"load.m1.{field}") == (err.status, err.body["error"]["param"])
        c.wait_ticks(3)
        assert log_lines(c.program.log_text(), "tick crashed") == []
        assert log_lines(c.program.log_text(), "Traceback") == []


class TestUsageSums:
    """Sums of token usage over rows saturate instead of failing the store's read."""

    def test_rows_summing_past_2_63_leave_reports_and_reads_working(
        self, store_c: Budgeted
    ) -> None:
        """One report whose rows sum past a 64-bit integer is kept; every later report
        and `/admin/usage` still answer 200, its sum shown as 2**53 (the counts' bound)."""
        c = store_c.c
        rows = [row("ov", f"m{i}", MAX_COUNT) for i in range(1100)]
        c.post("/v1/usage", {"router_id": "r1", "sent_at": time.time(), "tokens": rows})
        assert budget_left(store_c) == 1000.0
        for by in ("key", "team", "model"):
            got = c.get(f"/admin/usage?by={by}")["rows"]
            assert all(r["prompt_tokens"] <= MAX_COUNT for r in got), by
        (ov,) = [r for r in c.get("/admin/usage?by=key")["rows"] if r["key"] == "ov"]
        assert (ov["requests"], ov["prompt_tokens"]) == (1100, MAX_COUNT)


class TestBudgetHours:
    """A key's budget counts the hours of its period, whatever hours a router reports."""

    @pytest.mark.parametrize("days_ahead", [1, 400])
    def test_a_row_of_a_later_period_is_not_spent_now(
        self, store_c: Budgeted, days_ahead: int
    ) -> None:
        """A router whose clock runs days ahead reports hours of a later period: they
        count there (once), not in today's budget too."""
        ahead = HOUR + days_ahead * 86_400
        store_c.c.post(
            "/v1/usage",
            {
                "router_id": "r1",
                "sent_at": time.time(),
                "tokens": [row("bk", "m", 600, hour=ahead)],
            },
        )
        assert budget_left(store_c) == 1000.0

    def test_a_row_of_this_period_is_spent(self, store_c: Budgeted) -> None:
        """The same row in the current hour is spent from today's budget."""
        store_c.c.post(
            "/v1/usage",
            {"router_id": "r1", "sent_at": time.time(), "tokens": [row("bk", "m", 600)]},
        )
        assert budget_left(store_c) == 400.0


class TestRouterId:
    """A report's router_id is a name the store can keep and a table can show."""

    @pytest.mark.parametrize(
        "router_id",
        ["r\u0000x", "\u001b[31mred", "r" * 257, "r1\n"],
        ids=["nul", "esc", "long", "line-end"],
    )
    def test_a_router_id_no_store_or_table_takes_is_refused(
        self, store_c: Budgeted, router_id: str
    ) -> None:
        """A control character or a name past 256 is a 422 naming router_id, never a 503
        the router would retry forever, and nothing of the report is kept."""
        body = {"router_id": router_id, "sent_at": time.time(), "tokens": [row("bk", "m", 5)],
                "key_demand": [{"sha256": store_c.sha256}]}  # fmt: skip
        err = store_c.c.error("POST", "/v1/usage", body)
        assert (err.status, err.body["error"]["param"]) == (422, "router_id")
        assert store_c.c.get("/admin/usage")["rows"] == []
        assert [k["shares"] for k in store_c.c.get("/admin/keys")] == [[]]
