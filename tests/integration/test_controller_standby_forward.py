"""Two controllers on PostgreSQL, a router following each: what a router reports to the
standby reaches the leader (docs/operations.md#two-controllers-on-postgresql).

Routers take one controller URL (a name for both, or a load balancer), so some follow
the standby. The leader must still count them: one key's rpm split across every
router (docs/tenants.md#limits-and-several-routers), and a replica only they use known
to be in use, not idle. Real processes throughout: the controllers, two routers, two
sim-engines, the official `openai` client.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from llmgw.controller.store import open_store
from llmgw.testing import Program, start_program
from llmgw.testing.wait import wait_until

from . import pg
from .controller_harness import Controller, Db, FakeAgents, controller, spec, wait_for
from .router_fixtures import base_config, router, sim_args
from .test_ctl_controller import ctl
from .test_router_usage_report import metrics, series

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(120)]
# The fixture, seen by this module's tests as a global.
pg_schema = pg.pg_schema

TOKEN = "integration-token"
RPM = 60
TEAM = "limited"


@dataclass
class Fleet:
    leader: Controller
    standby: Controller
    # r1 follows the leader, r2 the standby.
    routers: dict[str, Program]
    # A key of RPM requests a minute (m1), and one without limits (m2).
    limited: str
    free: str


def _port(p: Program) -> int:
    return int(p.url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A leader and a standby on one schema; m1 and m2 on a sim-engine each (agents
    heartbeat the leader); router r1 following the leader, r2 the standby."""
    tmp = tmp_path_factory.mktemp("standby-forward")
    with pg.fresh_schema() as schema:
        db = Db(schema.url, schema.schema)
        e1 = start_program(sim_args(model="m1", speed=2000.0), log_dir=tmp)
        e2 = start_program(sim_args(model="m2", speed=2000.0), log_dir=tmp)
        try:
            with controller(db, token=TOKEN, log_dir=tmp) as a:
                wait_for(a.leader, what="the first controller leads")
                with controller(db, token=TOKEN, log_dir=tmp) as b:
                    assert not b.leader()
                    agents = FakeAgents(a, {"n1": 8})
                    # The agents hand out ports in order: m1's replica gets e1's port,
                    # then m2's e2's.
                    agents._next_port = _port(e1) - 1
                    with agents:
                        a.post("/admin/models", [spec("m1")])
                        wait_for(lambda: a.replicas("m1", "ready"), what="m1 ready")
                        agents._next_port = _port(e2) - 1
                        a.post("/admin/models", [spec("m2")])
                        wait_for(lambda: a.replicas("m2", "ready"), what="m2 ready")
                        limited = ctl(a.url, "keys", "create", "k", "--team", TEAM, "--rpm", "60")
                        assert limited.code == 0, limited.err
                        free = ctl(a.url, "keys", "create", "f", "--team", "free")
                        assert free.code == 0, free.err
                        cfgs = {
                            name: base_config(
                                controller={"url": c.url, "token": TOKEN, "poll_timeout_s": 5.0},
                                router_id=name,
                            )
                            for name, c in (("r1", a), ("r2", b))
                        }
                        with (
                            router(tmp, cfgs["r1"], name="r1") as r1,
                            router(tmp, cfgs["r2"], name="r2") as r2,
                        ):
                            yield Fleet(
                                leader=a,
                                standby=b,
                                routers={"r1": r1, "r2": r2},
                                limited=limited.out.splitlines()[-1],
                                free=free.out.splitlines()[-1],
                            )
        finally:
            e1.stop(grace_s=3)
            e2.stop(grace_s=3)


def share(r: Program) -> float:
    return series(metrics(r.url), "llmgw_router_team_rpm_share", team=TEAM)


def leader_shares(f: Fleet) -> dict[str, float]:
    """Router id → the rpm share of key k the leader leased it."""
    (k,) = [v for v in f.leader.get("/admin/keys") if v["name"] == "k"]
    return {s["router"]: s["rpm"] for s in k["shares"]}


def client(r: Program, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=r.url + "/v1", api_key=key, max_retries=0)


def ask(c: openai.OpenAI, model: str) -> bool:
    """One chat request; True if admitted, False if refused (429)."""
    try:
        c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    except openai.RateLimitError:
        return False
    return True


def hammer(f: Fleet, seconds: float) -> tuple[dict[str, int], dict[str, int], float]:
    """Three senders per router on key k for `seconds`: admitted and refused per
    router, and how long they ran."""
    ok: dict[str, int] = {}
    refused: dict[str, int] = {}
    lock, stop = threading.Lock(), threading.Event()

    def send(name: str) -> None:
        with client(f.routers[name], f.limited) as c:
            while not stop.is_set():
                got = ask(c, "m1")
                with lock:
                    tally = ok if got else refused
                    tally[name] = tally.get(name, 0) + 1
                stop.wait(0.01)

    threads = [threading.Thread(target=send, args=(n,)) for n in ("r1", "r2") * 3]
    started = time.monotonic()
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    return ok, refused, time.monotonic() - started


class TestStandbyForwardsReports:
    """Reports a standby receives reach the leader, which answers them."""

    def test_the_leader_knows_a_replica_only_the_standby_s_router_uses(self, fleet: Fleet) -> None:
        """Requests to m2 through r2 alone: the leader sees the replica used (idle seconds
        known and small), where it would otherwise look unused and could be evicted."""
        (rep,) = fleet.leader.replicas("m2", "ready")
        path = f"/admin/replicas/{rep['id']}"
        assert fleet.leader.get(path)["idle_seconds"] == -1  # nobody has used it yet
        with client(fleet.routers["r2"], fleet.free) as c:
            # Until r2 has the standby's endpoint list (503 before the first one) and the
            # new key in it (401 before).
            wait_until(
                lambda: ask(c, "m2"),
                timeout_s=30,
                what="r2 serves m2",
                ignore=(openai.AuthenticationError, openai.InternalServerError),
            )

        def used() -> Any:
            idle = fleet.leader.get(path)["idle_seconds"]
            return idle if 0 <= idle < 30 else None

        wait_until(used, timeout_s=20, what="the leader sees m2's replica in use")
        # The standby keeps its own reading too: it knows who is idle if it takes over.
        assert 0 <= fleet.standby.get(path)["idle_seconds"] < 30

    def test_the_leader_splits_a_key_across_both_routers(self, fleet: Fleet) -> None:
        """The leader leases key k's rpm to r1 and r2 together (never above the limit),
        and hammered through both routers the fleet admits at most
        rpm × (1 + T/60) + routers, where each router alone would admit that much."""

        seen: list[dict[str, float]] = [{}]

        def split() -> dict[str, float] | None:
            leased = leader_shares(fleet)
            held = {n: share(r) for n, r in fleet.routers.items()}
            seen[0] = {**{f"leader:{n}": v for n, v in leased.items()}, **held}
            both = set(leased) == {"r1", "r2"} and min(held.values()) > 0
            return seen[0] if both else None

        got = wait_until(
            split, timeout_s=60, what=lambda: f"the leader leases k to r1 and r2 (seen {seen[0]})"
        )
        assert got["leader:r1"] + got["leader:r2"] <= RPM + 1e-6, got
        assert got["r1"] + got["r2"] <= RPM + 1e-6, got
        ok, refused, took_s = hammer(fleet, 10.0)
        admitted = sum(ok.values())
        bound = RPM * (1 + took_s / 60) + 2
        assert admitted <= bound, (ok, refused, took_s)
        # The test means something: far more was asked than the bound.
        assert admitted + sum(refused.values()) >= 2 * bound, (ok, refused)
        assert sum(leader_shares(fleet).values()) <= RPM + 1e-6


def relays(c: Controller, outcome: str) -> float:
    """A controller's count of usage reports relayed with `outcome` (its /metrics)."""
    req = urllib.request.Request(c.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    return series(text, "llmgw_controller_usage_relays_total", outcome=outcome)


def post_report(c: Controller, body: dict[str, Any], **headers: str) -> tuple[int, bytes]:
    """POST /v1/usage as a router does (the admin token stands for the router's)."""
    req = urllib.request.Request(c.url + "/v1/usage", data=json.dumps(body).encode())
    req.add_header("Authorization", f"Bearer {TOKEN}")
    req.add_header("Content-Type", "application/json")
    for name, value in headers.items():
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def usage_report(router_id: str, prompt_tokens: int) -> dict[str, Any]:
    hour = int(time.time() // 3600) * 3600
    row = {
        "hour": hour,
        "key": "alice",
        "team": "research",
        "model": "m1",
        "requests": 1,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 1,
    }
    return {"router_id": router_id, "sent_at": time.time(), "tokens": [row]}


class TestRelayFallback:
    """A standby whose relay fails keeps the report and leases nothing."""

    def test_a_leader_that_does_not_answer_leaves_the_report_to_the_standby(
        self, pg_schema: pg.PgSchema
    ) -> None:
        """The recorded URL answering nothing: the standby keeps the token rows itself and
        answers 503, not shares from its own book (which would lease beyond the limit)."""
        db = Db(pg_schema.url, pg_schema.schema)
        with controller(db, token=TOKEN) as a:
            wait_for(a.leader, what="the first controller leads")
            with controller(db, token=TOKEN) as b:
                # Relayed while the leader answers: its answer, the leases, passed on.

                def relayed() -> bytes | None:
                    status, body = post_report(b, usage_report("r2", 10))
                    return body if status == 200 and relays(b, "relayed") >= 1 else None

                assert "leases" in json.loads(wait_for(relayed, what="a report relayed"))
                store = open_store(pg_schema.url, schema=pg_schema.schema)
                try:
                    # A URL nothing answers at: a leader that died, say.
                    store.set_leader_url("http://127.0.0.1:9")
                finally:
                    store.close()
                wait_for(
                    lambda: post_report(b, usage_report("r2", 20))[0] == 503,
                    what="the standby answers alone",
                )
                assert relays(b, "failed") >= 1
                rows = a.get("/admin/usage?by=team")["rows"]
                assert [(r["team"], r["prompt_tokens"]) for r in rows] == [("research", 20)]

    def test_a_relayed_report_is_never_relayed_again(self, pg_schema: pg.PgSchema) -> None:
        """A relayed report reaching a standby (a stale URL) is refused with 503, so the
        sender keeps it and no report goes round in a circle."""
        db = Db(pg_schema.url, pg_schema.schema)
        with controller(db, token=TOKEN) as a:
            wait_for(a.leader, what="the first controller leads")
            with controller(db, token=TOKEN) as b:
                status, body = post_report(
                    b, usage_report("r2", 10), **{"X-Llmgw-Relayed-By": "http://127.0.0.1:1"}
                )
                assert (status, json.loads(body)["error"]["type"]) == (503, "not_leader")
                assert relays(b, "relayed") == 0
                assert a.get("/admin/usage?by=team")["rows"] == []
