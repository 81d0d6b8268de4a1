"""ctl against answers a controller never sends, but a squatter or a broken proxy may."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import msgspec
import pytest

from llmgw.adminclient.client import Response
from tests.unit.test_ctl_commands import replica_view, run_ctl

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


def _usage(since: int, hours: list[int]) -> Response:
    rows = [
        {"hour": h, "key": "k", "team": "t", "requests": 1, "prompt_tokens": 2,
         "completion_tokens": 3}
        for h in hours
    ]  # fmt: skip
    return Response(200, json.dumps({"by": "key", "since": since, "rows": rows}).encode())


class TestUsageHours:
    """An hour no clock can show is `-` in `ctl usage`, not a traceback."""

    @pytest.mark.parametrize("hour", [10**17, -(10**17), 2**63 - 1])
    def test_a_row_of_an_impossible_hour(self, tmp_path: Path, hour: int) -> None:
        """A row whose hour is past the platform's time_t shows `-`, its figures whole."""
        run = run_ctl(
            ["usage", "-o", "tsv"], Scripted({"/admin/usage": _usage(0, [hour])}), tmp_path
        )
        assert run.code == 0, run.err
        assert run.out.splitlines()[1].split("\t") == ["-", "k", "t", "1", "2", "3", "5"]

    def test_no_rows_since_an_impossible_hour(self, tmp_path: Path) -> None:
        """No rows since an impossible hour says so with `-`."""
        run = run_ctl(["usage"], Scripted({"/admin/usage": _usage(10**17, [])}), tmp_path)
        assert (run.code, run.err) == (0, "no usage since - UTC\n")


class TestCreatedKey:
    """`keys create` prints the controller's key as text a terminal does not act on."""

    def test_control_sequences_in_the_key_are_shown_not_sent(self, tmp_path: Path) -> None:
        """A key holding OSC 52 (set the clipboard) and a clear-screen is printed escaped."""
        key = "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07\x1b[2Jsk-abc\u202e"
        created = {"name": "k", "team": "t", "created_at": 1.0, "key": key}
        answers = {"/admin/keys": Response(200, json.dumps(created).encode())}
        run = run_ctl(["keys", "create", "k", "--team", "t"], Scripted(answers), tmp_path)
        assert run.code == 0, run.err
        assert (
            run.out.splitlines()[-1] == "\\x1b]52;c;Y3VybCBldmlsIHwgc2g=\\x07\\x1b[2Jsk-abc\\u202e"
        )
        assert "\x1b" not in run.out

    def test_an_ordinary_key_is_printed_as_it_is(self, tmp_path: Path) -> None:
        """A key the controller makes (URL-safe base64) is printed unchanged, alone on its line."""
        key = "sk-llmgw-AbC_d-e0123456789"
        created = {"name": "k", "team": "t", "created_at": 1.0, "key": key}
        answers = {"/admin/keys": Response(200, json.dumps(created).encode())}
        run = run_ctl(["keys", "create", "k", "--team", "t"], Scripted(answers), tmp_path)
        assert run.out.splitlines()[-1] == key


class TestCountsPastAFloat:
    """An idle time too large for a float is `-`, as a NaN one is, not a traceback."""

    def test_replicas_table(self, tmp_path: Path) -> None:
        """A replica idle 10**400 s shows `-` in IDLE; -o json keeps the number whole."""
        replica = msgspec.to_builtins(replica_view("r-1", idle=10**400))
        answers = {"/admin/replicas": Response(200, json.dumps([replica]).encode())}
        run = run_ctl(["replicas", "-o", "tsv"], Scripted(answers), tmp_path)
        assert run.code == 0, run.err
        assert run.out.splitlines()[1].split("\t")[5] == "-"
        run = run_ctl(["replicas", "-o", "json"], Scripted(answers), tmp_path)
        assert json.loads(run.out)[0]["idle_seconds"] == 10**400

    def test_status_idle_list(self, tmp_path: Path) -> None:
        """The status screen's idle list shows `-` for such a replica."""
        idle = {"id": "r-1", "model": "m", "idle_seconds": 10**400, "gpus": 1}
        answers = {"/admin/summary": Response(200, json.dumps({"idle_replicas": [idle]}).encode())}
        run = run_ctl(["status", "-o", "wide"], Scripted(answers), tmp_path)
        assert run.code == 0, run.err
        assert [line.split() for line in run.out.splitlines() if "r-1" in line] == [
            ["r-1", "m", "-", "1"]
        ]
