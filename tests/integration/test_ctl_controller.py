"""Every ctl command against a real `llmgw controller` process, fed by simulated agents.

The agents are simulated here (heartbeats over HTTP, every desired shard reported
ready on a given port), so a test controls the fleet exactly; the controller and
its store are real. ctl runs in-process through `main()` with its real urllib
transport, except where the exit code and stderr of the real command line are
the point.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw.ctl import main as ctl_main
from llmgw.ctl.context import Ctx
from llmgw.testing import Program, free_port, start_program
from llmgw.testing.wait import wait_until
from llmgw.wire.agent import GPU, Heartbeat, HeartbeatReply, ShardStatus
from llmgw.wire.usage import UsageReport

TOKEN = "integration-token"


@dataclass
class SimNode:
    name: str
    gpus: int = 8
    gpu_class: str = "H100-80G"
    fabric: str = "ib0"
    unhealthy: tuple[int, ...] = ()
    # Shards the controller asked for, reported back as ready on the next beat.
    shards: list[ShardStatus] = field(default_factory=list)


class SimAgents:
    """Heartbeats for many nodes; every shard the controller wants is reported ready.

    `port_for(replica_id, rank)` picks the port a ready shard is reported on, so a
    test can point a replica at a real sim-engine.
    """

    def __init__(
        self,
        url: str,
        nodes: list[SimNode],
        *,
        token: str = TOKEN,
        port_for: Callable[[str, int], int] | None = None,
        key_for: Callable[[str, int], str] | None = None,
    ) -> None:
        self.url = url
        self.nodes = nodes
        self.token = token
        self._ports: dict[tuple[str, int], int] = {}
        self._port_for = port_for or self._next_port
        # The engine key a ready shard is reported with (as a real agent's are); "" none.
        self._key_for = key_for or (lambda _rid, _rank: "")

    def _next_port(self, replica_id: str, rank: int) -> int:
        return 21000 + len(self._ports)

    def _port(self, replica_id: str, rank: int) -> int:
        key = (replica_id, rank)
        if key not in self._ports:
            self._ports[key] = self._port_for(replica_id, rank)
        return self._ports[key]

    def _post(self, path: str, body: object) -> bytes:
        req = urllib.request.Request(
            self.url + path,
            data=msgspec.json.encode(body),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            data: bytes = resp.read()
            return data

    def beat(self) -> None:
        for node in self.nodes:
            gpus = tuple(
                GPU(
                    index=i,
                    uuid=f"GPU-{node.name}-{i}",
                    name="NVIDIA H100 80GB HBM3",
                    gpu_class=node.gpu_class,
                    memory_mib=81559,
                    healthy=i not in node.unhealthy,
                    reason="xid 79" if i in node.unhealthy else None,
                )
                for i in range(node.gpus)
            )
            hb = Heartbeat(
                node=node.name,
                address="127.0.0.1",
                gpus=gpus,
                fabrics=(node.fabric,),
                shards=tuple(node.shards),
                agent_started_at=1.0,
            )
            reply = msgspec.json.decode(
                self._post(f"/v1/agents/{node.name}/heartbeat", hb), type=HeartbeatReply
            )
            node.shards = [
                ShardStatus(
                    replica_id=s.replica_id,
                    rank=s.rank,
                    state="ready",
                    port=self._port(s.replica_id, s.rank),
                    pid=12345,
                    started_at=1.0,
                    api_key=self._key_for(s.replica_id, s.rank),
                )
                for s in reply.shards
            ]

    def report_idle(self, last_used: dict[str, float]) -> None:
        """A router's usage report: these replicas were last used at these unix times."""
        report = UsageReport(router_id="r-test", sent_at=time.time(), last_used=last_used)
        self._post("/v1/usage", report)


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> object:
        return json.loads(self.out)


def ctl(url: str, *argv: str, token: str = TOKEN, tmp: Path | None = None) -> Result:
    """Run one ctl command in-process against `url` with the real transport."""
    out, err = io.StringIO(), io.StringIO()
    env = {"LLMGW_CONTROLLER": url, "LLMGW_TOKEN": token}
    code = ctl_main.main(
        list(argv), env=env, home=tmp or Path("/nonexistent"), base=Ctx(out=out, err=err, width=160)
    )
    return Result(code, out.getvalue(), err.getvalue())


def json_list(url: str, command: str, *argv: str) -> list[dict[str, Any]]:
    """`ctl <command> --json` as a list of objects."""
    data = ctl(url, command, "--json", *argv).json()
    assert isinstance(data, list)
    return data


def ctl_process(url: str, *argv: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    """The real command line, for exit codes and stderr exactly as a shell sees them."""
    env = {"PATH": "/usr/bin:/bin", "LLMGW_CONTROLLER": url, "LLMGW_TOKEN": token}
    env["XDG_CONFIG_HOME"] = "/nonexistent"
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def start_controller(tmp_path: Path) -> Program:
    database = f"sqlite:///{tmp_path}/c.db"
    args = ["controller", "--port", "0", "--database", database, "--token", TOKEN]
    return start_program(args, log_dir=tmp_path)


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Program]:
    prog = start_controller(tmp_path)
    try:
        yield prog
    finally:
        prog.stop()


SPECS = """\
name: small
engine: sim
gpu_classes: [H100-80G]
min_replicas: 1
max_replicas: 2
---
- name: org/tp4
  engine: sim
  gpu_classes: [H100-80G]
  gpus_per_node: 4
  min_replicas: 1
  max_replicas: 1
- name: huge
  engine: sim
  gpu_classes: [H100-80G]
  gpus_per_node: 8
  nodes: 4
  min_replicas: 1
  max_replicas: 1
"""


@pytest.fixture
def fleet(controller: Program, tmp_path: Path) -> SimAgents:
    """Two H100 nodes on one fabric (one card unhealthy) and three models applied."""
    agents = SimAgents(
        controller.url,
        [SimNode("gpu-01", unhealthy=(7,)), SimNode("gpu-02")],
    )
    agents.beat()
    spec = tmp_path / "models.yaml"
    spec.write_text(SPECS)
    applied = ctl(controller.url, "apply", "-f", str(spec))
    assert applied.code == 0, applied.err

    def placed() -> bool:
        agents.beat()  # the simulated agents report before each look
        reps = ctl(controller.url, "replicas", "--json").json()
        assert isinstance(reps, list)
        return sum(r["state"] == "ready" for r in reps) >= 2

    wait_until(placed, timeout_s=20, every_s=0.1, what="two ready replicas")
    return agents


class TestReadCommands:
    """ctl's read commands against a real controller."""

    def test_status_json_counts_the_fleet(self, controller: Program, fleet: SimAgents) -> None:
        """status --json has the documented names; the unhealthy card is neither used nor free."""
        data = ctl(controller.url, "status", "--json").json()
        assert isinstance(data, dict)
        assert data["nodes"]["total"] == 2
        (h100,) = data["gpus"]
        assert h100["class"] == "H100-80G"
        assert (h100["total"], h100["used"], h100["unhealthy"]) == (16, 5, 1)
        assert [(f["fabric"], f["nodes"]) for f in data["fabrics"]] == [("ib0", 2)]
        assert data["unplaceable"] == ["huge"]

    def test_status_screen(self, controller: Program, fleet: SimAgents) -> None:
        """status names the unplaceable model with the controller's reason."""
        res = ctl(controller.url, "status")
        assert res.code == 0, res.err
        line = next(ln for ln in res.out.splitlines() if ln.strip().startswith("huge"))
        assert "needs" in line or "node" in line

    def test_replicas_json_idle_unknown_then_known(
        self, controller: Program, fleet: SimAgents
    ) -> None:
        """Idle is -1 (and '-') until a router reports the replica, then seconds."""
        reps = ctl(controller.url, "replicas", "--json", "--model", "small").json()
        assert isinstance(reps, list)
        (rep,) = [r for r in reps if r["state"] == "ready"]
        assert rep["idle_seconds"] == -1
        assert rep["endpoint_url"].startswith("http://127.0.0.1:")
        assert {"id", "model", "state", "endpoint_url", "idle_seconds"} <= set(rep)
        table = ctl(controller.url, "replicas", "--model", "small").out
        assert next(ln for ln in table.splitlines() if rep["id"] in ln).split()[5] == "-"
        fleet.report_idle({rep["id"]: time.time() - 700})
        table = ctl(controller.url, "replicas", "--model", "small").out
        assert next(ln for ln in table.splitlines() if rep["id"] in ln).split()[5] == "11m"

    def test_nodes_and_models_tables(self, controller: Program, fleet: SimAgents) -> None:
        """nodes and models print a row each, models with its status."""
        nodes = ctl(controller.url, "nodes")
        assert nodes.code == 0
        assert "gpu-01" in nodes.out
        assert "gpu-02" in nodes.out
        models = ctl(controller.url, "models").out
        assert "unplaceable" in next(ln for ln in models.splitlines() if ln.startswith("huge"))
        data = ctl(controller.url, "models", "--json").json()
        assert isinstance(data, list)
        assert [m["name"] for m in data] == ["huge", "org/tp4", "small"]

    def test_events_filtered_by_node(self, controller: Program, fleet: SimAgents) -> None:
        """events --node lists that node's events, as JSON and as a table."""
        assert ctl(controller.url, "cordon", "gpu-02").code == 0
        data = ctl(controller.url, "events", "--node", "gpu-02", "--json").json()
        assert isinstance(data, list)
        assert data
        assert all(e["subject_id"] == "gpu-02" or "gpu-02" in e["message"] for e in data)
        assert ctl(controller.url, "events", "--limit", "3").code == 0


class TestWriteCommands:
    """ctl's write commands against a real controller."""

    def test_cordon_and_uncordon(self, controller: Program, fleet: SimAgents) -> None:
        """cordon and uncordon change the node's state."""
        assert ctl(controller.url, "cordon", "gpu-02").out.startswith("node gpu-02 cordoned")
        nodes = ctl(controller.url, "nodes", "--json").json()
        assert isinstance(nodes, list)
        assert {n["name"]: n["state"] for n in nodes}["gpu-02"] == "cordoned"
        assert ctl(controller.url, "uncordon", "gpu-02").code == 0
        nodes = ctl(controller.url, "nodes", "--json").json()
        assert isinstance(nodes, list)
        assert {n["name"]: n["state"] for n in nodes}["gpu-02"] == "ready"

    def test_scale_and_delete(self, controller: Program, fleet: SimAgents) -> None:
        """scale changes the bounds of a model with a slash in its name; delete removes one."""
        res = ctl(controller.url, "scale", "org/tp4", "--max", "3")
        assert res.code == 0, res.err
        model = next(
            m for m in ctl(controller.url, "models", "--json").json() if m["name"] == "org/tp4"
        )  # type: ignore[union-attr]
        assert (model["min"], model["max"]) == (1, 3)
        assert ctl(controller.url, "delete", "huge").code == 0
        names = [m["name"] for m in json_list(controller.url, "models")]
        assert "huge" not in names

    def test_drain_times_out_while_replicas_stay(
        self, controller: Program, fleet: SimAgents
    ) -> None:
        """A drain that cannot finish within --timeout exits 1 naming what is left."""
        reps = ctl(controller.url, "replicas", "--json").json()
        assert isinstance(reps, list)
        busy = next(s["node"] for r in reps if r["state"] == "ready" for s in r["shards"])
        res = ctl(controller.url, "drain", busy, "--timeout", "0.5")
        assert res.code == 1
        assert f"node {busy} still holds" in res.err

    def test_drain_blocked_by_capacity_says_why_and_times_out(
        self, controller: Program, fleet: SimAgents
    ) -> None:
        """No room elsewhere: lines say `blocked`, status and nodes show it, exit 1 names it."""
        reps = ctl(controller.url, "replicas", "--json").json()
        assert isinstance(reps, list)
        busy = next(s["node"] for r in reps if r["state"] == "ready" for s in r["shards"])
        other = "gpu-02" if busy == "gpu-01" else "gpu-01"
        assert ctl(controller.url, "cordon", other).code == 0
        res = ctl(controller.url, "drain", busy, "--timeout", "3")
        assert res.code == 1
        assert f"node {busy} still holds" in res.err
        # The timeout names the blocked replica and why, on one line.
        assert res.err.count("\n") == 1, res.err
        assert re.search(r"; r-\w+ \([\w/]+\): \S", res.err), res.err
        assert re.search(r"^r-\w+ \([\w/]+\): blocked: ", res.out, re.MULTILINE), res.out
        status = ctl(controller.url, "status")
        assert "Draining (1 nodes)" in status.out, status.out
        assert "blocked" in status.out
        nodes = ctl(controller.url, "nodes")
        assert "WAITING FOR" in nodes.out
        row = next(ln for ln in nodes.out.splitlines() if ln.startswith(busy))
        assert "blocked: " in row

    def test_drain_waits_until_empty(self, controller: Program, fleet: SimAgents) -> None:
        """A drain finishes once the replicas moved off the node (agents keep beating)."""
        reps = ctl(controller.url, "replicas", "--json").json()
        assert isinstance(reps, list)
        busy = next(s["node"] for r in reps if r["state"] == "ready" for s in r["shards"])
        import threading

        stop = threading.Event()

        def keep_beating() -> None:
            while not stop.is_set():
                fleet.beat()
                time.sleep(0.2)

        beater = threading.Thread(target=keep_beating)
        beater.start()
        try:
            res = ctl(controller.url, "drain", busy, "--timeout", "30", "--grace-s", "0")
        finally:
            stop.set()
            beater.join()
        assert res.code == 0, res.err
        assert f"node {busy} drained" in res.out


class TestBadInput:
    """ctl's refusals against a real controller."""

    def test_wrong_token(self, controller: Program) -> None:
        """A wrong token exits 1 with one line on stderr, no traceback."""
        proc = ctl_process(controller.url, "status", token="wrong")
        assert proc.returncode == 1
        assert proc.stderr.count("\n") == 1
        assert "rejected the token (401)" in proc.stderr

    def test_unreachable(self) -> None:
        """No controller at the URL exits 1 with one line on stderr."""
        proc = ctl_process(f"http://127.0.0.1:{free_port()}", "nodes")
        assert proc.returncode == 1
        assert proc.stderr.startswith("llmgw ctl: cannot reach the controller")
        assert proc.stderr.count("\n") == 1

    @pytest.mark.parametrize(
        "argv",
        [
            ["cordon", "gpu-99"],
            ["uncordon", "gpu-99"],
            ["drain", "gpu-99"],
            ["delete", "no-such-model"],
            ["scale", "no-such-model", "--min", "1"],
            ["bench", "no-such-replica"],
        ],
    )
    def test_unknown_subject(self, controller: Program, argv: list[str]) -> None:
        """An unknown node, model or replica exits 1 with one line."""
        res = ctl(controller.url, *argv)
        assert res.code == 1
        assert res.err.count("\n") == 1

    def test_invalid_spec_file_applies_nothing(self, controller: Program, tmp_path: Path) -> None:
        """An invalid spec names file, model and field, and nothing is applied."""
        f = tmp_path / "bad.yaml"
        f.write_text(
            "- {name: ok, engine: sim, gpu_classes: [H100-80G]}\n"
            "- {name: bad, engine: sim, gpu_classes: [H100-80G], gpus_per_node: 0}\n"
        )
        proc = ctl_process(controller.url, "apply", "-f", str(f))
        assert proc.returncode == 1
        assert f"{f}: model 'bad' (#2): field gpus_per_node" in proc.stderr
        assert ctl(controller.url, "models", "--json").json() == []

    def test_controller_rejects_what_ctl_cannot_check(self, controller: Program) -> None:
        """scale --min above the model's max is refused by the controller, exit 1."""
        spec = '{"name": "m", "engine": "sim", "gpu_classes": ["L40S"], "max_replicas": 1}'
        proc = subprocess.run(
            [sys.executable, "-m", "llmgw", "ctl", "apply", "-f", "-"],
            input=spec,
            capture_output=True,
            text=True,
            timeout=30,
            env={"LLMGW_CONTROLLER": controller.url, "LLMGW_TOKEN": TOKEN, "PATH": "/usr/bin"},
        )
        assert proc.returncode == 0, proc.stderr
        res = ctl(controller.url, "scale", "m", "--min", "3")
        assert res.code == 1
        assert res.err.count("\n") == 1
