"""Secrets (tokens) from a file or the environment, never only from the command line.

Every local user can read a process's command line (`ps`, /proc/PID/cmdline), so a
token given as `--token T` is public on that host. `resolve` takes, in order: the
`--token-file` (first line, surrounding whitespace dropped), the flag (with a warning
on stderr), then the environment variable. A file that is missing, unreadable or
empty is an error the person must fix, never a silent "no token".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TextIO

from llmgw.runtime import textfile


class SecretError(ValueError):
    """The secret's file cannot be used; the message says which and why."""


def read_secret_file(path: str) -> str:
    try:
        text = textfile.read(path, max_bytes=textfile.SECRET_MAX_BYTES)
    except textfile.TextFileError as exc:
        raise SecretError(f"{path}: {exc}") from None
    lines = text.strip().splitlines()
    value = lines[0].strip() if lines else ""
    if not value:
        raise SecretError(f"{path} is empty")
    return value


def resolve(
    *,
    program: str,
    flag: str,
    value: str | None,
    file: str | None,
    env_var: str,
    env: Mapping[str, str] = os.environ,
    stderr: TextIO | None = None,
) -> str | None:
    """The secret from `file`, else `value` (warned about), else `env[env_var]`; None if none."""
    if file:
        return read_secret_file(file)
    if value:
        out = stderr if stderr is not None else sys.stderr
        out.write(
            f"llmgw {program}: warning: {flag} on the command line is visible to every "
            f"local user (ps); use {flag}-file or {env_var}\n"
        )
        return value
    return env.get(env_var) or None
