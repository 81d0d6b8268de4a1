"""llmgw up waits for every node of its fleet before it applies the models."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.adminclient.errors import AdminUnauthorized, AdminUnreachable
from llmgw.up.fleet import load_fleet
from llmgw.up.main import Up, build_parser


@dataclass
class Named:
    name: str


class Nodes:
    """Answers the node lists given, one per call, the last one from then on."""

    def __init__(self, *answers: list[str] | None) -> None:
        self.answers = list(answers)
        self.calls = 0

    def nodes(self) -> list[Named]:
        self.calls += 1
        answer = self.answers[min(self.calls, len(self.answers)) - 1]
        if answer is None:
            raise AdminUnreachable("connection refused")
        if answer == ["401"]:
            raise AdminUnauthorized("missing or wrong bearer token", status=401)
        return [Named(n) for n in answer]


def up_with(tmp_path: Path, client: Nodes) -> Up:
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "nodes: [{prefix: n, count: 2, gpus: 1xH100-80G}]\n"
        "models: [{name: m, engine: sim, gpu_classes: [H100-80G], min_replicas: 0}]\n"
    )
    args = build_parser().parse_args(["--state-dir", str(tmp_path / "state")])
    up = Up(args, load_fleet(fleet_file))
    up.client = client  # type: ignore[assignment]
    return up


class TestWaitForNodes:
    """Up.wait_for_nodes: returns once all have registered, else warns after its timeout."""

    def test_returns_once_every_node_is_there(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A controller not answering yet, then one node, then both: no warning."""
        client = Nodes(None, ["n-1"], ["n-1", "n-2", "other"])
        up_with(tmp_path, client).wait_for_nodes(timeout_s=30)
        assert client.calls == 3
        assert capsys.readouterr().err == ""

    def test_a_node_that_never_comes_is_named_after_the_timeout(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """One line names the missing node, and the models go to the others."""
        up_with(tmp_path, Nodes(["n-2"])).wait_for_nodes(timeout_s=0.3)
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert "1 node(s) not registered after 0 s (n-1)" in err

    def test_stopping_ends_the_wait_quietly(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Ctrl-C while waiting: no warning (start() reports the interruption)."""
        up = up_with(tmp_path, Nodes([]))
        up.stopping = True
        up.wait_for_nodes(timeout_s=30)
        assert capsys.readouterr().err == ""

    def test_a_refusal_ends_the_wait_at_once(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A wrong token: no waiting and no warning (applying the models says it)."""
        client = Nodes(["401"])
        up_with(tmp_path, client).wait_for_nodes(timeout_s=30)
        assert client.calls == 1
        assert capsys.readouterr().err == ""
