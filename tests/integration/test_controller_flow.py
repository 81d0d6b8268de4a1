"""A real controller on SQLite and on PostgreSQL; agents simulated by heartbeats from the test."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import pg
from tests.integration.controller_harness import (
    Controller,
    Db,
    FakeAgents,
    controller,
    run_ctl,
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


@pytest.fixture
def c(db: Db) -> Iterator[Controller]:
    with controller(db) as ctl:
        yield ctl


def _node_of(r: dict[str, Any]) -> str:
    return str(r["shards"][0]["node"])


class TestPlacementFlow:
    """Apply places replicas, heartbeats carry them and failures restart them."""

    def test_apply_places_and_heartbeat_carries_the_shards(self, c: Controller) -> None:
        """model apply → pending replica → the node's heartbeat answer lists its shard."""
        agents = FakeAgents(c, {"a": 8}, ready=False)
        agents.beat("a")
        c.post("/admin/models", spec("m", gpus_per_node=4))
        shards = wait_for(lambda: agents.beat("a"), what="shards in the heartbeat answer")
        (shard,) = shards
        assert (shard["model"], shard["gpu_indices"], shard["engine"]) == ("m", [0, 1, 2, 3], "sim")
        again = agents.beat("a")
        assert again == shards  # idempotent: the same desired set, nothing started twice
        assert len(c.replicas("m")) == 1

    def test_ready_heartbeat_wakes_the_long_poll(self, c: Controller) -> None:
        """A long-poll held at the current version returns once the replica is ready, with it."""
        c.post("/admin/models", spec("m"))
        # With no node yet, the first tick finds m cannot be placed and says so in the
        # list's outlook (a change routers hear at once); the poll starts after that.
        first = wait_for(lambda: (e := c.get("/v1/endpoints"))["outlook"] and e, what="m's outlook")
        assert (first["endpoints"], first["models"]) == ([], ["m"])
        assert first["outlook"][0]["state"] == "cannot_place"
        got: list[dict[str, Any]] = []

        def poll() -> None:
            after = first["version"]
            while not (got and got[-1]["endpoints"]):
                got.append(c.get(f"/v1/endpoints?after={after}&timeout_s=20", timeout_s=30))
                after = got[-1]["version"]

        waiter = threading.Thread(target=poll)
        waiter.start()
        c.wait_ticks(2)
        assert not got  # nothing changed yet: the poll is held
        with FakeAgents(c, {"a": 8}):
            waiter.join(timeout=20)
        assert got
        (ep,) = got[-1]["endpoints"]
        assert ep["models"] == ["m"]
        assert ep["url"].startswith("http://127.0.0.1:")
        assert got[-1]["version"] > first["version"]

    def test_failed_engine_is_restarted_with_backoff(self, c: Controller) -> None:
        """A shard reported failed fails the replica (exit code, log), then a new one comes."""
        c.post("/admin/models", spec("m"))
        with FakeAgents(c, {"a": 8}) as agents:
            first = wait_for(lambda: c.replicas("m", "ready"), what="ready")[0]["id"]
            agents.failing.add(first)
            failed = wait_for(
                lambda: (
                    c.get(f"/admin/replicas/{first}")["state"] in ("failed", "stopped")
                    and c.get(f"/admin/replicas/{first}")
                )
            )
            assert "code 3" in failed["reason"] or "restarted" in failed["reason"]
            again = wait_for(lambda: c.replicas("m", "ready"), what="restarted replica ready")
            assert again[0]["id"] != first
            assert again[0]["restarts"] == 1
        assert any("exited with code 3: boom" in e for e in c.events(replica=first))


class TestUnreachable:
    """Replicas move only after an unreachable node's grace."""

    def test_replicas_move_only_after_the_grace(self, c: Controller) -> None:
        """A silent node goes unreachable; its replica stays until the grace, then moves."""
        c.post("/admin/models", spec("m", gpus_per_node=8))
        with FakeAgents(c, {"a": 8, "b": 8}) as agents:
            ready = wait_for(lambda: c.replicas("m", "ready"), what="ready")[0]
            lost_node = _node_of(ready)
            other = "b" if lost_node == "a" else "a"
            agents.silence(lost_node)
            silenced_at = time.monotonic()
            wait_for(
                lambda: c.get(f"/admin/nodes/{lost_node}")["state"] == "unreachable",
                what="unreachable",
            )
            # Timeout 1.5 s + grace 2 s: within the grace the replica stays put and listed.
            if time.monotonic() - silenced_at < 3.0:
                assert c.get(f"/admin/replicas/{ready['id']}")["state"] == "ready"
            moved = wait_for(
                lambda: [r for r in c.replicas("m", "ready") if _node_of(r) == other],
                what="replacement on the other node",
            )
            assert time.monotonic() - silenced_at >= 3.0
            assert moved[0]["id"] != ready["id"]
            assert c.endpoint_ids() == [moved[0]["id"]]
        events = c.events(node=lost_node)
        assert any(e.startswith(f"node.unreachable {lost_node}") for e in events)


class TestIdleEviction:
    """An idle replica is evicted for an unplaceable model."""

    def test_idle_replica_is_evicted_for_an_unplaceable_model(self, c: Controller) -> None:
        """Reported idle past its timeout, a replica drains so a model that did not fit lands."""
        # min 1 then 0: one replica that eviction may take (it never goes below min).
        c.post("/admin/models", [spec("idle", idle_timeout_s=1)])
        c.post("/admin/models/idle/scale", {"min_replicas": 0})
        with FakeAgents(c, {"a": 8}):
            idle = wait_for(lambda: c.replicas("idle", "ready"), what="ready")[0]["id"]
            # A second replica nobody reported: unknown idleness must never be chosen.
            c.post("/admin/models", spec("unknown", gpus_per_node=4, idle_timeout_s=1))
            c.post("/admin/models/unknown/scale", {"min_replicas": 0})
            unknown = wait_for(lambda: c.replicas("unknown", "ready"), what="ready")[0]["id"]
            now = time.time()
            report = {
                "router_id": "r1",
                "sent_at": now,
                "last_used": {idle: now - 60},
                "inflight": {idle: 0},
            }
            c.post("/v1/usage", report)
            assert c.get(f"/admin/replicas/{idle}")["idle_seconds"] >= 59
            c.post("/admin/models", spec("big", gpus_per_node=4))
            placed = wait_for(lambda: c.replicas("big", "ready"), what="the big model ready")
            assert placed
            assert c.get(f"/admin/replicas/{idle}")["state"] in ("draining", "stopped")
            assert c.get(f"/admin/replicas/{unknown}")["state"] == "ready"
        assert any("evicted for big" in e for e in c.events(replica=idle))


class TestNodeDrain:
    """A stalled drain says why, and force or eviction lets it finish."""

    def test_stalled_drain_says_why_and_force_resolves_it(self, c: Controller) -> None:
        """No room for a replacement: the drain waits, saying why; forced, the replica drains."""
        c.post("/admin/models", spec("m", gpus_per_node=8))
        with FakeAgents(c, {"a": 8, "b": 2}):
            rid = wait_for(lambda: c.replicas("m", "ready"), what="ready on a")[0]["id"]
            view = c.post("/admin/nodes/a/drain", {"grace_s": 1})
            assert (view["state"], view["drain_grace_s"], view["drain_force"]) == (
                "draining",
                1,
                False,
            )

            def blocked() -> list[dict[str, Any]]:
                waits = c.get("/admin/nodes/a")["drain_waiting"]
                return [w for w in waits if w["blocked"]]

            (wait,) = wait_for(blocked, what="the drain says it waits")
            assert (wait["replica"], wait["model"]) == (rid, "m")
            assert wait["reason"].startswith("no replacement fits: needs 8 free H100-80G GPUs")
            said = [e for e in c.events(node="a") if e.startswith("node.drain_waiting")]
            assert len(said) == 1
            assert said[0].startswith(
                f"node.drain_waiting a: waiting for {rid} (m): no replacement fits: needs 8 free"
            )
            c.wait_ticks(3)  # make-before-break keeps it serving meanwhile
            assert c.get(f"/admin/replicas/{rid}")["state"] == "ready"
            assert c.endpoint_ids() == [rid]

            view = c.post("/admin/nodes/a/drain", {"grace_s": 1, "force": True})
            assert view["drain_force"] is True
            wait_for(
                lambda: c.get(f"/admin/replicas/{rid}")["state"] == "stopped",
                what="forced drain ends after the 1 s grace",
            )
            kinds = [e.split()[0] for e in c.events(replica=rid)]
            assert "replica.drain_forced" in kinds
            wait_for(
                lambda: any(e.startswith("node.drained a") for e in c.events(node="a")),
                what="node drained",
            )
            assert c.get("/admin/nodes/a")["drain_waiting"] == []

    def test_evict_idle_makes_room_and_the_drain_finishes(self, c: Controller) -> None:
        """A drain blocked by capacity, told to evict idle replicas: the idle one of another
        model is evicted, the replacement lands in its room, `ctl drain` ends, events say why."""
        c.post("/admin/models", [spec("m", gpus_per_node=8), spec("x", gpus_per_node=8)])
        # min 1 then 0: x's one replica is not protected by min_replicas.
        c.post("/admin/models/x/scale", {"min_replicas": 0})
        with FakeAgents(c, {"a": 8, "b": 8}):
            old = wait_for(lambda: c.replicas("m", "ready"), what="m ready")[0]
            victim = wait_for(lambda: c.replicas("x", "ready"), what="x ready")[0]
            here, there = _node_of(old), _node_of(victim)
            assert here != there

            # A plain drain waits: nothing else has room.
            c.post(f"/admin/nodes/{here}/drain", {"grace_s": 1})
            waits = wait_for(
                lambda: [w for w in c.get(f"/admin/nodes/{here}")["drain_waiting"] if w["blocked"]],
                what="the plain drain is blocked",
            )
            assert "(drain with force to move it anyway)" in waits[0]["reason"]
            assert c.get(f"/admin/replicas/{victim['id']}")["state"] == "ready"

            now = time.time()
            c.post(
                "/v1/usage",
                {
                    "router_id": "r1",
                    "sent_at": now,
                    "last_used": {victim["id"]: now - 900},
                    "inflight": {victim["id"]: 0},
                },
            )
            code, out, err = run_ctl(
                c, "drain", here, "--evict-idle", "--grace-s", "1", "--timeout", "60"
            )
            assert code == 0, err
            assert f"node {here} drained" in out
            (new,) = c.replicas("m", "ready")
            assert _node_of(new) == there
            placed = [e for e in c.events(replica=new["id"]) if e.startswith("replica.placed")]
            assert f"replacing {old['id']} (node {here} draining)" in placed[0]
            assert c.get(f"/admin/replicas/{victim['id']}")["state"] == "stopped"
        evicted = [e for e in c.events(replica=victim["id"]) if e.startswith("replica.evicted")]
        assert len(evicted) == 1
        assert "evicted for m: " in evicted[0]
        assert f"the replacement of {old['id']} (node {here} draining)" in evicted[0]
        assert any(
            e.startswith(f"node.drain_evicting {here}: evicting idle {victim['id']}")
            for e in c.events(node=here)
        )


class TestCtlEvents:
    """ctl shows a failure on one line and its detail whole."""

    def test_a_failure_is_one_line_and_its_detail_is_whole(self, c: Controller) -> None:
        """An engine's log tail stays out of `ctl events` (one line per event) and comes
        back whole, a line each, from `ctl events --detail ID`; JSON carries it all."""
        tail = [
            "Traceback (most recent call last):",
            '  File "/opt/vllm/entrypoints/api_server.py", line 12, in <module>',
            "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ]
        c.post("/admin/models", spec("m"))
        with FakeAgents(c, {"a": 8}) as agents:
            rid = wait_for(lambda: c.replicas("m", "ready"), what="ready")[0]["id"]
            agents.log_tail = tail
            agents.failing.add(rid)

            def failure() -> dict[str, Any] | None:
                code, out, _ = run_ctl(c, "events", "--replica", rid, "--json")
                assert code == 0
                found = [e for e in json.loads(out) if e["kind"] == "replica.failed"]
                return found[0] if found else None

            event = wait_for(failure, what="the failure event")
        assert event["message"].endswith(" | ".join(line.strip() for line in tail))

        code, out, err = run_ctl(c, "events", "--replica", rid)
        assert code == 0, err
        (row,) = [ln for ln in out.splitlines() if ln.split()[:1] == [str(event["id"])]]
        assert "replica.failed" in row
        assert "exited with code 3" in row
        assert "RuntimeError" not in out  # the tail past its first line is in --detail
        assert row.endswith("…")
        # A header, then one line per event: none wraps onto a line of its own.
        assert all(ln.split()[0].isdigit() for ln in out.splitlines()[1:]), out

        code, out, err = run_ctl(c, "events", "--detail", str(event["id"]))
        assert code == 0, err
        lines = out.splitlines()
        assert f"id       {event['id']}" in lines
        assert "kind     replica.failed" in lines
        assert f"subject  replica {rid}" in lines
        assert "  Traceback (most recent call last):" in lines
        assert "  RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" in lines

        code, out, err = run_ctl(c, "events", "--detail", str(event["id"]), "--json")
        assert code == 0, err
        assert json.loads(out) == event

        code, out, err = run_ctl(c, "events", "--detail", "987654321")
        assert code == 1
        assert "no event 987654321" in err
