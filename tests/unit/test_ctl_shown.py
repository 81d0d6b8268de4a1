"""Fleet data in ctl is text: control and bidi characters visible, markup never parsed, and
no file or answer ends ctl with a traceback (issue 34, items 2 and 3)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import msgspec
import pytest

from llmgw.adminclient.client import Response
from llmgw.ctl import render, shown, specs
from llmgw.ctl.errors import SpecError
from llmgw.wire.admin import (
    ClassUse,
    DrainWait,
    EventView,
    FabricUse,
    IdleReplica,
    NodeTotals,
    Summary,
    UnplaceableModel,
)
from llmgw.wire.errors import error_body
from llmgw.wire.keys import KeyView
from llmgw.wire.models import ModelSpec
from llmgw.wire.usage import UsageAnswer, UsageRow

from .test_ctl_commands import FakeController, model_view, node_view, replica_view, run_ctl

# Clear screen, an OSC-8 link, a colour, a right-to-left override, rich markup that
# does not parse, and markup that would.
HOSTILE = "x\x1b[2J\x1b]8;;https:e.vil\x07link\x1b]8;;\x07\x1b[31m\u202eevil [/] [bold]b"
# What an operator must see of it: each hidden character by its escape, markup as typed.
SHOWN = "x\\x1b[2J\\x1b]8;;https:e.vil\\x07link\\x1b]8;;\\x07\\x1b[31m\\u202eevil [/] [bold]b"


def raw_control(text: str) -> list[str]:
    """The characters of `text` a terminal would act on or a reader could not see (tsv's
    tabs and the line ends are ctl's own)."""
    return [ch for ch in text if ch not in "\t\n" and shown.visible(ch) != ch]


def strings(doc: object) -> set[str]:
    """Every string value in a decoded JSON document."""
    if isinstance(doc, str):
        return {doc}
    if isinstance(doc, dict):
        return set().union(*(strings(v) for v in doc.values()))
    if isinstance(doc, list):
        return set().union(*(strings(v) for v in doc))
    return set()


class TestVisible:
    """Hidden characters in fleet text are made visible and markup is never parsed."""

    def test_printable_text_is_unchanged(self) -> None:
        """Names, accents, emoji and markup-looking brackets come back as they are."""
        for s in ("gpu-01", "meta-llama/Llama-3.1-8B", "café 🙂", "[/] [bold]"):
            assert s == shown.visible(s)

    def test_hidden_characters_are_escaped(self) -> None:
        """ESC, BEL, NUL, DEL, C1, tab, newline, bidi controls and a lone surrogate become
        escapes."""
        assert shown.visible(HOSTILE) == SHOWN
        assert shown.visible("\x00\x7f\x9b\t\n\r") == "\\x00\\x7f\\x9b\\t\\n\\r"
        assert (
            shown.visible("\u202e\u2066\u200b\ufeff\u2028") == "\\u202e\\u2066\\u200b\\ufeff\\u2028"
        )
        assert shown.visible("a\ud83d") == "a\\ud83d"
        assert shown.visible("\U000e0001") == "\\U000e0001"

    def test_result_encodes_and_has_nothing_hidden(self) -> None:
        """Every code point's result is plain printable UTF-8 (what a terminal shows)."""
        for code in [*range(0x300), *range(0x2000, 0x2070), 0xD800, 0xDFFF, 0xFEFF, 0xE0001]:
            out = shown.visible(chr(code))
            out.encode()
            assert raw_control(out) == [], hex(code)

    def test_text_is_never_markup(self) -> None:
        """A rich Text of `[/]` renders as `[/]`, where a str would raise MarkupError."""
        assert render.to_text(shown.text("[/] [bold]b")) == "[/] [bold]b\n"

    def test_lines_keeps_line_breaks(self) -> None:
        """A multi-line message keeps its lines; each line's hidden characters are escaped."""
        assert shown.lines("a\x1b\nb\u202e") == "a\\x1b\nb\\u202e"


class Hostile(FakeController):
    """A controller whose every name and reason holds HOSTILE (as an old or rogue one may)."""

    def __init__(self) -> None:
        super().__init__()
        node = node_view(HOSTILE, state="draining")
        self.nodes = {
            HOSTILE: msgspec.structs.replace(node, classes=(HOSTILE,), fabrics=(HOSTILE,))
        }
        self.drain_waiting = (DrainWait(replica=HOSTILE, model=HOSTILE, reason=HOSTILE),)
        self.nodes[HOSTILE] = msgspec.structs.replace(
            self.nodes[HOSTILE], drain_waiting=self.drain_waiting
        )
        self.replicas = [
            msgspec.structs.replace(
                replica_view(HOSTILE, state="failed"), model=HOSTILE, reason=HOSTILE
            )
        ]
        # Events to answer instead of the hostile one; None: that one.
        self.events_override: list[EventView] | None = None

    def _route(self, method: str, path: str, query: Mapping[str, str], payload: object) -> Response:
        if (method, path) == ("GET", "/admin/summary"):
            return self._ok(
                Summary(
                    nodes=NodeTotals(total=1, draining=1),
                    gpus=[ClassUse(gpu_class=HOSTILE, total=8, used=2, unhealthy=1)],
                    fabrics=[FabricUse(fabric=HOSTILE, nodes=1, largest_free_block=0)],
                    unplaceable=[HOSTILE],
                    unplaceable_reasons=[UnplaceableModel(model=HOSTILE, reason=HOSTILE)],
                    idle_replicas=[
                        IdleReplica(id=HOSTILE, model=HOSTILE, idle_seconds=900, gpus=1)
                    ],
                )
            )
        if (method, path) == ("GET", "/admin/models"):
            view = model_view("m")
            return self._ok([msgspec.structs.replace(view, unplaceable_reason=HOSTILE)])
        if (method, path) == ("GET", "/admin/keys"):
            # A key's models are not names the controller checks; a router file's key
            # names and teams, which usage reports, are free text.
            key = KeyView(name="k", team="t", models=(HOSTILE,), created_at=1.8e9)
            return self._ok([key])
        if (method, path) == ("GET", "/admin/usage"):
            row = UsageRow(
                hour=1_800_000_000 // 3600 * 3600, key=HOSTILE, team=HOSTILE, model=HOSTILE,
                requests=1, prompt_tokens=2, completion_tokens=3,
            )  # fmt: skip
            by = {"team": "team", "model": "model"}.get(query.get("by", ""), "key")
            return self._ok(UsageAnswer(by=by, since=0, rows=[row]))
        if (method, path) == ("GET", "/admin/events") and self.events_override is not None:
            return self._ok(self.events_override)
        if (method, path) == ("GET", "/admin/events"):
            event = EventView(
                id=7, at=1.8e9, kind=HOSTILE, subject="node", subject_id=HOSTILE, model=HOSTILE,
                message=f"GPU 0: {HOSTILE}",
            )  # fmt: skip
            return self._ok([event])
        return super()._route(method, path, query, payload)


# Every command that prints a table of fleet data.
TABLE_COMMANDS = (
    ["nodes"], ["models"], ["replicas"], ["events"], ["keys", "list"],
    ["usage"], ["usage", "--by", "team"], ["usage", "--by", "model"],
)  # fmt: skip


class TestHostileFleet:
    """Hostile names from the fleet are shown, never obeyed."""

    @pytest.mark.parametrize(
        ("argv", "fmt"),
        [
            *((["status"], fmt) for fmt in ("table", "wide")),
            *((argv, fmt) for argv in TABLE_COMMANDS for fmt in ("table", "wide", "tsv")),
            (["events", "--detail", "7"], "table"),
        ],
    )
    def test_shown_not_obeyed(self, argv: list[str], fmt: str, tmp_path: Path) -> None:
        """Every command and format exits 0 and shows the names' escapes, acting on none."""
        run = run_ctl([*argv, "-o", fmt], Hostile(), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert raw_control(run.out) == []
        assert "\\x1b[2J" in run.out  # shown (a narrow table may cut what follows)

    def test_command_answer_is_visible(self, tmp_path: Path) -> None:
        """`cordon` echoes the node's name from the answer with its escapes shown."""
        fake = FakeController()
        name = "n\x1b[2J\u202e"
        fake.nodes = {name: node_view(name)}
        run = run_ctl(["cordon", name], fake, tmp_path)
        assert (run.code, run.out) == (0, "node n\\x1b[2J\\u202e cordoned (state cordoned)\n")

    @pytest.mark.parametrize("command", ["status", "nodes", "models", "replicas", "events"])
    def test_json_is_the_same_value_with_nothing_hidden(self, command: str, tmp_path: Path) -> None:
        """`-o json` carries the names exactly, every hidden character as a JSON escape."""
        run = run_ctl([command, "-o", "json"], Hostile(), tmp_path)
        assert (run.code, raw_control(run.out)) == (0, [])
        assert HOSTILE in strings(json.loads(run.out))

    def test_times_no_clock_can_show(self, tmp_path: Path) -> None:
        """An event or heartbeat time past any clock (a broken controller) is `-`, exit 0."""
        fake = Hostile()
        node = fake.nodes[HOSTILE]
        fake.nodes[HOSTILE] = msgspec.structs.replace(node, last_heartbeat=-1e300)
        event = EventView(
            id=1, at=1e300, kind="k", subject="node", subject_id="n", model=None, message="m"
        )
        fake.events_override = [event]
        for argv in (["events"], ["events", "--detail", "1"], ["nodes"]):
            run = run_ctl([*argv, "-o", "wide"], fake, tmp_path)
            assert (run.code, run.err) == (0, ""), argv

    def test_status_shows_markup_as_typed(self, tmp_path: Path) -> None:
        """A fabric named `[/]` is printed, not parsed (it used to end ctl in MarkupError)."""
        run = run_ctl(["status", "-o", "wide"], Hostile(), tmp_path)
        assert "evil [/] [bold]b" in run.out

    @pytest.mark.parametrize("argv", [["keys", "list"], ["usage"], ["usage", "--by", "model"]])
    def test_tables_show_markup_as_typed(self, argv: list[str], tmp_path: Path) -> None:
        """A key's model or a usage row's name `[/]` is printed in a rich table, not parsed
        (it used to end `keys list` and `usage` in MarkupError)."""
        run = run_ctl([*argv, "-o", "table"], Hostile(), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert "[/] [bold]b" in run.out

    def test_refusal_quoting_a_name_is_visible(self, tmp_path: Path) -> None:
        """An error that echoes a hostile name is one visible line on stderr, exit 1."""
        run = run_ctl(["cordon", f"no-{HOSTILE}"], FakeController(), tmp_path)
        assert run.code == 1
        assert run.err.count("\n") == 1
        assert raw_control(run.err) == []


class EchoesThePath(FakeController):
    """Answers every call 404 with the path in the message, as the controller's router
    does for a path no route matches (`DELETE /admin/models/x\ny: Not Found`)."""

    def _route(self, method: str, path: str, query: Mapping[str, str], payload: object) -> Response:
        return Response(404, error_body(f"{method} {path}: Not Found", type="not_found_error"))


class TestOneLineRefusals:
    """A refusal is one line on stderr whatever the input or the controller's message holds."""

    @pytest.mark.parametrize(
        "argv",
        [
            ["delete", "x\ny\x1b[2J"],
            ["keys", "revoke", "x\ny"],
            ["scale", "x\ny", "--min", "1"],
        ],
    )
    def test_a_line_break_from_the_controller_is_escaped(
        self, argv: list[str], tmp_path: Path
    ) -> None:
        """A name with a line break, echoed back by the controller, is shown as `\\n`."""
        argv = [a.encode().decode("unicode_escape") for a in argv]
        run = run_ctl(argv, EchoesThePath(), tmp_path)
        assert run.code == 1
        assert run.err.count("\n") == 1, run.err
        assert raw_control(run.err) == []
        assert "x\\ny" in run.err

    def test_a_line_break_in_a_bad_key_name_is_escaped(self, tmp_path: Path) -> None:
        """`keys create` of a name with a line break says so in one line."""
        run = run_ctl(["keys", "create", "a\nb", "--team", "t"], FakeController(), tmp_path)
        assert run.code == 1
        assert run.err.startswith("llmgw ctl: keys create a\\nb: NAME: ")
        assert run.err.count("\n") == 1, run.err

    def test_a_spec_file_keeps_one_line_per_problem(self, tmp_path: Path) -> None:
        """An invalid spec file is still the head line and one line per problem."""
        f = tmp_path / "m.yaml"
        f.write_text("- {name: a, engine: x}\n- {name: b, engine: y}\n")
        run = run_ctl(["apply", "-f", str(f)], FakeController(), tmp_path)
        assert run.code == 1
        assert run.err.startswith("llmgw ctl: 4 problem(s) in 2 model spec(s)")
        assert run.err.count("\n") == 5, run.err


class TestSpecFiles:
    """Malformed spec files give one clear error."""

    def test_lone_surrogate_is_one_clear_error(self, tmp_path: Path) -> None:
        """A `\\ud83d` escape in YAML is refused naming its line, before anything is sent."""
        f = tmp_path / "m.yaml"
        f.write_text('name: ok\nengine: sim\ngpu_classes: [H100-80G]\nenv: {A: "\\ud83d"}\n')
        run = run_ctl(["apply", "-f", str(f)], FakeController(), tmp_path)
        assert run.code == 1
        assert f"llmgw ctl: {f}: not valid YAML at line 4: found invalid Unicode" in run.err
        assert run.err.count("\n") == 1

    @pytest.mark.parametrize(
        ("field", "value"),
        [("weights_gb", ".inf"), ("sleep_after_s", ".inf"), ("idle_timeout_s", "-.inf"),
         ("idle_timeout_s", ".nan")],
    )  # fmt: skip
    def test_a_number_json_cannot_carry_is_refused(
        self, field: str, value: str, tmp_path: Path
    ) -> None:
        """YAML's `.inf` and `.nan` are refused naming the field, and nothing is sent (JSON
        has neither: `sleep_after_s: .inf` would have arrived as null, "not given")."""
        f = tmp_path / "m.yaml"
        f.write_text(
            f"name: ok\nengine: sim\ngpu_classes: [H100-80G]\nsleep_mode: true\n{field}: {value}\n"
        )
        fake = FakeController()
        run = run_ctl(["apply", "-f", str(f)], fake, tmp_path)
        assert run.code == 1
        assert f"llmgw ctl: {f}: model 'ok' (#1): field {field}: not a finite number" in run.err
        assert run.err.count("\n") == 1
        assert [c for c in fake.calls if c[0] == "POST"] == []

    def test_unquoted_numbers_in_args_and_env_are_text_as_written(self) -> None:
        """`args: [--max-model-len, 8192]` is the argument "8192" (and `1e-5` stays
        "1e-5", `true` "true"): refused before as "expected str, got int"."""
        raws = specs.parse_documents(
            "name: m\nengine: vllm\nsource: /m\ngpu_classes: [H100-80G]\n"
            "args: [--max-model-len, 8192, --x, 1e-5, --y, 0.90]\nenv: {A: true, B: 7}\n"
            "idle_timeout_s: 30\n",
            "f",
        )
        (spec,) = specs.validate(raws, "f")
        assert isinstance(spec, ModelSpec)
        assert spec.args == ("--max-model-len", "8192", "--x", "1e-5", "--y", "0.90")
        assert spec.env == {"A": "true", "B": "7"}
        assert spec.idle_timeout_s == 30

    def test_a_null_in_env_is_still_refused(self) -> None:
        """Only numbers and true/false become text: a null value names its field."""
        raws = specs.parse_documents("name: m\nengine: sim\nenv: {A: null}\n", "f")
        with pytest.raises(SpecError, match="env"):
            specs.validate(raws, "f")

    def test_a_json_exponent_is_a_number(self) -> None:
        """`1e3` (JSON's and YAML 1.2's float, a string to YAML 1.1) is read as a number, and
        one beyond a float's range as infinity, refused naming the field."""
        raws = specs.parse_documents('[{"name": "m", "idle_timeout_s": 1e3, "x": 5E-1}]', "f")
        assert [raws[0]["idle_timeout_s"], raws[0]["x"]] == [1000.0, 0.5]
        with pytest.raises(SpecError, match="field idle_timeout_s: not a finite number"):
            specs.parse_documents('{"name": "m", "idle_timeout_s": 1e309}', "f")

    def test_surrogate_in_a_key_and_a_name(self) -> None:
        """A surrogate in a mapping key or in a value is found, named by its path (a
        parser that lets the escape through leaves it for this walk)."""
        key = specs.unsendable({"name": "ok", "env": {"\ud83d": "a"}})
        assert key is not None
        assert key[0] == "env.\\ud83d"
        assert key[1].startswith("a string holds a lone surrogate")
        name = specs.unsendable({"name": "a\ud83d"})
        assert name is not None
        assert name[0] == "name"

    @pytest.mark.parametrize(
        ("content", "said"),
        [
            (b"\xff\xfe garbage", "not UTF-8 text (byte 0)"),
            (b"name: a\x00\n", "not valid YAML: unacceptable character #x0000"),
            (b"x" * (specs.MAX_FILE_BYTES + 1), "larger than 16 MiB"),
        ],
    )
    def test_not_a_spec_file_is_one_line(self, content: bytes, said: str, tmp_path: Path) -> None:
        """Binary, NUL-holding or huge files are one line each, exit 1, never a traceback."""
        f = tmp_path / "specs.yaml"
        f.write_bytes(content)
        run = run_ctl(["apply", "-f", str(f)], FakeController(), tmp_path)
        assert (run.code, run.err.count("\n")) == (1, 1), run.err
        assert said in run.err

    def test_too_deep_and_cyclic_documents(self) -> None:
        """YAML deeper than the stack is refused, and an anchor cycle (an endless value)."""
        with pytest.raises(SpecError, match="nested too deeply"):
            specs.parse_documents("[" * 100_000, "f")
        with pytest.raises(SpecError, match="an alias inside its own anchor"):
            specs.parse_documents("name: a\nargs: &x [*x]\n", "f")

    @pytest.mark.timeout(10)
    def test_aliases_of_a_long_string_are_refused(self, tmp_path: Path) -> None:
        """A 1 MB string repeated by 100,000 aliases (a 1.4 MB file standing for 100 GB of
        arguments) is refused before anything walks it: ctl scanned every copy for
        minutes, then encoded them all to send."""
        f = tmp_path / "specs.yaml"
        aliases = ", ".join(["*s"] * 100_000)
        f.write_text(
            "name: m\nengine: sim\ngpu_classes: [H100-80G]\n"
            f'env: {{A: &s "{"x" * 1_000_000}"}}\nargs: [{aliases}]\n'
        )
        run = run_ctl(["apply", "--dry-run", "-f", str(f)], FakeController(), tmp_path)
        assert (run.code, run.err.count("\n")) == (1, 1), run.err
        assert "aliases repeat more than 16777216 characters" in run.err


class TestConfigFile:
    """A bad ctl config file gives one line."""

    @pytest.mark.parametrize(
        ("content", "said"),
        [
            (b"\xff\xfe", "not UTF-8 text"),
            (b"[[[[", "not valid YAML: while parsing a flow node"),
            (b"[" * 50_000, "not valid YAML: nested too deeply"),
            (b'controller: "\\ud83d"', "not printable text"),
            (b'token: "\\ud83d"', "an HTTP header cannot carry"),
            (b'token: "a\\x1bb"', "an HTTP header cannot carry"),
        ],
    )
    def test_a_bad_config_file_is_one_line(self, content: bytes, said: str, tmp_path: Path) -> None:
        """Whatever ctl.yaml holds, ctl ends with one line and exit 1, never a traceback."""
        cfg = tmp_path / ".config" / "llmgw" / "ctl.yaml"
        cfg.parent.mkdir(parents=True)
        cfg.write_bytes(content)
        run = run_ctl(["nodes"], FakeController(), tmp_path, env={})
        assert (run.code, run.err.count("\n")) == (1, 1), run.err
        assert said in run.err
