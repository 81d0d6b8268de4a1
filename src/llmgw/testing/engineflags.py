"""The flags vLLM's and SGLang's real command lines accept, read from their released source.

Neither engine runs here (both need a GPU), and neither argument parser can be
imported without the engine's own dependencies: both build the parser inside
packages that import torch and much more at import time (tried with stubbed
modules: vLLM's `vllm.config` pulls in its model executor and distributed
layers, SGLang's `server_args` its runtime utilities). So the parsers are read
statically instead, from the Python files of the pinned release's wheel, by the
same rules the engines use to build them:

vLLM (`vllm serve`, vllm/entrypoints/common/cli_args.py `make_arg_parser`):
every `add_argument("--flag", …)` in that file and in vllm/engine/arg_utils.py
(EngineArgs and AsyncEngineArgs), plus one `--field-name` per field of the
frontend dataclasses (`BaseFrontendArgs` and its subclasses), which
`add_cli_args` registers in a loop. A flag spread from `get_kwargs(SomeConfig)`
takes its arity from the config field's annotation, as vLLM's `_compute_kwargs`
does: `bool` → no value (and a `--no-` twin), `bool | str | None` → an optional
value, a list, tuple or set → one or more values, else one value.

SGLang (`python -m sglang.launch_server`, sglang/srt/server_args.py): one flag
per `A[T, "help"]`/`A[T, Arg(…)]` field of the namespace classes listed in
`_INPUT_NAMESPACES` (arg_groups/fields/*.py), named `--field-name` unless
`Arg(cli_name=…)`, plus `Arg(aliases=…)`, skipping `Arg(no_cli=True)`, as
`add_cli_args_from_dataclass` does; plus the `add_argument` calls in
`ServerArgs.add_cli_args`. `bool` → no value, a list → one or more values.

Values are checked where the reading is exact: a field typed plain `int` (each
value must parse as one; vLLM's human-readable ints like "1K" excepted) or only
`Literal[...]` (each value must be one of them; SGLang's `Arg(choices=…)` too).
What this does not check: other values (paths, JSON beyond vLLM's KV-events
keys, custom argparse types and actions), the engines' cross-field validation,
and flags that the engines add outside these files. argparse
accepts unambiguous prefixes of long flags (`--tp` for `--tp-size`); the check
does not, since a new upstream flag can make a prefix ambiguous at any release.

`python -m llmgw.testing.engineflags` fetches the pinned wheels with pip (no
dependencies, nothing built), keeps only the parser's source files and the
extracted flags under ${XDG_CACHE_HOME:-~/.cache}/llmgw/engine-flags/<name>-<version>/,
and prints that folder; a second run finds them cached. tests/integration/
test_engine_flags.py checks every command line the agent's templates render.
"""

from __future__ import annotations

import ast
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Arity = Literal["none", "one", "optional", "many", "any"]

# The releases checked; a bump is a one-line change and a test run.
PINNED: dict[str, str] = {"vllm": "0.33.0", "sglang": "0.5.23"}
# Bumped when the reading rules change: a cli.json of another reader is read
# again from the kept sources (no download, unless the kept sources lack a file).
READER = 2

# The wheel members each extractor reads (prefixes of paths inside the wheel).
_SOURCES: dict[str, tuple[str, ...]] = {
    "vllm": (
        "vllm/engine/arg_utils.py",
        "vllm/entrypoints/common/cli_args.py",
        "vllm/config/",
        # The sleep-mode routes, their gate and the API key's reach (enginesleep.py).
        "vllm/entrypoints/serve/dev/sleep/api_router.py",
        "vllm/entrypoints/serve/middleware/authenticate.py",
        "vllm/entrypoints/launchers/api_server/routers.py",
        "vllm/envs.py",
    ),
    "sglang": ("sglang/srt/server_args.py", "sglang/srt/arg_groups/"),
}


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


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmgw" / "engine-flags"


def cached(engine: str, version: str | None = None) -> Cli | None:
    """The extracted flags of a fetched release, or None when not fetched yet."""
    version = version or PINNED[engine]
    path = cache_root() / f"{engine}-{version}" / "cli.json"
    try:
        return Cli.from_json(path.read_text())
    except (OSError, ValueError, KeyError):
        return None  # not fetched, cut short or read by older rules: fetch() again


def fetch(engine: str, version: str | None = None, *, python: str = sys.executable) -> Cli:
    """The release's flags, from the cache or from its wheel (pip download, no deps).

    Keeps the parser's source files next to cli.json (a few MB) and drops the
    wheel; with those sources kept, a new reader (READER) reads them again
    without a download. One fetch at a time per release (a lock file), so two
    test runs starting together share one download.
    """
    version = version or PINNED[engine]
    folder = cache_root() / f"{engine}-{version}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hit = cached(engine, version)
        if hit is not None:
            return hit
        src = folder / "src"
        try:
            lacking = [p for p in _SOURCES[engine] if p.endswith(".py") and not (src / p).exists()]
            if lacking:  # kept from before a file was added to _SOURCES
                raise EngineFlagsError(f"kept sources lack {lacking}")
            cli = extract(engine, version, src)
        except EngineFlagsError:
            with tempfile.TemporaryDirectory(prefix="llmgw-engine-flags-") as tmp:
                wheel = _download(engine, version, Path(tmp), python)
                # Unpacked beside, then renamed: a cut-short run leaves no half tree.
                part = folder / "src.part"
                shutil.rmtree(part, ignore_errors=True)
                _unpack(wheel, _SOURCES[engine], part)
                shutil.rmtree(src, ignore_errors=True)
                part.rename(src)
            cli = extract(engine, version, src)
        (folder / "cli.json.tmp").write_text(cli.to_json())
        (folder / "cli.json.tmp").replace(folder / "cli.json")
        return cli


def _download(engine: str, version: str, into: Path, python: str) -> Path:
    # A wheel, not the sdist: pip cannot download an sdist without preparing its
    # metadata, which for vLLM installs its build dependencies (torch, GBs).
    cmd = [
        python,
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "--no-cache-dir",
        # Without a network pip gives up in about a minute, not five.
        "--retries",
        "1",
        "--timeout",
        "20",
        "--no-deps",
        "--only-binary",
        ":all:",
        f"{engine}=={version}",
        "-d",
        str(into),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise EngineFlagsError(
            f"pip download {engine}=={version} failed (exit {done.returncode}): " + " / ".join(tail)
        )
    return wheels[0]


def _unpack(wheel: Path, prefixes: Sequence[str], into: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".py") and n.startswith(tuple(prefixes))]
        for name in names:
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(name))
    missing = [p for p in prefixes if not any(n.startswith(p) for n in names)]
    if missing:
        raise EngineFlagsError(f"{wheel.name} has none of {missing} (the engine moved its parser)")


def extract(engine: str, version: str, src: Path) -> Cli:
    """Flags from the unpacked sources (module docstring: the rules per engine)."""
    if engine == "vllm":
        return _vllm(version, src)
    if engine == "sglang":
        return _sglang(version, src)
    raise EngineFlagsError(f"no extractor for engine {engine!r}")


# ---------------------------------------------------------------- parsing helpers


def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError) as exc:
        raise EngineFlagsError(f"cannot read {path}: {exc}") from exc


def _classes(trees: Iterable[ast.Module]) -> dict[str, ast.ClassDef]:
    out: dict[str, ast.ClassDef] = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, node)
    return out


def _fields(cls: ast.ClassDef) -> Iterator[tuple[str, ast.expr]]:
    """(name, annotation) of each annotated field in a class body."""
    for node in cls.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and not node.target.id.startswith("_")
        ):
            yield node.target.id, node.annotation


def _dashed(name: str) -> str:
    return "--" + name.replace("_", "-")


def _str_const(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _add_argument_calls(tree: ast.AST) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            yield node


def _union(annotation: ast.expr) -> list[ast.expr]:
    """`A | B | None` (or `Optional[A]`, parenthesised or not) → [A, B, None]."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return [*_union(annotation.left), *_union(annotation.right)]
    if (
        isinstance(annotation, ast.Subscript)
        and isinstance(annotation.value, ast.Name)
        and annotation.value.id == "Optional"
    ):
        return [*_union(annotation.slice), ast.Constant(None)]
    return [annotation]


def _is_none(node: ast.expr) -> bool:
    return (isinstance(node, ast.Constant) and node.value is None) or (
        isinstance(node, ast.Name) and node.id == "None"
    )


def _literal_options(node: ast.expr, aliases: dict[str, ast.expr]) -> list[str] | None:
    """`Literal["a", "b"]`, or a name bound to one → ["a", "b"]; else None."""
    if isinstance(node, ast.Name) and node.id in aliases:
        node = aliases[node.id]
    if not (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Literal"
    ):
        return None
    elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if not all(isinstance(e, ast.Constant) for e in elts):
        return None
    return [str(e.value) for e in elts if isinstance(e, ast.Constant)]


def _literal_aliases(trees: Iterable[ast.Module]) -> dict[str, ast.expr]:
    """Module-level `Name = Literal[...]` (or `Name: TypeAlias = ...`) bindings."""
    out: dict[str, ast.expr] = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if isinstance(target, ast.Name):
                out[target.id] = value
    return out


def _value_rule(
    parts: list[ast.expr], aliases: dict[str, ast.expr]
) -> tuple[Literal["int"], None] | tuple[Literal["choices"], list[str]] | None:
    """An int-only or Literal-only type (None aside) → the value rule argparse gets."""
    real = [p for p in parts if not _is_none(p)]
    if len(real) == 1 and isinstance(real[0], ast.Name) and real[0].id == "int":
        return "int", None
    options = [_literal_options(p, aliases) for p in real]
    if real and all(o is not None for o in options):
        return "choices", sorted({v for o in options if o is not None for v in o})
    return None


def _typed_int(call: ast.Call) -> bool:
    """`add_argument(..., type=int)` without an action or nargs of its own."""
    return _action_arity(call) is None and any(
        kw.arg == "type" and isinstance(kw.value, ast.Name) and kw.value.id == "int"
        for kw in call.keywords
    )


def _action_arity(call: ast.Call) -> Arity | None:
    """The arity an explicit action/nargs keyword gives, or None when there is none."""
    for kw in call.keywords:
        if kw.arg == "action":
            action = _str_const(kw.value)
            if action in ("store_true", "store_false", "store_const", "count"):
                return "none"
            if action in ("store", "append"):
                return "one"
            if isinstance(kw.value, ast.Attribute) and kw.value.attr == "BooleanOptionalAction":
                return "none"
            return "any"  # a custom Action class: its arity is its own
        if kw.arg == "nargs":
            nargs = _str_const(kw.value)
            if nargs in ("+", "*"):
                return "many"
            if nargs == "?":
                return "optional"
            return "any"
    return None


# ---------------------------------------------------------------------- vLLM


def _vllm_arity(annotation: ast.expr) -> Arity:
    """What vLLM's `_compute_kwargs` makes of a config field's type (docstring)."""
    text = ast.unparse(annotation).replace(" ", "")
    parts = set(text.split("|"))
    if {"bool", "str", "None"} == parts:
        return "optional"
    if "bool" in parts:
        return "none"
    if any(p.startswith(("list[", "tuple[", "set[")) for p in parts):
        return "many"
    return "one"


def _vllm(version: str, src: Path) -> Cli:
    root = src / "vllm"
    configs = [_parse(p) for p in sorted((root / "config").glob("*.py"))]
    arg_utils = _parse(root / "engine" / "arg_utils.py")
    cli_args = _parse(root / "entrypoints" / "common" / "cli_args.py")
    classes = _classes([*configs, arg_utils, cli_args])
    aliases = _literal_aliases([*configs, arg_utils, cli_args])
    lenient = _human_readable_ints(arg_utils)
    flags: dict[str, Arity] = {}
    ints: set[str] = set()
    choices: dict[str, list[str]] = {}

    def value_rule(flag: str, field_name: str, annotation: ast.expr) -> None:
        if _vllm_arity(annotation) != "one" or field_name in lenient:
            return
        rule = _value_rule(_union(annotation), aliases)
        if rule is not None and rule[0] == "int":
            ints.add(flag)
        elif rule is not None and rule[1] is not None:
            # A Literal beside `str` is only a metavar in vLLM: no choices then.
            choices[flag] = rule[1]

    positionals = 0
    for tree in (arg_utils, cli_args):
        kwargs_of = _get_kwargs_targets(tree)
        for call in _add_argument_calls(tree):
            names = [s for s in map(_str_const, call.args) if s is not None]
            if not names:
                continue  # the frontend loop's f-string, handled below
            if not names[0].startswith("-"):
                positionals += 1
                continue
            arity = _action_arity(call) or _spread_arity(call, kwargs_of, classes)
            spread = _spread_field(call, kwargs_of)
            annotation = _field_annotation(classes, *spread) if spread else None
            for name in names:
                if name.startswith("--"):
                    flags[name] = arity
                    if spread and annotation is not None and _action_arity(call) is None:
                        value_rule(name, spread[1], annotation)
                    elif _typed_int(call):
                        ints.add(name)
                    if arity == "none" and _is_boolean_optional(call, kwargs_of, classes):
                        flags["--no-" + name[2:]] = "none"
    for cls in _frontend_classes(classes):
        for name, annotation in _fields(cls):
            arity = _vllm_arity(annotation)
            if _dashed(name) not in flags:
                value_rule(_dashed(name), name, annotation)
            flags.setdefault(_dashed(name), arity)
            if arity == "none":
                flags.setdefault("--no-" + _dashed(name)[2:], "none")
    kv = classes.get("KVEventsConfig")
    return Cli(
        engine="vllm",
        version=version,
        flags=flags,
        positionals=positionals,
        kv_events_fields=frozenset(n for n, _ in _fields(kv)) if kv else frozenset(),
        ints=frozenset(ints),
        choices=choices,
    )


def _human_readable_ints(tree: ast.AST) -> set[str]:
    """The int fields vLLM also takes as "1K"/"auto" (`human_readable_int_args`)."""
    out = {"max_model_len"}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and any(
                isinstance(t, ast.Name) and t.id == "human_readable_int_args" for t in node.targets
            )
            and isinstance(node.value, ast.Set)
        ):
            out |= {s for s in map(_str_const, node.value.elts) if s is not None}
    return out


def _get_kwargs_targets(tree: ast.AST) -> dict[str, str]:
    """`model_kwargs = get_kwargs(ModelConfig)` → {"model_kwargs": "ModelConfig"}."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "get_kwargs"
            and node.value.args
            and isinstance(node.value.args[0], ast.Name)
        ):
            out[node.targets[0].id] = node.value.args[0].id
    return out


def _spread_field(call: ast.Call, kwargs_of: dict[str, str]) -> tuple[str, str] | None:
    """`**model_kwargs["x"]` → ("ModelConfig", "x")."""
    for kw in call.keywords:
        value = kw.value
        if (
            kw.arg is None
            and isinstance(value, ast.Subscript)
            and isinstance(value.value, ast.Name)
            and value.value.id in kwargs_of
        ):
            key = _str_const(value.slice)
            if key is not None:
                return kwargs_of[value.value.id], key
    return None


def _field_annotation(classes: dict[str, ast.ClassDef], cls: str, field: str) -> ast.expr | None:
    """A field's annotation, looking through the class's bases in the same sources."""
    seen: set[str] = set()
    todo = [cls]
    while todo:
        name = todo.pop(0)
        node = classes.get(name)
        if node is None or name in seen:
            continue
        seen.add(name)
        for fname, annotation in _fields(node):
            if fname == field:
                return annotation
        todo += [b.id for b in node.bases if isinstance(b, ast.Name)]
    return None


def _spread_arity(
    call: ast.Call, kwargs_of: dict[str, str], classes: dict[str, ast.ClassDef]
) -> Arity:
    spread = _spread_field(call, kwargs_of)
    if spread is None:
        return "one"  # a plain add_argument with a type: one value
    annotation = _field_annotation(classes, *spread)
    return "any" if annotation is None else _vllm_arity(annotation)


def _is_boolean_optional(
    call: ast.Call, kwargs_of: dict[str, str], classes: dict[str, ast.ClassDef]
) -> bool:
    for kw in call.keywords:
        if kw.arg == "action":
            return isinstance(kw.value, ast.Attribute) and kw.value.attr == "BooleanOptionalAction"
    return _spread_field(call, kwargs_of) is not None


def _frontend_classes(classes: dict[str, ast.ClassDef]) -> list[ast.ClassDef]:
    """BaseFrontendArgs and every class deriving from it (their fields are flags)."""
    out: list[ast.ClassDef] = []
    names = {"BaseFrontendArgs"}
    grew = True
    while grew:
        grew = False
        for cls in classes.values():
            bases = {b.id for b in cls.bases if isinstance(b, ast.Name)}
            if cls.name not in names and bases & names:
                names.add(cls.name)
                grew = True
    for name in sorted(names):
        if name in classes:
            out.append(classes[name])
    if not out:
        raise EngineFlagsError("vllm: no BaseFrontendArgs in cli_args.py (the parser moved)")
    return out


# -------------------------------------------------------------------- SGLang


def _sglang(version: str, src: Path) -> Cli:
    root = src / "sglang" / "srt"
    server_args = _parse(root / "server_args.py")
    fields_trees = [_parse(p) for p in sorted((root / "arg_groups" / "fields").glob("*.py"))]
    choices_py = root / "arg_groups" / "choices.py"
    extra = [_parse(choices_py)] if choices_py.is_file() else []
    aliases = _literal_aliases([*fields_trees, *extra])
    classes = _classes(fields_trees)
    namespaces = _input_namespaces(server_args)
    flags: dict[str, Arity] = {}
    ints: set[str] = set()
    choices: dict[str, list[str]] = {}
    for ns in namespaces:
        cls = classes.get(ns)
        if cls is None:
            raise EngineFlagsError(f"sglang: namespace {ns} is not in arg_groups/fields")
        for name, annotation in _fields(cls):
            flag = _sglang_flag(name, annotation, aliases)
            if flag is not None:
                names, arity, rule = flag
                for n in names:
                    flags[n] = arity
                    if rule is not None and rule[0] == "int":
                        ints.add(n)
                    elif rule is not None and rule[1] is not None:
                        choices[n] = rule[1]
    add_cli_args = next(
        (
            n
            for n in ast.walk(server_args)
            if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"
        ),
        None,
    )
    if add_cli_args is None:
        raise EngineFlagsError("sglang: no ServerArgs.add_cli_args in server_args.py")
    # A flag registered by hand here replaces a field's of the same name (argparse
    # would refuse both), so its own keywords decide its value rule.
    for call in _add_argument_calls(add_cli_args):
        arity = _action_arity(call) or "one"
        for name in (s for s in map(_str_const, call.args) if s is not None):
            if name.startswith("--"):
                flags[name] = arity
                ints.discard(name)
                choices.pop(name, None)
                if _typed_int(call):
                    ints.add(name)
    return Cli(
        engine="sglang",
        version=version,
        flags=flags,
        ints=frozenset(ints),
        choices=choices,
    )


def _input_namespaces(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets)
            and isinstance(node.value, ast.List)
        ):
            return [e.id for e in node.value.elts if isinstance(e, ast.Name)]
    raise EngineFlagsError("sglang: no _INPUT_NAMESPACES list in server_args.py")


_Rule = tuple[Literal["int"], None] | tuple[Literal["choices"], list[str]] | None


def _sglang_flag(
    name: str, annotation: ast.expr, aliases: dict[str, ast.expr]
) -> tuple[list[str], Arity, _Rule] | None:
    """A field's CLI names, arity and value rule, as `add_cli_args_from_dataclass` makes them."""
    if not (
        isinstance(annotation, ast.Subscript)
        and isinstance(annotation.value, ast.Name)
        and annotation.value.id in ("A", "Annotated")
        and isinstance(annotation.slice, ast.Tuple)
        and len(annotation.slice.elts) >= 2
    ):
        return None  # no CLI metadata: not registered automatically
    type_, *meta = annotation.slice.elts
    arg = next(
        (
            m
            for m in meta
            if isinstance(m, ast.Call) and isinstance(m.func, ast.Name) and m.func.id == "Arg"
        ),
        None,
    )
    if arg is None:
        if not any(_str_const(m) is not None for m in meta):
            return None
        arity = _sglang_arity(type_, nargs=None, type_parser=False)
        rule = _value_rule(_union(type_), aliases) if arity == "one" else None
        return [_dashed(name)], arity, rule
    return _sglang_arg_flag(name, type_, arg, aliases)


def _sglang_arg_flag(
    name: str, type_: ast.expr, arg: ast.Call, aliases: dict[str, ast.expr]
) -> tuple[list[str], Arity, _Rule] | None:
    """The same for a field with `Arg(...)` metadata."""
    opts = {kw.arg: kw.value for kw in arg.keywords if kw.arg}
    no_cli = opts.get("no_cli")
    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
        return None
    names = [_str_const(opts.get("cli_name")) or _dashed(name)]
    other_names = opts.get("aliases")
    if isinstance(other_names, ast.List):
        names += [s for s in map(_str_const, other_names.elts) if s is not None]
    if "action" in opts:
        action = _str_const(opts["action"])
        return names, "none" if action in ("store_true", "store_false") else "any", None
    arity = _sglang_arity(
        type_, nargs=_str_const(opts.get("nargs")), type_parser="type_parser" in opts
    )
    rule: _Rule = None
    if arity == "one" and "type_parser" not in opts:
        rule = _value_rule(_union(type_), aliases)
        listed = _const_list(opts.get("choices"), aliases)
        if listed is not None:
            rule = ("choices", listed)
        elif "choices" in opts and rule is not None and rule[0] == "choices":
            rule = None  # choices named by an expression this reading cannot evaluate
    return names, arity, rule


def _const_list(node: ast.expr | None, aliases: dict[str, ast.expr]) -> list[str] | None:
    """A list literal of constants, or a name bound to one → its values as strings."""
    if isinstance(node, ast.Name) and node.id in aliases:
        node = aliases[node.id]
    if isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(e, ast.Constant) for e in node.elts
    ):
        return [str(e.value) for e in node.elts if isinstance(e, ast.Constant)]
    return None


def _sglang_arity(type_: ast.expr, *, nargs: str | None, type_parser: bool) -> Arity:
    text = ast.unparse(type_).replace(" ", "")
    for wrapper in ("Optional[", "typing.Optional["):
        if text.startswith(wrapper) and text.endswith("]"):
            text = text[len(wrapper) : -1]
    text = text.removesuffix("|None")
    if nargs in ("+", "*"):
        return "many"
    if nargs == "?":
        return "optional"
    if text == "bool":
        return "none"
    if text.startswith(("List[", "list[")) and not type_parser:
        return "many"
    return "one"


# ------------------------------------------------------------------- checking


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


def main(argv: Sequence[str] | None = None) -> int:
    """Fetch every pinned release (or those named) and print the cache folder."""
    names = list(argv if argv is not None else sys.argv[1:]) or sorted(PINNED)
    status = 0
    for name in names:
        if name not in PINNED:
            print(
                f"engine-flags: unknown engine {name!r} (expected {sorted(PINNED)})",
                file=sys.stderr,
            )
            return 2
        try:
            cli = fetch(name)
        except (EngineFlagsError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"engine-flags: {name}: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"engine-flags: {name} {cli.version}: {len(cli.flags)} flags", file=sys.stderr)
    print(cache_root())
    return status


if __name__ == "__main__":
    sys.exit(main())
