"""`ctl bench` against a real controller whose replica is a real sim-engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing import Program, start_program
from tests.integration.test_ctl_controller import (
    SimAgents,
    SimNode,
    ctl,
    json_list,
    start_controller,
    wait_for,
)


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[Program]]:
    """Two sim-engines serving model m; the second twice as fast."""
    progs: list[Program] = []
    try:
        # Slow enough that the engine, not the benchmarking client, is the bottleneck.
        for speed in ("2", "4"):
            args = ["sim-engine", "--port", "0", "--model", "m", "--speed", speed]
            progs.append(start_program([*args, "--max-num-seqs", "4"], log_dir=tmp_path))
        yield progs
    finally:
        for p in progs:
            p.stop()


@pytest.fixture
def bench_fleet(tmp_path: Path, engines: list[Program]) -> Iterator[tuple[Program, list[str]]]:
    """A controller with two ready replicas of m, each reported on one sim-engine's port."""
    with start_controller(tmp_path) as controller:
        ports = iter(e.port for e in engines)
        agents = SimAgents(
            controller.url,
            [SimNode("gpu-01", gpus=1), SimNode("gpu-02", gpus=1)],
            port_for=lambda _rid, _rank: next(ports),
        )
        agents.beat()
        spec = tmp_path / "m.yaml"
        spec.write_text(
            "{name: m, engine: sim, gpu_classes: [H100-80G], min_replicas: 2, max_replicas: 2}"
        )
        assert ctl(controller.url, "apply", "-f", str(spec)).code == 0

        def both_ready() -> bool:
            return sum(r["state"] == "ready" for r in json_list(controller.url, "replicas")) == 2

        wait_for(both_ready, step=agents.beat)
        by_port = {
            r["endpoint_url"].rsplit(":", 1)[1]: r["id"]
            for r in json_list(controller.url, "replicas")
        }
        yield controller, [by_port[str(e.port)] for e in engines]


ARGS = ("--duration-s", "0.5", "--max-concurrency", "8", "--max-tokens", "32")


@pytest.mark.slow
class TestBench:
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
