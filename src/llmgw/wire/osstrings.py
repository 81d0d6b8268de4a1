"""Strings handed to the OS: an engine's command line, its environment, and paths.

Three rules, each written once and used wherever such a string comes in (the controller's
apply, `ctl apply`), never by the wire types stored records are decoded with:

- A NUL in any of them: `execve` takes C strings, so the OS cannot pass one (Python
  refuses it at spawn with "embedded null byte": every replica of the spec failed to
  start, and restarted forever), and PostgreSQL's text cannot hold one.
- Any control character (U+0000 to U+001F, U+007F) in a path: no real path holds one,
  and each would reach the engines' logs and the operator's terminal. Arguments and
  environment values are free text, not paths: a chat template or a PEM certificate
  holds newlines and tabs, which the OS passes as they are.
- Sizes the kernel refuses (`MAX_STRING_BYTES`, `MAX_LAUNCH_BYTES`): `execve` fails with
  E2BIG, and every replica of the spec failed to start, as with a NUL.
"""

from __future__ import annotations


def nul_at(text: str) -> int | None:
    """Index of the first NUL in `text`; None when it holds none."""
    i = text.find("\x00")
    return None if i < 0 else i


def control_at(text: str) -> int | None:
    """Index of the first control character (U+0000 to U+001F, U+007F) in `text`; None
    when it holds none."""
    for i, c in enumerate(text):
        if c < " " or c == "\x7f":
            return i
    return None


def char_at(text: str, i: int) -> str:
    """The character at `i` for a refusal, by code point (never raw: it is a control
    character) and position: `U+001B at character 3`."""
    return f"U+{ord(text[i]):04X} at character {i}"


# Linux's MAX_ARG_STRLEN less one: execve refuses (E2BIG) any one argument, or one
# `NAME=value` of the environment, of more bytes than this (with its NUL), so a longer
# one in a spec failed every start of every replica, and the replica was started again.
MAX_STRING_BYTES = 128 * 1024 - 1
# What a spec's `args` and `env` may take together, in bytes with each string's NUL.
# Linux's ARG_MAX (a quarter of the stack limit, 2 MiB by default) bounds the command
# line and the environment together, the agent's own environment and the flags it
# renders included: half of the default is left to those.
MAX_LAUNCH_BYTES = 1024 * 1024


def os_bytes(text: str) -> int:
    """Bytes `text` takes in an execve argument or environment block, its NUL included."""
    return len(text.encode("utf-8", "surrogatepass")) + 1
