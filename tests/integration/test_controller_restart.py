"""Controller restarts (SIGTERM, SIGKILL) and leader failover lose nothing and double nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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

pg_schema = pg.pg_schema


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Db:
    if request.param == "sqlite":
        return Db(f"sqlite:///{tmp_path / 'controller.db'}")
    schema: pg.PgSchema = request.getfixturevalue("pg_schema")
    return Db(schema.url, schema.schema)


def _snapshot(c: Controller) -> dict[str, Any]:
    return {
        "models": [(m["name"], m["min"], m["max"], m["desired"]) for m in c.get("/admin/models")],
        "replicas": [
            (r["id"], r["state"], r["endpoint_url"], r["weight"], r["shards"][0]["gpus"])
            for r in c.replicas()
        ],
        "nodes": [(n["name"], n["gpu_total"]) for n in c.get("/admin/nodes")],
        "endpoints": c.endpoint_ids(),
    }


class TestRestart:
    """A restarted controller loses nothing and gives nodes a grace."""

    @pytest.mark.parametrize("how", ["sigterm", "sigkill"])
    def test_restart_loses_nothing(self, db: Db, how: str) -> None:
        """Everything answered before the stop is there after it; nothing is re-placed."""
        with controller(db) as c:
            c.post(
                "/admin/models",
                [spec("m", min_replicas=2, max_replicas=3), spec("z", min_replicas=0)],
            )
            agents = FakeAgents(c, {"a": 8, "b": 8})
            with agents:
                ready = wait_for(lambda: len(c.replicas("m", "ready")) == 2, what="two ready")
                assert ready
                rid = c.replicas("m")[0]["id"]
                c.post(f"/admin/replicas/{rid}/weight", {"weight": 2.5})
                c.post("/admin/nodes/b/cordon")
                before = _snapshot(c)
                events_before = c.events()
                if how == "sigkill":
                    c.program.kill()
                else:
                    c.program.stop()
            with controller(db) as c2:
                # Before any heartbeat: the stored fleet, endpoints included (serving survives).
                assert _snapshot(c2) == before
                agents.c = c2
                with agents:
                    c2.wait_ticks(3)  # agents report the same shards meanwhile
                    assert _snapshot(c2) == before
                    assert c2.get("/admin/nodes/b")["state"] == "cordoned"
                assert c2.events()[: len(events_before)] == events_before
                assert any(
                    e.startswith("controller.leader") for e in c2.events()[len(events_before) :]
                )

    def test_nodes_get_a_grace_after_restart(self, db: Db) -> None:
        """A controller down longer than the heartbeat timeout does not fail the fleet on start."""
        with controller(db) as c:
            c.post("/admin/models", spec("m"))
            agents = FakeAgents(c, {"a": 8})
            with agents:
                rid = wait_for(lambda: c.replicas("m", "ready"), what="ready")[0]["id"]
        time.sleep(2.0)  # longer than the 1.5 s heartbeat timeout, while nobody watches
        with controller(db) as c2:
            c2.wait_ticks(3)  # still within the new leader's grace
            assert c2.get(f"/admin/replicas/{rid}")["state"] == "ready"
            agents.c = c2
            with agents:
                time.sleep(4.0)  # past timeout + grace: still heartbeating, so nothing moves
                assert c2.get(f"/admin/replicas/{rid}")["state"] == "ready"
                assert [r["id"] for r in c2.replicas("m")] == [rid]


@pytest.mark.postgres
class TestFailover:
    """A standby takes over when the leader is killed."""

    def test_standby_takes_over_when_the_leader_is_killed(self, pg_schema: pg.PgSchema) -> None:
        """Two controllers on one database: the standby serves reads, refuses writes, then leads."""
        db = Db(pg_schema.url, pg_schema.schema)
        with controller(db) as a:
            assert a.leader()
            with controller(db) as b:
                assert not b.leader()
                a.post("/admin/models", spec("m", min_replicas=2, max_replicas=2, gpus_per_node=2))
                agents = FakeAgents(a, {"n1": 8, "n2": 8})
                with agents:
                    wait_for(lambda: len(a.replicas("m", "ready")) == 2, what="two ready")
                    # The standby reads what the leader wrote (it reloads the store).
                    wait_for(lambda: len(b.replicas("m", "ready")) == 2, what="standby sees them")
                    err = b.error("POST", "/admin/models", spec("x"))
                    assert (err.status, err.body["error"]["type"]) == (503, "not_leader")
                    hb = {"node": "n1", "address": "127.0.0.1", "gpus": []}
                    assert b.error("POST", "/v1/agents/n1/heartbeat", hb).status == 503
                    before = _snapshot(a)

                    a.program.kill()
                    agents.c = b
                    wait_for(b.leader, what="the standby leads")
                    wait_for(lambda: not agents.errors or b.leader(), what="agents reach b")
                    b.wait_ticks(3)
                    after = _snapshot(b)
                    assert after["replicas"] == before["replicas"]
                    assert after["endpoints"] == before["endpoints"]
                    assert len(b.replicas()) == 2  # nothing double-placed
                    b.post("/admin/models/m/scale", {"max_replicas": 3, "min_replicas": 3})
                    wait_for(lambda: len(b.replicas("m", "ready")) == 3, what="the new leader acts")
                gpus = [tuple(g) for r in b.replicas() for s in r["shards"] for g in [s["gpus"]]]
                assert len(gpus) == 3
                used = [
                    (r["shards"][0]["node"], g)
                    for r in b.replicas()
                    for g in r["shards"][0]["gpus"]
                ]
                assert len(used) == len(set(used))  # no card given twice


def _stop(c: Controller, how: str) -> None:
    if how == "sigkill":
        c.program.kill()
    else:
        c.program.stop()


def _state(c: Controller, rid: str) -> str:
    return str(c.get(f"/admin/replicas/{rid}")["state"])


class TestRestartMidway:
    """A restart in the middle of a drain or an eviction carries on where it stopped."""

    @pytest.mark.parametrize("how", ["sigterm", "sigkill"])
    def test_node_drain_keeps_the_operator_s_grace(self, db: Db, how: str) -> None:
        """The old replica drains with the grace the drain asked for, not the default (2 s)."""
        with controller(db) as c:
            c.post("/admin/models", spec("m", gpus_per_node=8))
            a = FakeAgents(c, {"a": 8})
            b = FakeAgents(c, {"b": 8}, ready=False)
            with a:
                old = wait_for(lambda: c.replicas("m", "ready"), what="ready on a")[0]["id"]
                with b:
                    c.post("/admin/nodes/a/drain", {"grace_s": 60})
                    wait_for(lambda: c.replicas("m", "starting"), what="replacement on b")
                    _stop(c, how)
        with controller(db) as c2:
            a.c = b.c = c2
            b.ready = True
            with a, b:
                wait_for(lambda: _state(c2, old) == "draining", what="the old one drains")
                time.sleep(3.0)  # past the controller's default grace (2 s) and its settling
                assert _state(c2, old) == "draining"
                node = c2.get("/admin/nodes/a")
                assert (node["state"], node["drain_grace_s"]) == ("draining", 60)

    def test_deleted_model_s_draining_shards_keep_running(self, db: Db) -> None:
        """After a restart the agent is still told to run a deleted model's draining shard."""
        slow = ("--drain-grace-s", "60")
        with controller(db, *slow) as c:
            c.post("/admin/models", spec("m"))
            agents = FakeAgents(c, {"a": 8})
            with agents:
                rid = wait_for(lambda: c.replicas("m", "ready"), what="ready")[0]["id"]
                c.call("DELETE", "/admin/models/m")
                wait_for(lambda: _state(c, rid) == "draining", what="draining")
                c.program.kill()
        with controller(db, *slow) as c2:
            agents.c = c2
            assert [s["replica_id"] for s in agents.beat("a")] == [rid]
            assert _state(c2, rid) == "draining"
            assert c2.error("GET", "/admin/models/m").status == 404

    def test_eviction_holds_its_room_and_evicts_no_more(self, db: Db) -> None:
        """The restarted leader keeps the stored victims draining and the room for the model."""
        slow = ("--drain-grace-s", "60")

        def idle(c: Controller, ids: list[str], **inflight: int) -> None:
            now = time.time()
            report = {"router_id": "r", "sent_at": now, "inflight": inflight}
            report["last_used"] = {rid: now - 500 + 100 * i for i, rid in enumerate(ids)}
            c.post("/v1/usage", report)

        with controller(db, *slow) as c:
            c.post("/admin/models", spec("p", min_replicas=2, max_replicas=2, idle_timeout_s=1))
            agents = FakeAgents(c, {"a": 2})
            with agents:
                wait_for(lambda: len(c.replicas("p", "ready")) == 2, what="two ready")
                c.post("/admin/models/p/scale", {"min_replicas": 0})
                p1, p2 = sorted(r["id"] for r in c.replicas("p"))
                idle(c, [p1, p2])
                c.post("/admin/models", spec("new"))
                wait_for(lambda: _state(c, p1) == "draining", what="p1 evicted")
                c.program.kill()
        with controller(db, *slow) as c2:
            agents.c = c2
            with agents:
                evictions = len([e for e in c2.events() if e.startswith("model.evicting")])
                idle(c2, [p1, p2])
                c2.wait_ticks(5)  # both replicas known idle all along
                assert (_state(c2, p1), _state(c2, p2)) == ("draining", "ready")
                assert len([e for e in c2.events() if e.startswith("model.evicting")]) == evictions
                idle(c2, [p1, p2], **{p1: 0})
                new = wait_for(lambda: c2.replicas("new", "ready"), what="new lands")[0]
                p1_gpus = c2.get(f"/admin/replicas/{p1}")["shards"][0]["gpus"]
                assert (new["shards"][0]["gpus"], _state(c2, p2)) == (p1_gpus, "ready")
