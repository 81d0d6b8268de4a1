"""Every float setting of every program refuses NaN and ±inf where it is parsed.

`x <= 0` is False for NaN, so a range check let `heartbeat_timeout_s: .nan` through
and the controller crashed later converting it to an int. The settings are found
by introspection (a flag whose type reads "1.5" as a float; a float field of a
config Struct), so one added later is covered without touching this file.
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw.agent import leftovers
from llmgw.agent.config import AgentConfig, AgentConfigError, parse_config
from llmgw.cli import COMMANDS
from llmgw.controller.config import build_parser as controller_parser
from llmgw.controller.config import parse_args
from llmgw.router.config import RouterConfig, parse
from llmgw.router.control.sources import ConfigWatcher
from llmgw.router.errors import RouterConfigError
from llmgw.runtime import envflags, finite
from llmgw.testing.configdoc import PROGRAMS, Program
from llmgw.up.fleet import Fleet, FleetError, load_fleet
from llmgw.wire.endpoints import EndpointInfo
from tests.unit.cli_parsers import built_parsers, walk

BAD = ("nan", "inf", "-inf")
YAML_BAD = (".nan", ".inf", "-.inf")
GOOD_ROUTER: dict[str, Any] = {"endpoints": [{"id": "a", "url": "http://a", "models": ["m"]}]}
AGENT_BASE = ["--node", "n", "--gpus", "1xH100-80G", "--state-dir", "/tmp/s"]
AGENT_BASE += ["--controller", "http://c:1", "--address", "127.0.0.1"]


# Sub-commands a program dispatches to before its own parser: `llmgw agent stop-engines`.
HIDDEN = {"agent": [[leftovers.COMMAND, "--help"]]}


def _parsers(command: str) -> list[argparse.ArgumentParser]:
    """The parsers `llmgw <command> --help` builds, and the hidden sub-commands' (ctl's
    subcommands walked too)."""
    argvs = [["--help"], *HIDDEN.get(command, [])]
    return [p for parser in built_parsers(command, argvs) for _, p in walk(parser)]


def _is_float_flag(action: argparse.Action) -> bool:
    """A flag that reads "1.5" as a float, whatever its type function is called."""
    if not action.option_strings or not callable(action.type):
        return False
    try:
        return isinstance(action.type("1.5"), float)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return False


def _float_flags() -> list[tuple[str, argparse.ArgumentParser, str]]:
    out = []
    for command in sorted(COMMANDS):
        for p in _parsers(command):
            for action in p._actions:
                if _is_float_flag(action):
                    out.append((p.prog, p, action.option_strings[-1]))
    return out


FLOAT_FLAGS = _float_flags()


def _env_cases() -> list[tuple[Program, str]]:
    return [
        (program, flag)
        for program in PROGRAMS
        for action in envflags.settable(program.build(), program.secrets)
        if _is_float_flag(action) and (flag := envflags.long_flag(action)) is not None
    ]


def _float_paths(t: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of every float field under the Struct type `t` (a tuple's item: [0])."""
    info = msgspec.inspect.type_info(t) if not isinstance(t, msgspec.inspect.Type) else t
    if isinstance(info, msgspec.inspect.FloatType):
        yield prefix
    elif isinstance(info, msgspec.inspect.UnionType):
        for sub in info.types:
            yield from _float_paths(sub, prefix)
    elif isinstance(info, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
        yield from _float_paths(info.item_type, f"{prefix}[0]")
    elif isinstance(info, msgspec.inspect.StructType):
        for f in info.fields:
            yield from _float_paths(f.type, f"{prefix}.{f.name}" if prefix else f.name)


def _set(doc: Any, path: str, value: object) -> None:
    """Set the dotted `path` ([0] a list's first item) in `doc`, making mappings on the way."""
    keys = path.replace("[0]", ".0").split(".")
    for key, after in itertools.pairwise(keys):
        doc = doc[0] if key == "0" else doc.setdefault(key, [{}] if after == "0" else {})
    doc[keys[-1]] = value


class TestFiniteHelper:
    """runtime.finite: the argparse type and the walk over a parsed config."""

    @pytest.mark.parametrize("text", BAD)
    def test_the_type_refuses_nan_and_infinity(self, text: str) -> None:
        """NaN, inf and -inf are refused with a reason argparse shows."""
        with pytest.raises(argparse.ArgumentTypeError, match="not a finite number"):
            finite.finite_float(text)

    def test_the_type_reads_a_number(self) -> None:
        """A finite number is read as float() reads it."""
        assert finite.finite_float(" 2.5 ") == 2.5

    def test_the_type_refuses_text(self) -> None:
        """Text that is no number is refused as float() refuses it."""
        with pytest.raises(argparse.ArgumentTypeError, match="not a number"):
            finite.finite_float("ten")

    def test_the_walk_names_the_first_bad_path(self) -> None:
        """A NaN deep in lists and mappings is named by its path."""
        doc = {"a": 1.0, "b": [{"c": 2.0}, {"d": math.nan}]}
        assert finite.nonfinite_path(doc) == "b[1].d"

    def test_the_walk_passes_finite_values(self) -> None:
        """Finite floats, ints, strings and bools are no problem."""
        assert finite.nonfinite_path({"a": [1, 2.5, "inf", True]}) is None

    def test_the_walk_reads_structs(self) -> None:
        """A Struct's float fields are walked like a mapping's."""
        ep = EndpointInfo(id="a", url="http://a", models=("m",), weight=math.inf)
        assert finite.nonfinite_path(RouterConfig()) is None
        assert finite.nonfinite_path(RouterConfig(endpoints=(ep,))) == "endpoints[0].weight"


class TestEveryFloatFlag:
    """Every program's float flag refuses NaN and ±inf on the command line (exit 2)."""

    @pytest.mark.parametrize("command", sorted(COMMANDS))
    def test_no_flag_takes_a_plain_float(self, command: str) -> None:
        """No flag's type is float(), which reads nan and inf."""
        plain = [
            f"{p.prog} {a.option_strings[-1]}"
            for p in _parsers(command)
            for a in p._actions
            if a.type is float
        ]
        assert plain == []

    @pytest.mark.parametrize("value", BAD)
    @pytest.mark.parametrize(
        ("prog", "parser", "flag"), FLOAT_FLAGS, ids=[f"{c[0]} {c[2]}" for c in FLOAT_FLAGS]
    )
    def test_refused_on_the_command_line(
        self,
        prog: str,
        parser: argparse.ArgumentParser,
        flag: str,
        value: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """`--flag nan` is one line naming the flag, and exit 2."""
        with pytest.raises(SystemExit) as exited:
            parser.parse_known_args([f"{flag}={value}"])
        assert exited.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert flag in err
        assert "not a finite number" in err


class TestEveryFloatVariable:
    """Every float flag's LLMGW_* variable refuses NaN and ±inf (exit 2, naming it)."""

    @pytest.mark.parametrize("value", BAD)
    @pytest.mark.parametrize(
        ("program", "flag"), _env_cases(), ids=lambda x: x.name if isinstance(x, Program) else x
    )
    def test_refused_from_the_environment(
        self, program: Program, flag: str, value: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The variable set to nan stops the program with its name."""
        name = envflags.variable(program.name, flag)
        with pytest.raises(SystemExit) as exited:
            envflags.apply(program.build(), program.name, environ={name: value})
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert f"{name}={value!r}: not a finite number" in err

    def test_the_controller_refuses_a_nan_heartbeat_timeout(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The reported case: LLMGW_CONTROLLER_HEARTBEAT_TIMEOUT_S=nan no longer starts."""
        with pytest.raises(SystemExit) as exited:
            parse_args([], {"LLMGW_CONTROLLER_HEARTBEAT_TIMEOUT_S": "nan"})
        assert exited.value.code == 2
        assert "LLMGW_CONTROLLER_HEARTBEAT_TIMEOUT_S" in capsys.readouterr().err


def _controller_keys() -> list[str]:
    p = controller_parser()
    return [a.dest for a in envflags.settable(p) if _is_float_flag(a)]


class TestControllerFile:
    """Every float key of the controller's --config file refuses .nan and ±.inf."""

    @pytest.mark.parametrize("value", YAML_BAD)
    @pytest.mark.parametrize("key", _controller_keys())
    def test_refused_in_the_file(
        self, key: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`key: .nan` is one line naming the file and key, exit 2."""
        path = tmp_path / "c.yaml"
        path.write_text(f"{key}: {value}\n")
        with pytest.raises(SystemExit) as exited:
            parse_args(["--config", str(path)], {})
        assert exited.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"{path}: {key}=" in err
        assert "not a finite number" in err


def _router_doc(path: str, value: float) -> dict[str, Any]:
    doc: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(GOOD_ROUTER))
    if path.startswith("controller."):
        doc = {"controller": {"url": "http://c"}}
    if path.startswith("tracing."):
        doc["tracing"] = {"endpoint": "http://t"}
    _set(doc, path, value)
    return doc


ROUTER_PATHS = sorted(set(_float_paths(RouterConfig)))


class TestRouterFile:
    """Every float field of the router's file, nested ones included, refuses NaN and ±inf."""

    def test_the_paths_include_nested_settings(self) -> None:
        """The introspection reaches per-endpoint weights and nested groups."""
        assert {"endpoints[0].weight", "flow.critical.max_wait_s", "breaker.cooldown_s"} <= set(
            ROUTER_PATHS
        )

    @pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
    @pytest.mark.parametrize("path", ROUTER_PATHS)
    def test_refused_at_start(self, path: str, value: float) -> None:
        """The file is refused with one line naming the setting."""
        text = msgspec.yaml.encode(_router_doc(path, value)).decode()
        with pytest.raises(RouterConfigError) as info:
            parse(text, source="r.yaml", env={})
        said = str(info.value)
        assert "\n" not in said
        assert f"r.yaml: {path}: not a finite number" in said

    def test_a_reload_is_refused_and_the_running_config_kept(self, tmp_path: Path) -> None:
        """A file rewritten with a NaN weight is refused; the router keeps what it runs."""
        path = tmp_path / "r.yaml"
        path.write_text(msgspec.yaml.encode(GOOD_ROUTER).decode())
        got: list[RouterConfig] = []
        watcher = ConfigWatcher(path, on_config=got.append)
        path.write_text(msgspec.yaml.encode(_router_doc("endpoints[0].weight", math.nan)).decode())
        watcher.request_reload()
        # The first look sees the change, the next reads the file.
        assert [watcher.tick(), watcher.tick()] == [False, False]
        assert got == []
        assert watcher.last_error is not None
        assert "endpoints[0].weight: not a finite number" in watcher.last_error


AGENT_KEYS = sorted(set(_float_paths(AgentConfig)))


class TestAgentFile:
    """Every float key of the agent's --config file refuses .nan and ±.inf."""

    @pytest.mark.parametrize("value", YAML_BAD)
    @pytest.mark.parametrize("key", AGENT_KEYS)
    def test_refused_in_the_file(self, key: str, value: str, tmp_path: Path) -> None:
        """`key: .nan` is refused naming the key, not passed on to the heartbeat loop."""
        path = tmp_path / "a.yaml"
        path.write_text(f"{key}: {value}\n")
        with pytest.raises(AgentConfigError) as info:
            parse_config([*AGENT_BASE, "--config", str(path)])
        assert f"{key}: not a finite number" in str(info.value)


FLEET_PATHS = sorted(set(_float_paths(Fleet)))


class TestFleetFile:
    """Every float of `llmgw up`'s fleet file, the router's keys in it included, refuses NaN."""

    @pytest.mark.parametrize("value", YAML_BAD)
    @pytest.mark.parametrize("path", [*FLEET_PATHS, "router.stale_after_s"])
    def test_refused(self, path: str, value: str, tmp_path: Path) -> None:
        """The fleet file is refused with one line naming the setting."""
        doc: dict[str, Any] = {
            "nodes": [{"prefix": "n", "gpus": "1xH100-80G"}],
            "models": [{"name": "m", "engine": "sim", "gpu_classes": ["H100-80G"]}],
        }
        _set(doc, path, "@")
        f = tmp_path / "f.yaml"
        f.write_text(msgspec.yaml.encode(doc).decode().replace("'@'", value))
        with pytest.raises(FleetError) as info:
            load_fleet(f)
        assert f"{f}: {path}: not a finite number" in str(info.value)
