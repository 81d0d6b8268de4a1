"""Every flag of a program also from the environment: `LLMGW_<PROGRAM>_<FLAG>`.

`--heartbeat-timeout-s` of `llmgw controller` is `LLMGW_CONTROLLER_HEARTBEAT_TIMEOUT_S`;
of `llmgw sim-engine`, `--port` is `LLMGW_SIM_ENGINE_PORT`. A variable that is set
becomes the flag's default, so the order is: the command line, then the
environment, then a config file (configfile.py), then the built-in default. Values
are what the flag takes, converted and checked the same way; a switch
(`store_true`) takes 1/true/yes/on or 0/false/no/off; a repeatable flag or one of
several values takes them comma-separated. A bad value stops the program with a
line naming the variable, as a bad flag would.

Not read this way: flags hidden from `--help`, `--help` and `--version`,
`--log-format` (every program reads `LLMGW_LOG_FORMAT`: logs.py), and the secret
flags a program names in `secrets`: it reads their variables itself, through
secretfile.resolve, so a token from the environment is never mistaken for one
typed on a command line.

A set `LLMGW_<PROGRAM>_*` variable that is no flag's and not among the others
the program reads (`known`) is warned about on stderr: a misspelt name would
otherwise be ignored without a word.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

PREFIX = "LLMGW_"
# Flags read elsewhere, by every program alike.
SHARED = frozenset({"log_format"})
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})


class EnvFlagError(ValueError):
    """A variable's value is not what its flag takes; the message names both."""


def variable(program: str, flag: str) -> str:
    """`LLMGW_<PROGRAM>_<FLAG>` for `program` ("sim-engine") and `flag` ("--port")."""
    return PREFIX + f"{program}_{flag.lstrip('-')}".upper().replace("-", "_")


def long_flag(action: argparse.Action) -> str | None:
    longs = [o for o in action.option_strings if o.startswith("--")]
    return longs[0] if longs else None


def settable(
    parser: argparse.ArgumentParser, secrets: Collection[str] = ()
) -> Iterator[argparse.Action]:
    """The actions whose default may come from outside the command line."""
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if action.help == argparse.SUPPRESS or long_flag(action) is None:
            continue
        if action.dest in SHARED or action.dest in secrets:
            continue
        yield action


def is_switch(action: argparse.Action) -> bool:
    return isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction)


def is_many(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*")


def convert(action: argparse.Action, raw: Any, *, where: str) -> Any:
    """`raw` (a string, or from a file a YAML scalar or list) as the flag's value."""
    if is_switch(action):
        if isinstance(raw, bool):
            given = raw
        elif str(raw).strip().lower() in TRUE | FALSE:
            given = str(raw).strip().lower() in TRUE
        else:
            raise EnvFlagError(f"{where}={raw!r}: expected 1/true/yes/on or 0/false/no/off")
        return given if isinstance(action, argparse._StoreTrueAction) else not given
    if is_many(action):
        items = raw if isinstance(raw, list) else [s.strip() for s in str(raw).split(",")]
        return [_one(action, item, where) for item in items if str(item) != ""]
    return _one(action, raw, where)


def _one(action: argparse.Action, raw: Any, where: str) -> Any:
    text = str(raw)
    try:
        value = action.type(text) if callable(action.type) else text
    except argparse.ArgumentTypeError as exc:
        # The type's own reason, as argparse shows it for the flag (runtime.finite).
        raise EnvFlagError(f"{where}={text!r}: {exc}") from None
    except (ValueError, TypeError) as exc:
        kind = getattr(action.type, "__name__", "value")
        raise EnvFlagError(f"{where}={text!r}: not a valid {kind} ({exc})") from None
    if action.choices is not None and value not in action.choices:
        raise EnvFlagError(
            f"{where}={text!r}: expected one of {', '.join(map(str, action.choices))}"
        )
    return value


def set_default(action: argparse.Action, value: Any) -> None:
    action.default = value
    # Given outside the command line, a required flag is no longer missing.
    action.required = False


def drop_defaults_of_repeated(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """A repeatable flag given on the command line replaces its default, not extends it.

    argparse appends command-line values to a copy of the default; the default's
    items come first, so they are cut off when the command line added any."""
    for action in parser._actions:
        if not isinstance(action, argparse._AppendAction) or not isinstance(action.default, list):
            continue
        value = getattr(ns, action.dest, None)
        if isinstance(value, list) and len(value) > len(action.default):
            setattr(ns, action.dest, value[len(action.default) :])


def parse(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    program: str,
    *,
    environ: Mapping[str, str] | None = None,
    secrets: Collection[str] = (),
    known: Collection[str] = (),
) -> argparse.Namespace:
    """`parser.parse_args(argv)` over the environment's defaults (`apply`)."""
    apply(parser, program, environ=environ, secrets=secrets, known=known)
    ns = parser.parse_args(argv)
    drop_defaults_of_repeated(parser, ns)
    return ns


def apply(
    parser: argparse.ArgumentParser,
    program: str,
    *,
    environ: Mapping[str, str] | None = None,
    secrets: Collection[str] = (),
    known: Collection[str] = (),
) -> list[str]:
    """Set flag defaults from `environ` (default os.environ); the variables it read.

    A bad value is `parser.error` (exit 2, one line naming the variable)."""
    env = os.environ if environ is None else environ
    used: list[str] = []
    for action in settable(parser, secrets):
        flag = long_flag(action)
        assert flag is not None  # settable() yields only long flags
        name = variable(program, flag)
        if name not in env:
            continue
        try:
            set_default(action, convert(action, env[name], where=name))
        except EnvFlagError as exc:
            parser.error(str(exc))
        used.append(name)
    for name in unknown(parser, program, env, known):
        sys.stderr.write(
            f"llmgw {program}: warning: {name} is set but is no setting of llmgw {program} "
            "(docs/configuration.md lists them)\n"
        )
    return used


def unknown(
    parser: argparse.ArgumentParser,
    program: str,
    environ: Mapping[str, str],
    known: Collection[str] = (),
) -> list[str]:
    """The set `LLMGW_<PROGRAM>_*` variables no flag (secret ones included) or `known` names."""
    flags = [flag for a in parser._actions if (flag := long_flag(a)) is not None]
    ours = {variable(program, f) for f in flags} | set(known)
    prefix = variable(program, "")
    return sorted(n for n in environ if n.startswith(prefix) and n not in ours)
