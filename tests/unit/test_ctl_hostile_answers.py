"""ctl against answers a controller never sends, but a squatter or a broken proxy may."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from llmgw.adminclient.client import Response
from tests.unit.test_ctl_commands import run_ctl

# Past msgspec's nesting limit: a few kilobytes of brackets.
DEEP = b"[" * 100_000 + b"]" * 100_000


class Scripted:
    """Answers each path (query left off) with the response given for it, else 404."""

    def __init__(self, answers: Mapping[str, Response]) -> None:
        self.answers = answers

    def request(self, method: str, url: str, **_kw: object) -> Response:
        path = "/" + url.split("/", 3)[3].split("?", 1)[0]
        return self.answers.get(path, Response(404, b"not found"))


class TestDeeplyNestedAnswers:
    """An answer nested past the decoder's depth is one line and exit 1, not a traceback."""

    @pytest.mark.parametrize(
        "answers",
        [
            pytest.param({"/admin/nodes": Response(200, b'[{"x":' + DEEP + b"}]")}, id="ok"),
            pytest.param({"/admin/nodes": Response(500, b'{"x":' + DEEP + b"}")}, id="error"),
            pytest.param({"/healthz": Response(200, DEEP)}, id="healthz-after-404"),
        ],
    )
    def test_one_line_exit_1(self, tmp_path: Path, answers: Mapping[str, Response]) -> None:
        """A deep answer, error or health check, is one line on stderr and exit 1."""
        run = run_ctl(["nodes"], Scripted(answers), tmp_path)
        assert run.code == 1
        assert run.err.count("\n") == 1, run.err
        assert run.err.startswith("llmgw ctl: ")
