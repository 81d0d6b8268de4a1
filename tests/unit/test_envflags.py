"""Flags from `LLMGW_<PROGRAM>_<FLAG>` and the controller's config file; secrets kept off argv."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.config import parse_config
from llmgw.controller.config import parse_args
from llmgw.router.config import parse as parse_router
from llmgw.router.errors import RouterConfigError
from llmgw.runtime import envflags
from llmgw.testing.configdoc import PROGRAMS, Program


def _sample(action: argparse.Action) -> tuple[str, Any]:
    """A value the flag takes, as a variable's text, and as the parsed value."""
    if envflags.is_switch(action):
        return "yes", isinstance(action, argparse._StoreTrueAction)
    if action.choices is not None:
        first = next(iter(action.choices))
        return str(first), first
    for raw in ("7", "0.5", "a=b"):
        try:
            value = action.type(raw) if callable(action.type) else raw
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        if envflags.is_many(action):
            return f"{raw},{raw}", [value, value]
        return raw, value
    raise AssertionError(f"no sample value for {action.option_strings}")


def _cases() -> list[tuple[Program, str]]:
    return [
        (program, action.dest)
        for program in PROGRAMS
        for action in envflags.settable(program.build(), program.secrets)
    ]


class TestEveryVariable:
    """Every variable docs/configuration.md lists is read, and typed as its flag."""

    @pytest.mark.parametrize(
        ("program", "dest"), _cases(), ids=lambda x: x.name if isinstance(x, Program) else x
    )
    def test_sets_its_flag(self, program: Program, dest: str) -> None:
        """The variable alone gives the flag its value."""
        parser = program.build()
        action = next(a for a in parser._actions if a.dest == dest)
        flag = envflags.long_flag(action)
        assert flag is not None
        raw, expected = _sample(action)
        env = {envflags.variable(program.name, flag): raw}
        if program.name == "router" and dest != "config":
            env["LLMGW_ROUTER_CONFIG"] = "r.yaml"  # required
        ns = envflags.parse(parser, [], program.name, environ=env, secrets=program.secrets)
        assert getattr(ns, dest) == expected


class TestEnvFlags:
    """The scheme's rules: names, order, switches, lists, bad values."""

    def test_names(self) -> None:
        """Program and flag upper-cased, dashes as underscores."""
        assert envflags.variable("sim-engine", "--max-num-seqs") == "LLMGW_SIM_ENGINE_MAX_NUM_SEQS"

    def test_command_line_wins(self) -> None:
        """A flag given on the command line beats the variable."""
        env = {"LLMGW_CONTROLLER_TICK_S": "3"}
        assert parse_args(["--tick-s", "4"], env).tick_s == 4.0
        assert parse_args([], env).tick_s == 3.0

    def test_bad_value_names_the_variable(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A value the flag refuses exits 2 with the variable's name."""
        with pytest.raises(SystemExit) as exited:
            parse_args([], {"LLMGW_CONTROLLER_PORT": "eighty"})
        assert exited.value.code == 2
        assert "LLMGW_CONTROLLER_PORT='eighty'" in capsys.readouterr().err

    def test_bad_switch(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A switch takes only the documented words."""
        with pytest.raises(SystemExit):
            parse_args([], {"LLMGW_CONTROLLER_INSECURE": "maybe"})
        assert "LLMGW_CONTROLLER_INSECURE" in capsys.readouterr().err

    def test_repeated_flag_replaces_the_variable(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`--controller` on the command line replaces the variable's list, not extends it."""
        monkeypatch.setenv("LLMGW_AGENT_CONTROLLER", "http://a:1,http://b:1")
        base = ["--node", "n", "--gpus", "1xH100-80G", "--state-dir", str(tmp_path)]
        base += ["--address", "127.0.0.1"]
        assert parse_config(base).controller == ("http://a:1", "http://b:1")
        given = parse_config([*base, "--controller", "http://c:1"])
        assert given.controller == ("http://c:1",)

    def test_misspelt_variable_is_warned(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A set LLMGW_CONTROLLER_* that names no setting is warned about, not ignored."""
        parse_args([], {"LLMGW_CONTROLLER_HEARTBEAT_TIMEOUT": "3"})
        err = capsys.readouterr().err
        assert "warning: LLMGW_CONTROLLER_HEARTBEAT_TIMEOUT is set but is no setting" in err

    def test_other_known_variables_are_not_warned(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The controller's variables that are no flag's are read, so not warned about."""
        env = {
            "LLMGW_CONTROLLER_TOKEN": "a",
            "LLMGW_CONTROLLER_AGENT_TOKEN": "b",
            "LLMGW_CONTROLLER_ROUTER_TOKEN": "c",
        }
        cfg = parse_args([], env)
        assert (cfg.token, cfg.agent_token, cfg.router_token) == ("a", "b", "c")
        assert capsys.readouterr().err == ""

    def test_required_flag_from_variable(self) -> None:
        """The router's required --config may come from LLMGW_ROUTER_CONFIG."""
        program = next(p for p in PROGRAMS if p.name == "router")
        ns = envflags.parse(program.build(), [], "router", environ={"LLMGW_ROUTER_CONFIG": "r"})
        assert ns.config == "r"


class TestControllerConfigFile:
    """`llmgw controller --config FILE`: the flags' names as keys, under variables and flags."""

    def test_order(self, tmp_path: Path) -> None:
        """File under variable under flag."""
        path = tmp_path / "c.yaml"
        path.write_text("heartbeat_timeout_s: 20\ntick-s: 2\nstarting_deadline_s: 60\n")
        env = {"LLMGW_CONTROLLER_TICK_S": "3"}
        cfg = parse_args(["--config", str(path), "--starting-deadline-s", "9"], env)
        assert (cfg.heartbeat_timeout_s, cfg.tick_s, cfg.starting_deadline_s) == (20.0, 3.0, 9.0)

    def test_named_by_variable(self, tmp_path: Path) -> None:
        """LLMGW_CONTROLLER_CONFIG names the file."""
        path = tmp_path / "c.yaml"
        path.write_text("max_long_polls: 12\n")
        assert parse_args([], {"LLMGW_CONTROLLER_CONFIG": str(path)}).max_long_polls == 12

    @pytest.mark.parametrize(
        ("text", "said"),
        [
            ("token: abc\n", "a secret does not belong in the config file"),
            ("tick_seconds: 1\n", "tick_seconds: no such setting"),
            ("tick_s: fast\n", "tick_s='fast'"),
            ("- a\n", "expected a mapping"),
            ("port: [\n", "not valid YAML"),
        ],
    )
    def test_bad_file(
        self, tmp_path: Path, text: str, said: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A wrong key or value exits 2 naming the file and the key."""
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(SystemExit) as exited:
            parse_args(["--config", str(path)], {})
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert str(path) in err
        assert said in err

    def test_missing_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A file that is not there is an error, not an empty configuration."""
        with pytest.raises(SystemExit):
            parse_args(["--config", str(tmp_path / "none.yaml")], {})
        assert "cannot read" in capsys.readouterr().err


class TestSecrets:
    """Tokens and the database password come from files or variables, never only argv."""

    def test_admin_token_from_variable_is_not_warned(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """LLMGW_CONTROLLER_TOKEN is read as a secret, without the command-line warning."""
        assert parse_args([], {"LLMGW_CONTROLLER_TOKEN": "t1"}).token == "t1"
        assert capsys.readouterr().err == ""

    def test_token_file_from_variable(self, tmp_path: Path) -> None:
        """LLMGW_CONTROLLER_TOKEN_FILE names the token's file."""
        (tmp_path / "t").write_text("t2\n")
        env = {"LLMGW_CONTROLLER_TOKEN_FILE": str(tmp_path / "t")}
        assert parse_args([], env).token == "t2"

    def test_database_password_file(self, tmp_path: Path) -> None:
        """The password joins the PostgreSQL URL; it is never on the command line."""
        (tmp_path / "pw").write_text("s3cret/:@\n")
        argv = ["--database", "postgresql://llmgw@db:5432/llmgw"]
        cfg = parse_args([*argv, "--database-password-file", str(tmp_path / "pw")], {})
        assert cfg.database == "postgresql://llmgw:s3cret%2F%3A%40@db:5432/llmgw"

    def test_database_password_variable(self) -> None:
        """LLMGW_CONTROLLER_DATABASE_PASSWORD works as the file does."""
        env = {"LLMGW_CONTROLLER_DATABASE_PASSWORD": "pw"}
        cfg = parse_args(["--database", "postgresql://u@h/d"], env)
        assert cfg.database == "postgresql://u:pw@h/d"

    @pytest.mark.parametrize(
        "database", ["sqlite:///x.db", "postgresql://u:old@h/d"], ids=["sqlite", "twice"]
    )
    def test_database_password_refused(
        self, database: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A password for SQLite, or a second one, is an error, not silently dropped."""
        with pytest.raises(SystemExit):
            parse_args(["--database", database], {"LLMGW_CONTROLLER_DATABASE_PASSWORD": "pw"})
        assert "LLMGW_CONTROLLER_DATABASE_PASSWORD" in capsys.readouterr().err

    def test_router_tokens_from_files(self, tmp_path: Path) -> None:
        """The router's YAML may name files for its three tokens."""
        for name in ("admin", "metrics", "ctl"):
            (tmp_path / name).write_text(f"{name}-token\n")
        text = (
            f"admin_token_file: {tmp_path / 'admin'}\n"
            f"metrics_token_file: {tmp_path / 'metrics'}\n"
            f"controller: {{url: 'http://c:1', token_file: {tmp_path / 'ctl'}}}\n"
        )
        cfg = parse_router(text, env={})
        assert (cfg.admin_token, cfg.metrics_token) == ("admin-token", "metrics-token")
        assert cfg.controller is not None
        assert cfg.controller.token == "ctl-token"

    def test_router_tokens_from_variables(self) -> None:
        """Variables fill what the YAML leaves out, and never override it."""
        env = {
            "LLMGW_ROUTER_ADMIN_TOKEN": "a",
            "LLMGW_ROUTER_METRICS_TOKEN": "m",
            "LLMGW_ROUTER_CONTROLLER_TOKEN": "c",
        }
        cfg = parse_router("metrics_token: file\ncontroller: {url: 'http://c:1'}\n", env=env)
        assert (cfg.admin_token, cfg.metrics_token) == ("a", "file")
        assert cfg.controller is not None
        assert cfg.controller.token == "c"

    @pytest.mark.parametrize(
        ("text", "said"),
        [
            ("admin_token: x\nadmin_token_file: /f\n", "admin_token and admin_token_file"),
            ("admin_token_file: /nonexistent/t\n", "admin_token_file: /nonexistent/t: cannot read"),
        ],
    )
    def test_router_bad_token_file(self, text: str, said: str) -> None:
        """Both, or an unreadable file, is a configuration error naming the key."""
        with pytest.raises(RouterConfigError, match=said):
            parse_router(text, source="r.yaml", env={})
