"""`--version` on every program: one flag, one line, the same everywhere.

`llmgw --version` and `llmgw <program> --version` print `llmgw[ <program>] <version>`
and exit 0, before anything else runs (no config read, no port bound), so a unit
file or an installer can ask a binary what it is without side effects.
"""

from __future__ import annotations

import argparse

from llmgw import __version__


def line(program: str | None = None) -> str:
    """What `--version` prints: `llmgw 0.1.0`, or `llmgw router 0.1.0`."""
    return f"llmgw {program} {__version__}" if program else f"llmgw {__version__}"


def add_version_argument(parser: argparse.ArgumentParser, program: str) -> None:
    parser.add_argument(
        "-V",
        "--version",
        action="version",
        version=line(program),
        help="print the version and exit",
    )
