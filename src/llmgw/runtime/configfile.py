"""A program's flags from a YAML file: `llmgw controller --config FILE`.

The file is a mapping whose keys are the long flags' names, with `-` or `_`
(`heartbeat_timeout_s: 20`); a switch takes true/false, a repeatable flag a list.
A mapping stands for flags that share its key as a prefix: `tracing: {endpoint: U}`
is `tracing_endpoint: U`, so a group of settings reads as it does in the router's file.
Values are checked as the flag's own are. Its settings are defaults under the
environment's (envflags.py) and the command line's, so the order is: command
line, `LLMGW_<PROGRAM>_<FLAG>`, the file, the built-in default. The file itself
may be named by `LLMGW_<PROGRAM>_CONFIG`.

A key no flag has is an error, as an unknown flag is; so is a secret flag's key
(`token:`): secrets come from their `*_file` key or their variable, never from a
file that is read as configuration and often copied around.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from llmgw.runtime import envflags, safeyaml, textfile

FLAG = "--config"


class ConfigFileError(ValueError):
    """The file cannot be read, or a key or value in it is wrong; the message says where."""


def load(path: str) -> dict[str, Any]:
    """The file's mapping (empty for an empty file)."""
    try:
        doc = safeyaml.load(textfile.read(path))
    except (textfile.TextFileError, safeyaml.YamlError) as exc:
        raise ConfigFileError(f"{path}: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigFileError(f"{path}: expected a mapping of settings")
    return {str(k): v for k, v in doc.items()}


def flatten(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`{group: {key: v}}` as `{group_key: v}` (one level: no flag nests deeper)."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            for sub, v in value.items():
                out[f"{key}_{sub!s}"] = v
        else:
            out[key] = value
    return out


def apply(
    parser: argparse.ArgumentParser,
    doc: Mapping[str, Any],
    *,
    source: str,
    program: str,
    secrets: Collection[str] = (),
    keep: Collection[str] = (),
) -> None:
    """Set flag defaults from `doc`, but not those of the dests in `keep` (the
    environment set them); ConfigFileError names the first bad key."""
    actions = {a.dest: a for a in envflags.settable(parser)}
    for key, value in flatten(doc).items():
        dest = key.replace("-", "_")
        where = f"{source}: {key}"
        if dest in secrets:
            flag = "--" + dest.replace("_", "-")
            raise ConfigFileError(
                f"{where}: a secret does not belong in the config file; name its file with "
                f"{dest}_file, or set {envflags.variable(program, flag)}"
            )
        action = actions.get(dest)
        if action is None or dest == "config":
            raise ConfigFileError(f"{where}: no such setting (llmgw {program} --help)")
        if value is None:
            raise ConfigFileError(f"{where}: no value")
        try:
            converted = envflags.convert(action, value, where=where)
        except envflags.EnvFlagError as exc:
            raise ConfigFileError(str(exc)) from None
        if dest not in keep:
            envflags.set_default(action, converted)


def parse(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    program: str,
    *,
    environ: Mapping[str, str] | None = None,
    secrets: Collection[str] = (),
    known: Collection[str] = (),
) -> argparse.Namespace:
    """Parse `argv` over the environment's defaults over the config file's.

    Parsed twice: once to learn which file `--config` (or its variable) names, and
    again over that file's settings. The same parser both times, so `--config` is
    found as every other flag is (`--config=F`, an abbreviation)."""
    env = os.environ if environ is None else environ
    envflags.apply(parser, program, environ=env, secrets=secrets, known=known)
    ns = parser.parse_args(argv)
    path = getattr(ns, FLAG.lstrip("-"), None)
    if path:
        from_env = {
            a.dest
            for a in envflags.settable(parser, secrets)
            if envflags.variable(program, str(envflags.long_flag(a))) in env
        }
        try:
            doc = load(str(path))
            apply(parser, doc, source=str(path), program=program, secrets=secrets, keep=from_env)
        except ConfigFileError as exc:
            parser.error(str(exc))
        ns = parser.parse_args(argv)
    envflags.drop_defaults_of_repeated(parser, ns)
    return ns
