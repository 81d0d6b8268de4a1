"""The argparse parsers a program's `main` builds, for tests that read every flag.

`main(argv)` runs with argparse's parse step recording the parser it was called on
and stopping there, so nothing starts; ctl's subcommands are reached by `walk`.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator, Sequence

import pytest

from llmgw.cli import COMMANDS


def built_parsers(
    command: str, argvs: Sequence[list[str]] = (["--help"],)
) -> list[argparse.ArgumentParser]:
    """The parsers `llmgw <command>` parses with, one `main(argv)` per argv in `argvs`."""
    seen: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_known_args

    def record(self: argparse.ArgumentParser, *a: object, **kw: object) -> object:
        seen.append(self)
        raise SystemExit(0)

    module = importlib.import_module(COMMANDS[command][0])
    argparse.ArgumentParser.parse_known_args = record  # type: ignore[method-assign,assignment]
    try:
        for argv in argvs:
            with pytest.raises(SystemExit):
                module.main(argv)
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    assert seen, f"llmgw {command} parsed no arguments"
    return seen


def walk(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """`parser` and every subcommand's parser below it, each with its `prog`."""
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from walk(sub)
