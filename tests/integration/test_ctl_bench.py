"""`ctl bench` against a real controller whose replica is a real sim-engine.

Each sim-engine requires its own key (`--api-key`), as every engine the agent starts
does; the fake agents report it, so `ctl bench` must fetch it from the controller.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.adminclient.client import AdminClient
from llmgw.testing import Program, start_program
from llmgw.testing.wait import wait_until
from tests.integration.test_controller_scopes import status as http_status
from tests.integration.test_ctl_controller import (
    TOKEN,
    SimAgents,
    SimNode,
    ctl,
    json_list,
    start_controller,
)

# One key per engine (slow, fast): distinctive, so a leak into any output is found.
KEYS = ("bench-engine-key-slow-5d1f0c", "bench-engine-key-fast-9ae47b")


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[Program]]:
    """Two sim-engines serving model m; the second twice as fast."""
    progs: list[Program] = []
    try:
        # Slow enough that the engine, not the benchmarking client, is the bottleneck.
        for speed, key in zip(("2", "4"), KEYS, strict=True):
            args = ["sim-engine", "--port", "0", "--model", "m", "--speed", speed]
            args += ["--api-key", key]
            progs.append(start_program([*args, "--max-num-seqs", "4"], log_dir=tmp_path))
        yield progs
    finally:
        for p in progs:
            p.stop()


@pytest.fixture
def bench_fleet(tmp_path: Path, engines: list[Program]) -> Iterator[tuple[Program, list[str]]]:
    """A controller with two ready replicas of m, each reported on one sim-engine's port
    with that engine's key."""
    with start_controller(tmp_path) as controller:
        engine_of: dict[str, int] = {}

        def port_for(rid: str, _rank: int) -> int:
            engine_of[rid] = len(engine_of)
            return engines[engine_of[rid]].port

        agents = SimAgents(
            controller.url,
            [SimNode("gpu-01", gpus=1), SimNode("gpu-02", gpus=1)],
            port_for=port_for,
            key_for=lambda rid, _rank: KEYS[engine_of[rid]] if rid in engine_of else "",
        )
        agents.beat()
        spec = tmp_path / "m.yaml"
        spec.write_text(
            "{name: m, engine: sim, gpu_classes: [H100-80G], min_replicas: 2, max_replicas: 2}"
        )
        assert ctl(controller.url, "apply", "-f", str(spec)).code == 0

        def both_ready() -> bool:
            agents.beat()  # the simulated agents report before each look
            return sum(r["state"] == "ready" for r in json_list(controller.url, "replicas")) == 2

        wait_until(both_ready, timeout_s=20, every_s=0.1, what="two ready replicas")
        by_port = {
            r["endpoint_url"].rsplit(":", 1)[1]: r["id"]
            for r in json_list(controller.url, "replicas")
        }
        yield controller, [by_port[str(e.port)] for e in engines]


ARGS = ("--duration-s", "0.5", "--max-concurrency", "8", "--max-tokens", "32")


@pytest.mark.slow
class TestBench:
    """ctl bench records a weight per replica and never shows the engine key."""

    def test_first_bench_records_weight_one(self, bench_fleet: tuple[Program, list[str]]) -> None:
        """The first replica benched gets weight 1.0 and its raw capacity, shown as JSON."""
        controller, (slow, _fast) = bench_fleet
        res = ctl(controller.url, "bench", slow, *ARGS, "--json")
        assert res.code == 0, res.err
        report = json.loads(res.out)
        assert report["weight"] == 1.0
        assert report["capacity_tok_s"] > 0
        assert report["levels"][0]["concurrency"] == 1
        assert all(lv["failed"] == 0 for lv in report["levels"])
        (view,) = [r for r in json_list(controller.url, "replicas") if r["id"] == slow]
        assert view["weight"] == 1.0

    def test_faster_replica_weighs_more(self, bench_fleet: tuple[Program, list[str]]) -> None:
        """A replica twice as fast as its benched peer gets a weight well above 1."""
        controller, (slow, fast) = bench_fleet
        assert ctl(controller.url, "bench", slow, *ARGS).code == 0
        (first,) = [r for r in json_list(controller.url, "replicas") if r["id"] == slow]
        assert first["capacity_tok_s"] > 0
        res = ctl(controller.url, "bench", fast, *ARGS)
        assert res.code == 0, res.err
        assert "vs mean" in res.out
        (view,) = [r for r in json_list(controller.url, "replicas") if r["id"] == fast]
        assert view["capacity_tok_s"] > 0
        assert view["weight"] > 1.2

    def test_no_record_keeps_the_weight(self, bench_fleet: tuple[Program, list[str]]) -> None:
        """--no-record measures and changes nothing."""
        controller, (slow, _fast) = bench_fleet
        res = ctl(controller.url, "bench", slow, *ARGS, "--no-record")
        assert res.code == 0, res.err
        assert "capacity" in res.out
        (view,) = [r for r in json_list(controller.url, "replicas") if r["id"] == slow]
        assert view["capacity_tok_s"] is None

    def test_the_engine_key_is_never_shown(self, bench_fleet: tuple[Program, list[str]]) -> None:
        """Bench sends the key, and no output, view, event or log of it holds the key."""
        controller, (slow, _fast) = bench_fleet
        shown = [ctl(controller.url, "bench", slow, *ARGS, "--json")]
        shown.append(ctl(controller.url, "bench", slow, *ARGS, "--no-record"))
        assert all(r.code == 0 for r in shown), [r.err for r in shown]
        shown.append(ctl(controller.url, "replicas", "--json"))
        shown.append(ctl(controller.url, "events", "--json"))
        texts = [t for r in shown for t in (r.out, r.err)]
        texts.append(controller.log_text())
        for key in KEYS:
            assert not [t for t in texts if key in t]


class TestBenchKey:
    """Only the admin token may fetch the engine key ctl bench uses."""

    @pytest.mark.slow
    def test_the_engine_key_is_the_admin_tokens_alone(
        self,
        bench_fleet: tuple[Program, list[str]],
    ) -> None:
        """POST …/engine-key answers the admin token rank 0's key; wrong token 401; GET 405."""
        controller, (slow, fast) = bench_fleet
        for rid, key in ((slow, KEYS[0]), (fast, KEYS[1])):
            got = AdminClient(controller.url, token=TOKEN).engine_key(rid)
            assert (got.replica, got.api_key) == (rid, key)
            assert key not in repr(got)
        path = f"/admin/replicas/{slow}/engine-key"
        assert http_status(controller.url, "POST", path, "not-the-token") == 401
        assert http_status(controller.url, "POST", path, None) == 401
        assert http_status(controller.url, "GET", path, TOKEN) == 405
        assert http_status(controller.url, "POST", "/admin/replicas/nope/engine-key", TOKEN) == 404
