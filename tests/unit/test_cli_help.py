"""Every flag of every program says what it does, and shows its default.

Each program's `main(["--help"])` is run with argparse's parse step recording
the parser it was called on; ctl's subcommands are walked too. A flag with no
help text, or whose default is not shown in `--help`, fails here.
"""

from __future__ import annotations

import argparse

import pytest

from llmgw.cli import COMMANDS
from tests.unit.cli_parsers import built_parsers, walk


def _shown_default(action: argparse.Action) -> bool:
    d = action.default
    return (
        d is None
        or d is False
        or d is argparse.SUPPRESS
        or d in ([], "", ())
        or action.required
        or not action.option_strings
    )


class TestFlagHelp:
    """Every program's flags have help text, defaults and the log format."""

    @pytest.mark.parametrize("command", sorted(COMMANDS))
    def test_every_flag_has_help_and_shows_its_default(self, command: str) -> None:
        """Every flag has help and shows its default."""
        problems: list[str] = []
        for parser in built_parsers(command):
            for prog, p in walk(parser):
                text = p.format_help()
                for action in p._actions:
                    if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                        continue
                    name = "/".join(action.option_strings) or action.dest
                    if action.help == argparse.SUPPRESS:
                        continue  # hidden on purpose (a vLLM-compatible alias, say)
                    if not (action.help or "").strip():
                        problems.append(f"{prog} {name}: no help")
                        continue
                    if _shown_default(action):
                        continue
                    formatted = p._get_formatter()._expand_help(action)
                    if "default" not in formatted:
                        problems.append(f"{prog} {name}: default {action.default!r} not shown")
                assert text  # formats without error
        assert not problems, "\n".join(problems)

    @pytest.mark.parametrize("command", ["agent", "controller", "router", "sim-engine", "up"])
    def test_every_long_running_program_lists_log_format(self, command: str) -> None:
        """`--log-format` is taken before each program's own parser; `--help` still tells of it."""
        texts = [p.format_help() for parser in built_parsers(command) for _, p in walk(parser)]
        assert any("--log-format" in t and "json" in t for t in texts), command
