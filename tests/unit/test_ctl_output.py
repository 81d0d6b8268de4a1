"""ctl as a Unix tool: piped output is never cut, -o formats, flags anywhere, one-line
events with --detail, completion scripts, and a hint when the URL is not a controller."""

from __future__ import annotations

import calendar
import io
from collections.abc import Mapping
from pathlib import Path

import msgspec
import pytest
from rich.console import Console
from rich.table import Table

from llmgw.adminclient.client import Response
from llmgw.ctl import output, tables
from llmgw.ctl.commands.keys import keys_table
from llmgw.ctl.commands.usage import usage_table
from llmgw.wire.admin import EventView
from llmgw.wire.errors import error_body
from llmgw.wire.keys import BudgetView, KeyShare, KeyView
from llmgw.wire.usage import UsageAnswer, UsageRow

from .test_ctl_commands import FakeController, replica_view, run_ctl

LONG = "meta-llama/llama-3.1-405b-instruct-fp8-with-a-sixty-char-name"  # 61 characters


class LongNames(FakeController):
    def __init__(self) -> None:
        super().__init__()
        self.replicas = [
            msgspec.structs.replace(replica_view(f"r-{i}-{LONG}"), model=LONG) for i in range(3)
        ]
        self.failure = EventView(
            id=42, at=1.8e9, kind="replica.failed", subject="replica", subject_id="r-1",
            model=LONG,
            message="rank 0 on gpu-01 exited with code 1: python -m vllm serve --model x "
            "--port 21000 | Traceback (most recent call last): | RuntimeError: CUDA out of memory",
        )  # fmt: skip

    def _route(self, method: str, path: str, query: Mapping[str, str], payload: object) -> Response:
        if (method, path) == ("GET", "/admin/events"):
            events = [self.failure]
            if "id" in query:
                events = [e for e in events if str(e.id) == query["id"]]
            return self._ok(events)
        return super()._route(method, path, query, payload)


class Router(FakeController):
    """A router where a controller was expected: OpenAI-shaped 404s, /healthz says router."""

    def _route(self, method: str, path: str, query: Mapping[str, str], payload: object) -> Response:
        if path == "/healthz":
            return self._ok(
                {"status": "ok", "program": "router", "controller": "http://ctl.internal:8081"}
            )
        return Response(
            404,
            error_body(
                f"Invalid URL ({method} {path}).", type="invalid_request_error", code="unknown_url"
            ),
        )


class TestCtlOutput:
    """ctl's output formats, flags, hints and completion scripts."""

    def test_piped_table_keeps_60_character_names_whole(self, tmp_path: Path) -> None:
        """Not a terminal: `wide`, every cell whole (`ctl replicas | grep -c 405b` counts 3)."""
        run = run_ctl(["replicas"], LongNames(), tmp_path)
        assert run.code == 0, run.err
        rows = run.out.splitlines()
        assert rows[0].split()[:3] == ["REPLICA", "MODEL", "STATE"]
        assert sum("405b" in line for line in rows) == 3
        assert all(LONG in line and f"r-{i}-{LONG}" in line for i, line in enumerate(rows[1:]))
        assert "…" not in run.out
        assert "\x1b[" not in run.out  # no colour codes when piped

    def test_tsv_has_a_header_and_tab_separated_cells(self, tmp_path: Path) -> None:
        """TSV has a header and tab separated cells."""
        run = run_ctl(["-o", "tsv", "replicas"], LongNames(), tmp_path)
        lines = run.out.splitlines()
        assert lines[0].split("\t")[:2] == ["REPLICA", "MODEL"]
        assert [line.split("\t")[1] for line in lines[1:]] == [LONG] * 3

    @pytest.mark.parametrize(
        "argv",
        [
            ["--json", "nodes"],
            ["nodes", "--json"],
            ["-o", "json", "nodes"],
            ["nodes", "-o", "json"],
        ],
    )
    def test_global_flags_before_or_after_the_command(
        self, tmp_path: Path, argv: list[str]
    ) -> None:
        """Global flags before or after the command."""
        run = run_ctl(argv, FakeController(), tmp_path)
        assert run.code == 0, run.err
        assert run.json()[0]["name"] == "gpu-01"  # type: ignore[index]

    def test_table_format_in_a_terminal_is_rich(self, tmp_path: Path) -> None:
        """Table format in a terminal is rich."""
        run = run_ctl(["-o", "table", "nodes"], FakeController(), tmp_path)
        assert run.code == 0
        assert "NODE" in run.out

    def test_events_one_line_each_and_detail_by_id(self, tmp_path: Path) -> None:
        """Events one line each and detail by id."""
        fake = LongNames()
        run = run_ctl(["events"], fake, tmp_path)
        lines = run.out.splitlines()
        assert len(lines) == 2  # header + one line for the event
        assert lines[1].split()[0] == "42"
        assert "exited with code 1: python -m vllm serve" in lines[1]
        assert "Traceback" not in run.out  # the log tail is in --detail
        assert lines[1].endswith("…")
        detail = run_ctl(["events", "--detail", "42"], fake, tmp_path)
        assert detail.code == 0, detail.err
        assert "  Traceback (most recent call last):" in detail.out
        assert "  RuntimeError: CUDA out of memory" in detail.out
        as_json = run_ctl(["events", "--detail", "42", "--json"], fake, tmp_path)
        assert as_json.json()["message"] == fake.failure.message  # type: ignore[index]
        missing = run_ctl(["events", "--detail", "7"], fake, tmp_path)
        assert missing.code == 1
        assert "no event 7" in missing.err

    def test_event_summary_rules(self) -> None:
        """Event summaries are cut to a fixed length and at the first detail separator."""
        assert tables.event_summary("cordoned by operator") == "cordoned by operator"
        long = "x" * 300
        cut = tables.event_summary(long)
        assert len(cut) == tables.EVENT_MESSAGE_CHARS
        assert cut.endswith("…")
        assert tables.event_summary("a: b | c") == "a: b …"

    def test_wide_and_tsv_render_the_same_cells(self) -> None:
        """Wide and TSV render the same cells."""
        headers, body = ["A", "LONGER"], [["x" * 70, "1"], ["y", "22"]]
        wide = output.wide(headers, body).splitlines()
        assert wide[1].startswith("x" * 70 + "  1")
        assert output.tsv(headers, body).splitlines()[2] == "y\t22"

    def test_router_url_gets_a_hint_to_the_controller(self, tmp_path: Path) -> None:
        """A router URL gets a hint to the controller."""
        fake = Router(token=None)
        run = run_ctl(["status"], fake, tmp_path)
        assert run.code == 1
        assert run.err.count("\n") == 1
        assert "looks like the llmgw router, not the controller" in run.err
        assert "its controller is at http://ctl.internal:8081" in run.err

    def test_unknown_server_gets_a_hint(self, tmp_path: Path) -> None:
        """Unknown server gets a hint."""

        class Other(FakeController):
            def _route(self, *a: object) -> Response:
                return Response(404, b"<html>not found</html>")

        run = run_ctl(["nodes"], Other(token=None), tmp_path)
        assert run.code == 1
        assert "is not an llmgw controller" in run.err

    @pytest.mark.parametrize("shell", ["bash", "zsh"])
    def test_completion_scripts_know_every_command(self, tmp_path: Path, shell: str) -> None:
        """Completion scripts know every command."""
        run = run_ctl(["completion", shell], FakeController(), tmp_path)
        assert run.code == 0
        for command in ("status", "drain", "apply", "events", "completion", "--output"):
            assert command in run.out


def _doc_output(page: str, command: str) -> list[str]:
    """The lines a console block of docs/`page` shows under `$ command`, up to the next
    `$ ` line or the block's end."""
    lines = (Path(__file__).resolve().parents[2] / "docs" / page).read_text().splitlines()
    start = lines.index(f"$ {command}") + 1
    shown: list[str] = []
    for line in lines[start:]:
        if line.startswith(("$ ", "```")):
            break
        shown.append(line)
    return shown


def _rendered(table: Table) -> list[str]:
    """A table as ctl prints it in a 120-column terminal, trailing spaces dropped."""
    out = io.StringIO()
    Console(file=out, width=120, highlight=False, color_system=None).print(table)
    return [line.rstrip() for line in out.getvalue().splitlines()]


class TestTenantsPageTables:
    """docs/tenants.md's `keys list` and `usage` examples are what ctl prints."""

    def test_keys_list_as_the_page_shows_it(self) -> None:
        """A key like the page's alice renders the page's lines: frameless, as every ctl table."""
        now = 1_000_000.0
        alice = KeyView(
            name="alice",
            team="research",
            models=("llama-8b", "qwen-7b"),
            rpm=60,
            tpm=20000,
            budget=BudgetView(tokens=2_000_000, per="month"),
            created_at=now,
            expires_at=now + 89.5 * 86400,
            shares=tuple(KeyShare(router=f"r{i}", rpm=v) for i, v in enumerate((31.2, 14.4, 14.4))),
        )
        shown = _doc_output("tenants.md", "llmgw ctl keys list")
        assert _rendered(keys_table([alice], now=now)) == shown

    def test_a_long_key_name_is_never_cut(self) -> None:
        """In 60 columns a key's long name stays whole (`keys revoke` takes it back)."""
        name = "ci-nightly-evaluation-pipeline-key"
        key = KeyView(
            name=name,
            team="research",
            models=tuple(f"model-{i}-instruct" for i in range(6)),
            rpm=None,
            tpm=None,
            budget=None,
            created_at=0.0,
            expires_at=None,
            shares=(),
        )
        out = io.StringIO()
        Console(file=out, width=60, highlight=False, color_system=None).print(
            keys_table([key], now=1.0)
        )
        lines = out.getvalue().splitlines()
        assert any(line.startswith(name + " ") for line in lines), lines
        assert "…" not in lines[1].split()[0]

    def test_usage_by_team_as_the_page_shows_it(self) -> None:
        """Two teams' hour renders the Usage section's lines: numbers right-aligned, no rules."""
        hour = calendar.timegm((2026, 12, 6, 3, 0, 0))
        answer = UsageAnswer(
            by="team",
            since=hour,
            rows=[
                UsageRow(
                    hour=hour, team="infra", requests=12, prompt_tokens=4410, completion_tokens=960
                ),
                UsageRow(
                    hour=hour,
                    team="research",
                    requests=40,
                    prompt_tokens=18200,
                    completion_tokens=5120,
                ),
            ],
        )
        # The Usage section's block (the quick start's shows research alone).
        lines = (Path(__file__).resolve().parents[2] / "docs" / "tenants.md").read_text()
        section = lines[lines.index("## Usage") :]
        block = section.split("```console\n", 1)[1].split("```", 1)[0].splitlines()
        assert block[0] == "$ llmgw ctl usage --by team --since 6h"
        assert _rendered(usage_table(answer)) == block[1:]
