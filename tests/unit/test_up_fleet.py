"""The fleet file `llmgw up --fleet` reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.up.fleet import FleetError, load_fleet


class TestFleet:
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
        ],
    )
    def test_bad_fleet_names_file_and_field(self, tmp_path: Path, text: str, needle: str) -> None:
        """An invalid fleet file is refused with the file and the offending field named."""
        f = tmp_path / "bad.yaml"
        f.write_text(text)
        with pytest.raises(FleetError, match=needle) as info:
            load_fleet(f)
        assert str(f) in str(info.value)

    def test_missing_file_is_a_clear_error(self, tmp_path: Path) -> None:
        """A fleet path that does not exist says so."""
        with pytest.raises(FleetError, match="No such file"):
            load_fleet(tmp_path / "nope.yaml")
