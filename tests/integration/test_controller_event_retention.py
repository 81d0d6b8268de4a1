"""The event log's retention in a real controller: what is kept, and what a lookup of
an event that aged out answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import pg
from tests.integration.controller_harness import Db, controller, run_ctl, wait_for

pg_schema = pg.pg_schema


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Db:
    if request.param == "sqlite":
        return Db(f"sqlite:///{tmp_path / 'controller.db'}")
    schema: pg.PgSchema = request.getfixturevalue("pg_schema")
    return Db(schema.url, schema.schema)


class TestEventRetention:
    """The leader keeps the newest events it is told to, and says so of the others."""

    def test_a_pruned_event_is_a_clear_404(self, db: Db) -> None:
        """Three leaderships, the newest event kept: the first two events are gone from
        `GET /admin/events`, and asking for one by id is a 404 that says it aged out,
        unlike an id never written; `ctl events` goes on working."""
        earlier: list[int] = []
        for _ in range(2):
            with controller(db, "--event-retention-rows", "0") as c:
                wait_for(lambda c=c: c.leader(), what="leading")
                earlier += [e["id"] for e in c.get("/admin/events")]
        with controller(db, "--event-retention-rows", "1") as c:
            wait_for(lambda: len(c.get("/admin/events")) == 1, what="the log pruned to one")
            (newest,) = c.get("/admin/events")
            assert newest["kind"] == "controller.leader"
            first = min(earlier)
            assert newest["id"] > max(earlier)

            gone = c.error("GET", f"/admin/events?id={first}")
            assert gone.status == 404
            message = gone.body["error"]["message"]
            assert f"event {first} is no longer kept" in message
            assert "--event-retention-rows 1" in message
            assert gone.body["error"]["param"] == "id"

            never = c.error("GET", f"/admin/events?id={newest['id'] + 1000}")
            assert never.status == 404
            assert never.body["error"]["message"] == f"no event {newest['id'] + 1000}"

            assert c.get(f"/admin/events?id={newest['id']}") == [newest]
            code, out, err = run_ctl(c, "events", "--detail", str(first))
            assert code == 1
            assert f"event {first} is no longer kept" in err
            code, out, err = run_ctl(c, "events")
            assert code == 0, err
            assert "controller.leader" in out
