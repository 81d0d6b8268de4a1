"""Two controllers on one PostgreSQL database: what a standby serves while the other leads.

Routers follow either controller (docs/operations.md#two-controllers-on-postgresql), so
the standby's endpoint list must follow what the leader writes, keys included.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration import pg
from tests.integration.controller_harness import Controller, Db, controller, wait_for

pg_schema = pg.pg_schema

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]


def _listed_keys(c: Controller, after: int | None = None) -> tuple[int, list[str]]:
    """The endpoint list's version and key names, as a router long-polling `c` gets them."""
    q = "?timeout_s=0" + ("" if after is None else f"&after={after}")
    got: dict[str, Any] = c.get("/v1/endpoints" + q)
    return int(got["version"]), [k["name"] for k in got["keys"]]


class TestStandbyList:
    """The standby's endpoint list follows the leader's writes."""

    def test_keys_created_and_revoked_on_the_leader_reach_the_standby_s_list(
        self, pg_schema: pg.PgSchema
    ) -> None:
        """A key created, then revoked, on the leader is listed, then unlisted, by the standby."""
        db = Db(pg_schema.url, pg_schema.schema)
        with controller(db) as a, controller(db) as b:
            wait_for(a.leader, what="a leads")
            assert not b.leader()
            version, names = _listed_keys(b)
            assert names == []
            a.post("/admin/keys", {"name": "alice", "team": "research"})
            # A router long-polling the standby is woken with the key in its list.
            version, names = wait_for(
                lambda: (got := _listed_keys(b, version))[1] == ["alice"] and got,
                timeout_s=10,
                what="the standby lists the new key",
            )
            a.call("DELETE", "/admin/keys/alice")
            wait_for(
                lambda: _listed_keys(b, version)[1] == [],
                timeout_s=10,
                what="the standby unlists the revoked key",
            )
