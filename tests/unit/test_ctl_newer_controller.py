"""ctl against a newer controller: views with fields and values this version does not know.

A rolling upgrade puts the controllers first (docs/operations.md), so an operator's ctl
is older than the controller it reads for the length of the upgrade and after; what a
view gains there must not stop ctl from showing what it knows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw.adminclient.client import Response
from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.admin import ModelView
from llmgw.wire.keys import Budget, KeyCreated, KeyView
from llmgw.wire.models import ModelSpec
from tests.unit.test_ctl_commands import node_view, replica_view, run_ctl
from tests.unit.test_ctl_hostile_answers import Scripted


def newer(value: object, **added: Any) -> bytes:
    """`value` as this version encodes it, with `added` in each object at its top."""
    doc = json.loads(msgspec.json.encode(value))
    for item in doc if isinstance(doc, list) else [doc]:
        item.update(added)
    return json.dumps(doc).encode()


KEY = KeyView(name="alice", team="t", rpm=10, budget=Budget(tokens=1000, per="day"), created_at=1.0)


class TestKeysOfANewerController:
    """`ctl keys` reads a key view that gained a field."""

    def test_keys_list_shows_a_key_with_an_added_field(self, tmp_path: Path) -> None:
        """A key field this ctl does not know is left out; the key's row is shown."""
        answers = {"/admin/keys": Response(200, newer([KEY], max_parallel=4))}
        run = run_ctl(["keys", "list", "-o", "tsv"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        row = run.out.splitlines()[1].split("\t")
        assert row[:7] == ["alice", "t", "*", "10", "-", "1000/day", "standard"]

    def test_keys_create_reads_an_answer_with_an_added_field(self, tmp_path: Path) -> None:
        """The created key is printed even when its answer carries a field ctl does not know."""
        created = KeyCreated(name="bob", team="t", created_at=1.0, key="sk-llmgw-abc")
        answers = {"/admin/keys": Response(200, newer(created, max_parallel=4))}
        run = run_ctl(["keys", "create", "bob", "--team", "t"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert run.out.splitlines()[-1] == "sk-llmgw-abc"


def newer_models(view: ModelView, **added: Any) -> bytes:
    """[view] as this version encodes it, with `added` in its spec, routing and adapters."""
    doc = json.loads(msgspec.json.encode([view]))
    for item in doc:
        item["spec"].update(added)
        item["spec"]["routing"].update(added)
        for adapter in item["adapters"]:
            adapter.update(added)
    return json.dumps(doc).encode()


MODEL = ModelView(
    spec=ModelSpec(name="m", engine="sim", gpu_classes=("H100-80G",)),
    name="m",
    ready=1,
    total=1,
    min=1,
    max=1,
    desired=1,
    adapters=(AdapterSpec(name="m-lora", adapter_of="m", source="/a"),),
)


class TestModelsOfANewerController:
    """`ctl models` and `ctl apply` read a model view whose spec gained a field."""

    def test_models_shows_a_spec_with_an_added_field(self, tmp_path: Path) -> None:
        """Spec, routing and adapter fields ctl does not know are left out; the row is shown."""
        answers = {"/admin/models": Response(200, newer_models(MODEL, warm_pool=2))}
        run = run_ctl(["models", "-o", "tsv"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert run.out.splitlines()[1].split("\t")[:2] == ["m", "sim"]

    def test_apply_reports_what_was_applied(self, tmp_path: Path) -> None:
        """An apply the controller made is reported applied, not as an answer ctl cannot read."""
        spec_file = tmp_path / "m.yaml"
        spec_file.write_text("name: m\nengine: sim\ngpu_classes: [H100-80G]\n")
        answers = {"/admin/models": Response(200, newer_models(MODEL, warm_pool=2))}
        run = run_ctl(["apply", "-f", str(spec_file)], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert "model m applied" in run.out


class TestStatesOfANewerController:
    """`ctl replicas` and `ctl nodes` show a state this version does not know, as it is."""

    def test_replicas_shows_a_new_state(self, tmp_path: Path) -> None:
        """A replica in a state added later is listed with that state, beside the others."""
        views = [replica_view("r-1"), replica_view("r-2")]
        doc = json.loads(msgspec.json.encode(views))
        doc[1]["state"] = "migrating"
        answers = {"/admin/replicas": Response(200, json.dumps(doc).encode())}
        run = run_ctl(["replicas", "-o", "tsv"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        states = [line.split("\t")[2] for line in run.out.splitlines()[1:]]
        assert states == ["ready", "migrating"]

    def test_nodes_shows_a_new_state(self, tmp_path: Path) -> None:
        """A node in a state added later is listed with that state."""
        answers = {"/admin/nodes": Response(200, newer([node_view("gpu-01")], state="repairing"))}
        run = run_ctl(["nodes", "-o", "tsv"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert run.out.splitlines()[1].split("\t")[1] == "repairing"


class TestKeyValuesOfANewerController:
    """`ctl keys list` reads a key whose band or budget this version does not know."""

    def test_keys_list_shows_a_band_added_since(self, tmp_path: Path) -> None:
        """A key in a priority band added later is listed with that band."""
        answers = {"/admin/keys": Response(200, newer([KEY], priority="realtime"))}
        run = run_ctl(["keys", "list", "-o", "tsv"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert run.out.splitlines()[1].split("\t")[6] == "realtime"

    def test_keys_list_shows_a_budget_with_an_added_field_or_period(self, tmp_path: Path) -> None:
        """A budget carrying a field ctl does not know, or a period added later, is shown."""
        doc = json.loads(msgspec.json.encode([KEY, KEY]))
        doc[0]["budget"]["rollover"] = True
        doc[1]["budget"]["per"] = "quarter"
        answers = {"/admin/keys": Response(200, json.dumps(doc).encode())}
        run = run_ctl(["keys", "list", "-o", "tsv"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        budgets = [line.split("\t")[5] for line in run.out.splitlines()[1:]]
        assert budgets == ["1000/day", "1000/quarter"]


def newer_spec(view: ModelView, **over: Any) -> bytes:
    """[view] as this version encodes it, with `over` set in its spec."""
    doc = json.loads(msgspec.json.encode([view]))
    doc[0]["spec"].update(over)
    return json.dumps(doc).encode()


NEWER_SPEC_VALUES = [
    {"engine": "trtllm"},
    {"env_from": {"HF_TOKEN": {"vault": "kv/hf"}}},
    {"sleep_mode": True, "sleep_level": 3},
    {"engine": "llamacpp", "nodes": 2},
]


class TestSpecValuesOfANewerController:
    """`ctl models` and `ctl apply` read a spec holding a value this version does not know."""

    @pytest.mark.parametrize(
        "over", NEWER_SPEC_VALUES, ids=["engine", "secret-kind", "sleep-level", "rule"]
    )
    def test_models_shows_the_model(self, tmp_path: Path, over: dict[str, Any]) -> None:
        """The model's row is shown, its engine as the controller says."""
        answers = {"/admin/models": Response(200, newer_spec(MODEL, **over))}
        run = run_ctl(["models", "-o", "tsv"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        engine = over.get("engine", "sim")
        assert run.out.splitlines()[1].split("\t")[:2] == ["m", engine]

    def test_apply_reports_a_model_of_an_engine_added_since(self, tmp_path: Path) -> None:
        """An apply answered with a spec of an engine kind ctl does not know is reported."""
        spec_file = tmp_path / "m.yaml"
        spec_file.write_text("name: m\nengine: sim\ngpu_classes: [H100-80G]\n")
        answers = {"/admin/models": Response(200, newer_spec(MODEL, engine="trtllm"))}
        run = run_ctl(["apply", "-f", str(spec_file)], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert "model m applied" in run.out


class TestJsonOfANewerController:
    """`-o json` prints the controller's answer, what ctl does not know included."""

    def test_keys_list_json_keeps_an_added_field(self, tmp_path: Path) -> None:
        """A key field ctl does not know is in `keys list -o json`, with its value."""
        answer = newer([KEY], max_parallel=4)
        answers = {"/admin/keys": Response(200, answer)}
        run = run_ctl(["keys", "list", "-o", "json"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert json.loads(run.out) == json.loads(answer)

    def test_models_json_keeps_an_added_spec_field(self, tmp_path: Path) -> None:
        """A spec field ctl does not know is in `models --json`, where the controller put it."""
        answer = newer_models(MODEL, warm_pool=2)
        answers = {"/admin/models": Response(200, answer)}
        run = run_ctl(["models", "--json"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert json.loads(run.out) == json.loads(answer)

    def test_replicas_json_keeps_an_added_field(self, tmp_path: Path) -> None:
        """A replica field ctl does not know is in `replicas --json`."""
        answer = newer([replica_view("r-1")], migration="pending")
        answers = {"/admin/replicas": Response(200, answer)}
        run = run_ctl(["replicas", "--json"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert json.loads(run.out) == json.loads(answer)
