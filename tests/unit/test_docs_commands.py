"""Every `llmgw` command the docs and the units show names a real program, subcommand and flag.

Scanned: README.md, docs/*.md and the `ExecStart=` lines of deploy/systemd/*.service.
A command is an inline code span that starts with `llmgw ` or `ctl ` (not a message
such as `llmgw agent: …`), or a line of a shell or plain code block that runs `llmgw`
(`$ `, `sudo ` and a path before it allowed; in a console block only `$ ` lines).
Its words are matched against the parsers each program's `main` builds
(tests/unit/cli_parsers.py): the program, then any subcommands, then every `--flag`
must be one that parser (or, for ctl, ctl's own) takes. Placeholders (NODE, `…`,
`[…]`) are not checked.
"""

from __future__ import annotations

import argparse
import re
from functools import cache
from pathlib import Path

import pytest

from llmgw.cli import COMMANDS
from tests.unit.cli_parsers import built_parsers, walk

ROOT = Path(__file__).resolve().parents[2]
SPAN = re.compile(r"`((?:/opt/llmgw/bin/)?llmgw [^`]+|ctl [^`]+)`")
SHELL_LINE = re.compile(r"^\s*(?:\$\s+|sudo\s+)?(?:\S*/)?llmgw\s+(.*)$")
SHELL = ("sh", "bash", "shell", "")
WORD = re.compile(r"[a-z][a-z-]*")
# Options every long-running program takes before its own parser (runtime.logs, .version).
SHARED = frozenset({"--log-format", "-V", "--version", "-h", "--help"})


@cache
def parsers() -> dict[str, argparse.ArgumentParser]:
    """`llmgw PROGRAM [SUB…]` → its parser, for every program and subcommand."""
    out: dict[str, argparse.ArgumentParser] = {}
    for command in COMMANDS:
        argvs = [["--help"], ["stop-engines", "--help"]] if command == "agent" else [["--help"]]
        for parser in built_parsers(command, argvs):
            for prog, p in walk(parser):
                out[prog] = p
    return out


def _options(prog: str) -> set[str]:
    found = {o for a in parsers()[prog]._actions for o in a.option_strings}
    if prog.startswith("llmgw ctl "):
        found |= _options("llmgw ctl")
    return found | SHARED


def problems(command: str) -> list[str]:
    """What in `command` (the words after `llmgw`) no parser knows."""
    words = re.sub(r"[\[\]|…]", " ", command).split()
    if not words or words[0].startswith("-"):
        return []
    if words[0] not in COMMANDS:
        return [f"no program {words[0]!r}"]
    prog, out = f"llmgw {words[0]}", []
    for i, word in enumerate(words[1:]):
        if f"{prog} {word}" in parsers():  # a subcommand, after the options before it
            prog = f"{prog} {word}"
        elif words[i] == prog.rsplit(" ", 1)[1]:
            # Right after the program or subcommand: a lower-case word must be one of its own.
            has_subcommands = any(f.startswith(prog + " ") for f in parsers())
            if has_subcommands and WORD.fullmatch(word):
                out.append(f"{prog}: no subcommand {word!r}")
    for word in words[1:]:
        flag = word.split("=", 1)[0].rstrip(",.;:)")
        if flag.startswith("--") and len(flag) > 2 and flag not in _options(prog):
            out.append(f"{prog}: no flag {flag}")
    return out


def commands() -> list[tuple[str, str]]:
    """(where, the words after `llmgw`) for each command shown."""
    out = []
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        name = page.relative_to(ROOT).as_posix()
        fence: str | None = None  # the open code block's language ("" for none)
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.strip().startswith("```"):
                fence = line.strip()[3:].strip() if fence is None else None
                continue
            if fence is not None:
                m = SHELL_LINE.match(line)
                # In a console block only a `$ ` line is a command; the rest is output.
                shell = fence in SHELL or (fence == "console" and line.lstrip()[:2] == "$ ")
                if m is not None and shell:
                    out.append((f"{name}:{n}", m.group(1).replace("\\", " ")))
                continue
            for span in SPAN.findall(line):
                words = span.split(None, 1)
                if words[0] == "ctl":  # `ctl status`: llmgw's ctl, as the docs shorten it
                    words = ["llmgw", span]
                if len(words) == 2 and not words[1].split()[0].endswith(":"):
                    out.append((f"{name}:{n}", words[1]))
    for unit in sorted((ROOT / "deploy" / "systemd").glob("*.service")):
        text = unit.read_text().replace("\\\n", " ")
        for line in re.findall(r"^ExecStart=\S*llmgw (.*)$", text, re.M):
            out.append((f"deploy/systemd/{unit.name}", line))
    return out


class TestDocsCommands:
    """The commands docs/, README.md and the units show are ones llmgw takes."""

    def test_commands_are_found(self) -> None:
        """The scan sees the units' command lines and the docs' commands."""
        found = commands()
        assert len(found) > 100
        assert any(w.startswith("deploy/systemd/llmgw-agent") for w, _ in found)

    def test_every_command_is_real(self) -> None:
        """Each program, subcommand and flag shown exists."""
        bad = [f"{where}: {p}" for where, cmd in commands() for p in problems(cmd)]
        assert bad == []

    @pytest.mark.parametrize(
        ("command", "expected"),
        [
            ("agent leftovers", ["llmgw agent: no subcommand 'leftovers'"]),
            ("ctl drian n1", ["llmgw ctl: no subcommand 'drian'"]),
            ("controller --tokenfile f", ["llmgw controller: no flag --tokenfile"]),
            (
                "ctl keys create --team t --controler U",
                ["llmgw ctl keys create: no flag --controler"],
            ),
            ("ctl --controller URL drain NODE --grace-s 5", []),
            ("agent stop-engines NODE=DIR", []),
        ],
    )
    def test_a_wrong_command_is_reported(self, command: str, expected: list[str]) -> None:
        """The check can fail: an unknown subcommand or flag is named."""
        assert problems(command) == expected
