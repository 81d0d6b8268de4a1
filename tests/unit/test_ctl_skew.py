"""ctl against a controller of another version, a long fleet and its own config file:
what it can read is shown, what it cannot is one line."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from llmgw.adminclient import foreign
from llmgw.adminclient.client import Response
from llmgw.ctl import config, output
from llmgw.ctl.errors import CtlError
from llmgw.wire.keys import KeyView
from tests.unit.test_ctl_commands import FakeController, replica_view, run_ctl
from tests.unit.test_ctl_hostile_answers import Scripted


def key_answer(**fields: object) -> Response:
    doc = json.loads(msgspec.json.encode([KeyView(name="k", team="t", created_at=1.0)]))
    doc[0].update(fields)
    return Response(200, json.dumps(doc).encode())


class TestKeyCellsOfANewerController:
    """`keys list` shows a band or budget period it does not know as text, never markup."""

    @pytest.mark.parametrize("fmt", ["table", "wide"])
    @pytest.mark.parametrize(
        "fields",
        [
            {"priority": "[/]"},
            {"budget": {"tokens": 5, "per": "[/]"}},
            {"priority": "\x1b[2Jx"},
            {"budget": {"tokens": 5, "per": "fortnight\u202e"}},
        ],
    )
    def test_shown_as_typed(self, tmp_path: Path, fmt: str, fields: dict[str, object]) -> None:
        """`[/]` ended `-o table` in rich's MarkupError; a clear-screen or a bidi override
        reached the terminal raw."""
        answers = {"/admin/keys": key_answer(**fields)}
        run = run_ctl(["keys", "list", "-o", fmt], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert "[/]" in run.out or "\\x1b[2Jx" in run.out or "fortnight\\u202e" in run.out
        assert "\x1b" not in run.out
        assert "\u202e" not in run.out


class TestDeleteOfANewerController:
    """`delete` reads an answer that gained a field of another type."""

    def test_a_deleted_model_is_reported_deleted(self, tmp_path: Path) -> None:
        """A count beside `deleted` failed the answer's decoding after the model was gone."""
        body = json.dumps({"deleted": "m", "replicas_draining": 3, "at": None}).encode()
        answers = {"/admin/models/m": Response(200, body)}
        run = run_ctl(["delete", "m"], Scripted(answers), tmp_path)
        assert (run.code, run.err) == (0, "")
        assert run.out == "model m deleted; its replicas drain\n"


class ManyReplicas(FakeController):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.replicas = [replica_view(f"r-{i:05d}") for i in range(count)]


class TestLongTables:
    """A table past TABLE_MAX_ROWS is printed as `wide`, not laid out by rich."""

    def test_a_long_table_is_printed_wide(self, tmp_path: Path) -> None:
        """Rich took about a millisecond a row: minutes for 100k replicas in a terminal."""
        count = output.TABLE_MAX_ROWS + 1
        run = run_ctl(["replicas", "-o", "table"], ManyReplicas(count), tmp_path)
        assert run.code == 0
        assert (
            run.err
            == f"{count:,} rows: printed as -o wide (a table is laid out for at most 1,000)\n"
        )
        lines = run.out.splitlines()
        assert len(lines) == count + 1
        assert lines[-1].startswith(f"r-{count - 1:05d}  ")

    def test_a_table_at_the_bound_is_a_table(self, tmp_path: Path) -> None:
        """Up to TABLE_MAX_ROWS rows, `-o table` is rich's, with nothing on stderr."""
        run = run_ctl(["replicas", "-o", "table"], ManyReplicas(output.TABLE_MAX_ROWS), tmp_path)
        assert (run.code, run.err) == (0, "")


class TestWideCells:
    """`-o wide` aligns columns in terminal cells."""

    def test_wide_characters_keep_the_columns_aligned(self) -> None:
        """An emoji or CJK name takes two cells; counted as one it pushed its row's later
        columns out of line."""
        text = output.wide(["NAME", "STATE"], [["🦙🦙", "ready"], ["中文名", "ready"], ["ab", "x"]])
        assert text.splitlines() == ["NAME    STATE", "🦙🦙    ready", "中文名  ready", "ab      x"]


class TestConfigValues:
    """A ctl.yaml setting is the text as written, and a list or a mapping is refused."""

    @pytest.mark.parametrize(
        ("line", "kind"),
        [("token: [a, b]", "a list"), ("controller: {host: x}", "a mapping")],
    )
    def test_refused_without_the_value(self, tmp_path: Path, line: str, kind: str) -> None:
        """str() of it was sent: a list as the token "['a', 'b']"."""
        cfg = tmp_path / ".config" / "llmgw" / "ctl.yaml"
        cfg.parent.mkdir(parents=True)
        cfg.write_text(line + "\n")
        name = line.split(":")[0]
        with pytest.raises(CtlError, match=f"'{name}' must be text, not {kind}") as exc:
            config.resolve(flag_url=None, flag_token=None, env={}, home=tmp_path)
        assert "[a, b]" not in str(exc.value)

    @pytest.mark.parametrize(
        ("line", "token"),
        [
            ("token: 0123", "0123"),
            ('token: "0123"', "0123"),
            ("token: yes", "yes"),
            ("token: 1e3", "1e3"),
            ("token: 12345", "12345"),
        ],
    )
    def test_a_scalar_is_the_token_as_typed(self, tmp_path: Path, line: str, token: str) -> None:
        """Unquoted, YAML read `0123` as octal 83 and `yes` as True: sent as "83", "True"."""
        cfg = tmp_path / ".config" / "llmgw" / "ctl.yaml"
        cfg.parent.mkdir(parents=True)
        cfg.write_text(line + "\n")
        target = config.resolve(flag_url=None, flag_token=None, env={}, home=tmp_path)
        assert target.token == token

    @pytest.mark.parametrize("value", ["", "~", "null"])
    def test_null_leaves_the_token_unset(self, tmp_path: Path, value: str) -> None:
        """YAML's spellings of null are no token, as when the file was read typed."""
        cfg = tmp_path / ".config" / "llmgw" / "ctl.yaml"
        cfg.parent.mkdir(parents=True)
        cfg.write_text(f"token: {value}\n")
        target = config.resolve(flag_url=None, flag_token=None, env={}, home=tmp_path)
        assert target.token is None

    @pytest.mark.parametrize("host", ["a..b", "x" * 64 + ".example", ".ctl"])
    def test_a_host_name_no_resolver_takes_is_refused(self, tmp_path: Path, host: str) -> None:
        """An empty or over-long part of the name was a UnicodeError from the resolver."""
        with pytest.raises(CtlError, match="the host name is not valid"):
            config.resolve(flag_url=f"http://{host}:8081", flag_token=None, env={}, home=tmp_path)


class TestForeignAnswers:
    """Pages and encodings of something in front of the controller."""

    def test_page_text_prefers_the_title(self) -> None:
        """An HTML page is named by its title, entities decoded, in one line."""
        page = b"<html><head><title>\n 504 Gateway\n Time-out </title></head><body>x</body></html>"
        assert foreign.page_text(page, "text/html") == "504 Gateway Time-out"

    def test_page_text_strips_tags_and_scripts(self) -> None:
        """Without a title, the text without tags, scripts or styles, cut with `…`."""
        page = b"<h1>Bad&nbsp;Gateway</h1><script>var a = '<b>';</script>" + b"<p>y</p>" * 100
        said = foreign.page_text(page, None)
        assert said.startswith("Bad Gateway y y")
        assert len(said) == foreign.PAGE_CHARS
        assert said.endswith("…")

    @pytest.mark.parametrize(
        ("content_type", "json_"),
        [("application/json", True), ("application/problem+json; charset=utf-8", True),
         ("text/html", False), (None, None)],
    )  # fmt: skip
    def test_is_json(self, content_type: str | None, json_: bool | None) -> None:
        """JSON and `+json` types are JSON; no type says nothing."""
        assert foreign.is_json(content_type) is json_

    def test_inflated_past_the_bound(self) -> None:
        """A small body that inflates past the bound stops at it."""
        import gzip

        with pytest.raises(foreign.DecodedTooLarge):
            foreign.content(gzip.compress(b"x" * 5000), "gzip", limit=4096)
        assert foreign.content(gzip.compress(b"x" * 4096), "gzip", limit=4096) == b"x" * 4096
