"""The fleet file `llmgw up --fleet` reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.gpus.classes import memory_mib_of_class
from llmgw.up.fleet import CLASS_MEMORY_RE, FleetError, load_fleet
from tests.unit.controller_reconcile_world import World, gpus


class TestFleet:
    """The fleet file llmgw up reads."""

    def test_default_fleet_shows_every_feature(self) -> None:
        """The built-in fleet has two fabrics and classes, TP, multi-node and scale-from-zero."""
        fleet = load_fleet(None)
        assert {g.fabric for g in fleet.nodes} == {"ib0", "ib1"}
        assert {g.gpus.split("x", 1)[1] for g in fleet.nodes} == {"H100-80G", "L40S-48G"}
        assert any(m.gpus_per_node > 1 and m.nodes == 1 for m in fleet.models)
        assert any(m.nodes > 1 for m in fleet.models)
        assert any(m.min_replicas == 0 for m in fleet.models)

    def test_default_fleet_has_more_models_than_cards(self) -> None:
        """Every model at max replicas needs more GPUs than the fleet has (eviction has work)."""
        fleet = load_fleet(None)
        cards = sum(g.count * int(g.gpus.split("x", 1)[0]) for g in fleet.nodes)
        wanted = sum(m.gpus_per_replica * max(1, m.max_replicas) for m in fleet.models)
        assert wanted > cards

    def test_node_names_number_from_one(self, tmp_path: Path) -> None:
        """A group of three nodes is named prefix-1..prefix-3."""
        f = tmp_path / "f.yaml"
        f.write_text("nodes: [{prefix: n, count: 3, gpus: 2xH100-80G}]\n")
        assert [n for n, _ in load_fleet(f).node_names()] == ["n-1", "n-2", "n-3"]

    def test_unquoted_numbers_in_args_and_env_are_text(self, tmp_path: Path) -> None:
        """`sim_args: [--speed, 4]` and a model's `args`/`env` numbers are their text as
        written; YAML typed them and the fleet was refused ("expected str, got int")."""
        f = tmp_path / "f.yaml"
        f.write_text(
            "nodes: [{prefix: n, gpus: 1xH100-80G}]\nsim_args: [--speed, 4]\n"
            "controller_args: [--heartbeat-timeout-s, 3]\nmodels:\n"
            "  - {name: m, engine: sim, gpu_classes: [H100-80G], args: [--x, 1e-5],\n"
            "     env: {A: 8192, B: true}}\n"
        )
        fleet = load_fleet(f)
        assert (fleet.sim_args, fleet.controller_args) == (
            ("--speed", "4"),
            ("--heartbeat-timeout-s", "3"),
        )
        (m,) = fleet.models
        assert (m.args, m.env) == (("--x", "1e-5"), {"A": "8192", "B": "true"})

    def test_sim_args_are_appended_to_sim_models_only(self, tmp_path: Path) -> None:
        """sim_args reach sim models and leave vllm models alone."""
        f = tmp_path / "f.yaml"
        f.write_text(
            "nodes: [{prefix: n, gpus: 1xH100-80G}]\n"
            "sim_args: ['--speed', '9']\n"
            "models:\n"
            "  - {name: a, engine: sim, gpu_classes: [H100-80G], args: ['--x']}\n"
            "  - {name: b, engine: vllm, gpu_classes: [H100-80G]}\n"
        )
        a, b = load_fleet(f).models_for_apply()
        assert (a.args, b.args) == (("--x", "--speed", "9"), ())

    @pytest.mark.parametrize(
        ("text", "needle"),
        [
            ("nodes: []\n", "nodes"),
            ("nodes: [{prefix: n, gpus: eight}]\n", "gpus"),
            ("nodes: [{prefix: n, gpus: 1xA, colour: red}]\n", "colour"),
            ("nodes: [{prefix: n, gpus: 1xA}]\nmodels: [{name: m}]\n", "engine"),
            ("nodes: [{prefix: n, gpus: 1xA}, {prefix: n, gpus: 1xA}]\n", "overlap"),
            ("nodes: [\n", "YAML"),
            ("nodes: [{prefix: n, gpus: '1xH100-80G,2xFOO'}]\n", "class 'FOO' names no memory"),
        ],
    )
    def test_bad_fleet_names_file_and_field(self, tmp_path: Path, text: str, needle: str) -> None:
        """An invalid fleet file is refused with the file and the offending field named."""
        f = tmp_path / "bad.yaml"
        f.write_text(text)
        with pytest.raises(FleetError, match=needle) as info:
            load_fleet(f)
        assert str(f) in str(info.value)

    @pytest.mark.parametrize(
        "gpu_class", ["H100-80G", "CPU-16G", "A-1G", "FOO", "H100", "X-80", "-8G"]
    )
    def test_class_memory_as_the_agent_reads_it(self, gpu_class: str) -> None:
        """up refuses exactly the classes whose memory the agent's fake inventory cannot know."""
        agent_knows = memory_mib_of_class(gpu_class) is not None
        assert agent_knows == (CLASS_MEMORY_RE.search(gpu_class) is not None)

    def test_missing_file_is_a_clear_error(self, tmp_path: Path) -> None:
        """A fleet path that does not exist says so."""
        with pytest.raises(FleetError, match="No such file"):
            load_fleet(tmp_path / "nope.yaml")


class TestDefaultFleetWalkthrough:
    """The README's eviction walkthrough, on the default fleet, through the controller's tick."""

    def world(self) -> World:
        w = World()
        for name, group in load_fleet(None).node_names():
            n = w.node(name, fabrics=(group.fabric,))
            count, gpu_class = group.gpus.split("x", 1)
            w.set_node(
                name, gpus=gpus(int(count), gpu_class), last_heartbeat_at=n.last_heartbeat_at
            )
        for m in load_fleet(None).models_for_apply():
            w.model(m)
        for _ in range(3):
            w.tick()
            w.ready_all()
            w.touch(*w.state.nodes)
        return w

    def test_gemma_once_idle_then_deepseek_evicts_gemma(self) -> None:
        """Use gemma once, leave it idle past its timeout, ask for deepseek: gemma is evicted."""
        w = self.world()
        assert w.replicas("deepseek-coder-33b") == []
        w.report(demand={"gemma-2-27b-it": 1})
        w.tick()
        w.ready_all("gemma-2-27b-it")
        gemma = w.only("gemma-2-27b-it", "ready")
        # Every H100 card is taken now: deepseek needs room made.
        w.clock.advance(130)
        w.touch(*w.state.nodes)
        w.report(
            last_used={gemma.id: w.now - 125},
            inflight={gemma.id: 0},
            demand={"deepseek-coder-33b": 1},
        )
        w.tick()
        assert w.state.replicas[gemma.id].state == "draining"
        assert "evicted for deepseek-coder-33b" in (w.state.replicas[gemma.id].reason or "")

    def drained(self, node: str) -> World:
        w = self.world()
        w.report(demand={"mistral-7b-instruct": 1})  # the README's second request
        w.tick()
        w.ready_all()
        w.set_node(node, operator_state="draining")
        for _ in range(4):
            w.tick()
            w.ready_all()
            w.clock.advance(3)
            w.touch(*w.state.nodes)
        return w

    def test_draining_the_l40s_node_moves_its_replicas_to_the_h100s(self) -> None:
        """`ctl drain l40s-1`: each replica gets a ready replacement on an H100 node."""
        w = self.drained("l40s-1")
        live = [r for r in w.replicas() if r.state != "stopped"]
        moved = [r for r in live if r.state == "ready" and r.shards[0].node.startswith("h100")]
        assert sorted(r.model for r in moved if r.model != "qwen2.5-72b-instruct") == [
            "llama-3.1-405b-instruct",
            "llama-3.1-8b-instruct",
            "llama-3.1-8b-instruct",
            "mistral-7b-instruct",
            "mixtral-8x22b-instruct",
        ]
        assert all(r.state == "draining" for r in live if r.shards[0].node == "l40s-1")
