"""One engine's command line as read from its source, and the check of an argv against it.

Values are checked where the reading is exact: a flag whose field is typed plain
`int` (each value must parse as one; vLLM's human-readable ints like "1K"
excepted) or only `Literal[...]` (each value must be one of them; SGLang's
`Arg(choices=…)` too). What this does not check: other values (paths, JSON
beyond vLLM's KV-events keys, custom argparse types and actions), the engines'
cross-field validation, and flags that the engines add outside the files read.
argparse accepts unambiguous prefixes of long flags (`--tp` for `--tp-size`);
the check does not, since a new upstream flag can make a prefix ambiguous at any
release.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Arity = Literal["none", "one", "optional", "many", "any"]

# Bumped when the reading rules change: a cli.json of another reader is read
# again from the kept sources (no download, unless the kept sources lack a file).
READER = 2


class EngineFlagsError(Exception):
    """The sources could not be fetched or read (the message says which and why)."""


@dataclass(frozen=True, slots=True)
class Cli:
    """One engine's command line: its long flags and how many values each takes."""

    engine: str
    version: str
    flags: dict[str, Arity]
    # Positional arguments before the flags (vLLM's optional model tag).
    positionals: int = 0
    # vLLM's KVEventsConfig fields, the keys `--kv-events-config` may carry.
    kv_events_fields: frozenset[str] = frozenset()
    # Flags whose every value must be an integer (argparse `type=int`).
    ints: frozenset[str] = frozenset()
    # Flags whose values must be one of these (argparse `choices`, from a Literal).
    choices: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "engine": self.engine,
                "version": self.version,
                "flags": self.flags,
                "positionals": self.positionals,
                "kv_events_fields": sorted(self.kv_events_fields),
                "ints": sorted(self.ints),
                "choices": self.choices,
                "reader": READER,
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Cli:
        raw = json.loads(text)
        if raw.get("reader") != READER:
            raise ValueError(f"read by reader {raw.get('reader')}, this is {READER}")
        return cls(
            engine=raw["engine"],
            version=raw["version"],
            flags=dict(raw["flags"]),
            positionals=int(raw["positionals"]),
            kv_events_fields=frozenset(raw["kv_events_fields"]),
            ints=frozenset(raw["ints"]),
            choices={k: list(v) for k, v in raw["choices"].items()},
        )


def check(cli: Cli, argv: Sequence[str]) -> list[str]:
    """Each way `argv` (the engine's arguments, after the command) breaks `cli`.

    A flag must exist exactly (no argparse prefix matching) and get as many
    values as it takes; leading positionals are counted; `--kv-events-config`'s
    JSON may only carry KVEventsConfig's fields.
    """
    problems: list[str] = []
    i = 0
    while i < len(argv) and not argv[i].startswith("-"):
        i += 1
    if i > cli.positionals:
        problems.append(f"{i} positional argument(s), {cli.engine} takes {cli.positionals}")
    while i < len(argv):
        flag, _, inline = argv[i].partition("=")
        values = [inline] if inline else []
        i += 1
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        arity = cli.flags.get(flag)
        if arity is None:
            problems.append(f"{flag}: not a {cli.engine} {cli.version} flag")
            continue
        if not _arity_ok(arity, len(values)):
            problems.append(f"{flag}: given {len(values)} value(s), it takes {arity}")
        for value in values:
            if flag in cli.ints and not _is_int(value):
                problems.append(f"{flag}: {value!r} is not an integer")
            if flag in cli.choices and value not in cli.choices[flag]:
                problems.append(f"{flag}: {value!r} is not one of {cli.choices[flag]}")
        if flag == "--kv-events-config" and values and cli.kv_events_fields:
            extra = set(json.loads(values[0])) - cli.kv_events_fields
            if extra:
                problems.append(
                    f"--kv-events-config: {sorted(extra)} are not KVEventsConfig fields"
                )
    return problems


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


def _arity_ok(arity: Arity, n: int) -> bool:
    return {
        "none": n == 0,
        "one": n == 1,
        "optional": n <= 1,
        "many": n >= 1,
        "any": True,
    }[arity]
