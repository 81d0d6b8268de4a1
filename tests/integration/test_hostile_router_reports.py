"""What a buggy, old or compromised router sends the controller (`POST /v1/usage`), against
a real controller process: each bad report is a 4xx naming the field, and none of them
stops the reconcile loop, makes a key's budget count an hour twice, or wedges the store.

One controller (SQLite in the test's folder, or a fresh PostgreSQL schema) on 127.0.0.1.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.controller_harness import Controller, Db, controller, spec
from tests.integration.hostile import log_lines

pytestmark = pytest.mark.timeout(120)

TOKEN = "hostile-reports-token"


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Controller]:
    with controller(Db(f"sqlite:///{tmp_path}/c.db"), token=TOKEN, log_dir=tmp_path) as ctl:
        ctl.post("/admin/models", [spec("m1")])
        yield ctl


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
