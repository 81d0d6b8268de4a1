"""`ctl status` on a 200-node, 500-model fleet: one screen, against a real controller.

Also the source of the README capture:

    .venv/bin/python -m tests.integration.test_ctl_fleet   # prints the status screen

The fleet: 200 simulated nodes (H100, A100, H200 and L40S on ten fabrics, a few
bad cards), 500 models from one GPU to four whole nodes, a few that cannot be
placed, five nodes that stop heartbeating, some cordoned and draining, and a
router report that leaves some replicas idle for hours while others are busy
and most are unknown.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import pytest

from llmgw.testing import Program, start_program, wait_until
from llmgw.wire.models import ModelSpec
from tests.integration.test_ctl_controller import TOKEN, SimAgents, SimNode, ctl, json_list

# name prefix, count, GPUs per node, class, fabrics
NODE_GROUPS = [
    ("h100", 120, 8, "H100-80G", ["ib0", "ib1", "ib2", "ib3", "ib4", "ib5"]),
    ("a100", 40, 8, "A100-80G", ["ib6", "ib7"]),
    ("h200", 24, 8, "H200-141G", ["ib8"]),
    ("l40s", 16, 4, "L40S", ["eth0"]),
]


def fleet_nodes(rng: random.Random) -> list[SimNode]:
    nodes = []
    for prefix, count, gpus, cls, fabrics in NODE_GROUPS:
        for i in range(count):
            bad = (rng.randrange(gpus),) if rng.random() < 0.06 else ()
            nodes.append(SimNode(f"{prefix}-{i:03d}", gpus, cls, fabrics[i % len(fabrics)], bad))
    return nodes


def fleet_models(rng: random.Random, count: int = 500) -> list[ModelSpec]:
    """Mostly small models, some tensor-parallel, a few multi-node; some cannot fit."""
    shapes = [(1, 1)] * 60 + [(2, 1)] * 20 + [(4, 1)] * 10 + [(8, 1)] * 6 + [(8, 2)] * 3
    classes = [["H100-80G", "H200-141G"], ["A100-80G", "H100-80G"], ["L40S"], ["H100-80G"]]
    specs = []
    for i in range(count):
        tp, nodes = rng.choice(shapes)
        gpu_classes = rng.choice(classes) if tp <= 4 else ["H100-80G", "A100-80G"]
        name = f"team{i % 17}/model-{i:03d}"
        if i % 97 == 5:  # a class the fleet does not have
            gpu_classes = ["B200-180G"]
        if i % 131 == 7:  # more whole nodes than any one fabric has free
            tp, nodes, gpu_classes = 8, 6, ["H200-141G"]
        specs.append(
            ModelSpec(
                name=name,
                engine="sim",
                gpu_classes=tuple(gpu_classes),
                gpus_per_node=tp,
                nodes=nodes,
                min_replicas=0 if i % 5 == 0 else 1,
                max_replicas=2,
            )
        )
    return specs


def beat_all(agents: list[SimAgents]) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda a: a.beat(), agents))


def build_fleet(prog: Program, *, seed: int = 11) -> None:
    """Drive a real controller into a busy 200-node, 500-model state."""
    rng = random.Random(seed)
    nodes = fleet_nodes(rng)
    # One SimAgents per node so beats run in parallel; each keeps its own shard list.
    agents = [SimAgents(prog.url, [n]) for n in nodes]
    lost = agents[-5:]  # these stop heartbeating: unreachable
    beat_all(agents)
    spec_file = Path(tempfile.mkdtemp(prefix="ctl-fleet-")) / "models.yaml"
    spec_file.write_bytes(msgspec.yaml.encode(fleet_models(rng)))
    res = ctl(prog.url, "apply", "-f", str(spec_file))
    assert res.code == 0, res.err
    for _ in range(4):
        beat_all(agents)
        time.sleep(0.3)
    for name in ("h100-003", "h100-010", "a100-004", "l40s-002"):
        assert ctl(prog.url, "cordon", name).code == 0
    for name in ("h100-020", "a100-011"):
        assert ctl(prog.url, "drain", name, "--no-wait").code == 0
    ready = [r for r in json_list(prog.url, "replicas") if r["state"] == "ready"]
    now = time.time()
    rng.shuffle(ready)
    # Some replicas idle for a long while, some just used; the rest never reported.
    last_used = {r["id"]: now - rng.uniform(700, 300_000) for r in ready[:40]}
    last_used |= {r["id"]: now - rng.uniform(0, 60) for r in ready[40:200]}
    agents[0].report_idle(last_used)
    live = [a for a in agents if a not in lost]

    def lost_unreachable() -> bool:
        # The others keep beating while the lost ones pass --heartbeat-timeout-s.
        beat_all(live)
        summary = ctl(prog.url, "status", "--json").json()
        return isinstance(summary, dict) and summary["nodes"]["unreachable"] == len(lost)

    wait_until(lost_unreachable, timeout_s=30, every_s=0.5, what="the silent nodes unreachable")


def start_fleet_controller(log_dir: Path) -> Program:
    args = [
        "controller",
        "--port", "0",
        "--database", f"sqlite:///{log_dir}/c.db",
        "--token", TOKEN,
        "--heartbeat-timeout-s", "5",
    ]  # fmt: skip
    return start_program(args, log_dir=log_dir)


@pytest.mark.slow
class TestFleetStatus:
    """ctl status fits one screen on a large fleet."""

    def test_status_fits_one_screen_at_200_nodes(self, tmp_path: Path) -> None:
        """ctl status on 200 nodes and 500 models is one screen that lists what needs attention."""
        with start_fleet_controller(tmp_path) as prog:
            build_fleet(prog)
            summary = ctl(prog.url, "status", "--json").json()
            screen = ctl(prog.url, "status").out
        assert isinstance(summary, dict)
        assert summary["nodes"]["total"] == 200
        assert summary["models"]["total"] == 500
        assert summary["nodes"]["unreachable"] == 5
        assert summary["unplaceable"]
        assert len(screen.splitlines()) <= 52
        assert "unreachable" in screen
        assert "more" in screen


if __name__ == "__main__":
    # The README capture: a real controller, simulated agents, plain text at 100 columns.
    import io

    from llmgw.ctl import main as ctl_main
    from llmgw.ctl.context import Ctx

    with start_fleet_controller(Path(tempfile.mkdtemp(prefix="ctl-fleet-"))) as prog:
        build_fleet(prog)
        out = io.StringIO()
        env = {"LLMGW_CONTROLLER": prog.url, "LLMGW_TOKEN": TOKEN}
        base = Ctx(out=out, err=sys.stderr, width=100)
        code = ctl_main.main(["status"], env=env, home=Path("/nonexistent"), base=base)
    sys.stdout.write(out.getvalue())
    raise SystemExit(code)
