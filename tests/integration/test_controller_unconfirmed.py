"""A write whose COMMIT reached PostgreSQL but whose answer was lost (tests/integration/pgwire.py).

The controller cannot know whether such a write is kept: it answers 503, and its memory
must become the store again before it decides anything else, or it acts on a fleet the
database does not hold (a key it cannot see, a replica placed twice on one card).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration import pg
from tests.integration.controller_harness import (
    Controller,
    Db,
    FakeAgents,
    controller,
    spec,
    wait_for,
)
from tests.integration.pgwire import PgWire

pg_schema = pg.pg_schema

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]


@pytest.fixture
def wired(pg_schema: pg.PgSchema) -> Iterator[tuple[Controller, PgWire, pg.PgSchema]]:
    """A controller whose every database connection passes through a PgWire."""
    wire = PgWire(pg_schema.url)
    try:
        with controller(Db(wire.url, pg_schema.schema)) as c:
            wait_for(c.leader, what="the controller leads")
            yield c, wire, pg_schema
    finally:
        wire.close()


def _stored(schema: pg.PgSchema, sql: str) -> list[tuple[object, ...]]:
    with schema.connect() as conn:
        return list(conn.execute(sql).fetchall())


class TestUnconfirmedWrite:
    """After a write with no answer, the controller acts on what the store holds."""

    def test_a_key_whose_commit_answer_was_lost_is_known_and_its_name_taken(
        self, wired: tuple[Controller, PgWire, pg.PgSchema]
    ) -> None:
        """The key the store kept is listed by the controller, and creating it again is 409."""
        c, wire, schema = wired
        wire.lose_commit_after(b"INSERT INTO api_keys")
        err = c.error("POST", "/admin/keys", {"name": "alice", "team": "research"})
        assert (err.status, wire.lost.is_set()) == (503, True), err.body
        assert _stored(schema, "SELECT name FROM api_keys") == [("alice",)]
        wait_for(
            lambda: [k["name"] for k in c.get("/admin/keys")] == ["alice"],
            what="the controller lists the key the store kept",
        )
        again = c.error("POST", "/admin/keys", {"name": "alice", "team": "research"})
        assert (again.status, again.body["error"]["type"]) == (409, "conflict_error")

    def test_a_placement_whose_commit_answer_was_lost_is_not_placed_again(
        self, wired: tuple[Controller, PgWire, pg.PgSchema]
    ) -> None:
        """A tick's lost placement is found in the store: one replica, no card given twice."""
        c, wire, schema = wired
        with FakeAgents(c, {"n1": 1}):
            wait_for(lambda: c.get("/admin/nodes"), what="the node registered")
            wire.lose_commit_after(b"INSERT INTO replicas")
            c.post("/admin/models", spec("m"))
            wait_for(wire.lost.is_set, what="the placement's answer lost")
            wait_for(lambda: c.replicas("m", "ready"), what="a replica of m ready")
            c.wait_ticks(5)
            stored = _stored(schema, "SELECT id FROM replicas WHERE state <> 'stopped'")
            shown = [r["id"] for r in c.replicas() if r["state"] != "stopped"]
            assert sorted(shown) == sorted(str(row[0]) for row in stored)
            assert len(shown) == 1
