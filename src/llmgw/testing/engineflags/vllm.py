"""vLLM's `vllm serve` flags, read from vllm/entrypoints/common/cli_args.py and its imports.

`make_arg_parser` registers every `add_argument("--flag", …)` in cli_args.py and
in vllm/engine/arg_utils.py (EngineArgs and AsyncEngineArgs), plus one
`--field-name` per field of the frontend dataclasses (`BaseFrontendArgs` and its
subclasses), which `add_cli_args` registers in a loop. A flag spread from
`get_kwargs(SomeConfig)` takes its arity from the config field's annotation, as
vLLM's `_compute_kwargs` does: `bool` → no value (and a `--no-` twin),
`bool | str | None` → an optional value, a list, tuple or set → one or more
values, else one value.
"""

from __future__ import annotations

import ast
from pathlib import Path

from llmgw.testing.engineflags.commandline import Arity, Cli, EngineFlagsError
from llmgw.testing.engineflags.reading import (
    action_arity,
    add_argument_calls,
    annotated_fields,
    dashed,
    literal_aliases,
    parse,
    str_const,
    top_classes,
    typed_int,
    union_parts,
    value_rule_of,
)


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


def read_vllm(version: str, src: Path) -> Cli:
    root = src / "vllm"
    configs = [parse(p) for p in sorted((root / "config").glob("*.py"))]
    arg_utils = parse(root / "engine" / "arg_utils.py")
    cli_args = parse(root / "entrypoints" / "common" / "cli_args.py")
    classes = top_classes([*configs, arg_utils, cli_args])
    aliases = literal_aliases([*configs, arg_utils, cli_args])
    lenient = _human_readable_ints(arg_utils)
    flags: dict[str, Arity] = {}
    ints: set[str] = set()
    choices: dict[str, list[str]] = {}

    def value_rule(flag: str, field_name: str, annotation: ast.expr) -> None:
        if _vllm_arity(annotation) != "one" or field_name in lenient:
            return
        rule = value_rule_of(union_parts(annotation), aliases)
        if rule is not None and rule[0] == "int":
            ints.add(flag)
        elif rule is not None and rule[1] is not None:
            # A Literal beside `str` is only a metavar in vLLM: no choices then.
            choices[flag] = rule[1]

    positionals = 0
    for tree in (arg_utils, cli_args):
        kwargs_of = _get_kwargs_targets(tree)
        for call in add_argument_calls(tree):
            names = [s for s in map(str_const, call.args) if s is not None]
            if not names:
                continue  # the frontend loop's f-string, handled below
            if not names[0].startswith("-"):
                positionals += 1
                continue
            arity = action_arity(call) or _spread_arity(call, kwargs_of, classes)
            spread = _spread_field(call, kwargs_of)
            annotation = _field_annotation(classes, *spread) if spread else None
            for name in names:
                if name.startswith("--"):
                    flags[name] = arity
                    if spread and annotation is not None and action_arity(call) is None:
                        value_rule(name, spread[1], annotation)
                    elif typed_int(call):
                        ints.add(name)
                    if arity == "none" and _is_boolean_optional(call, kwargs_of, classes):
                        flags["--no-" + name[2:]] = "none"
    for cls in _frontend_classes(classes):
        for name, annotation in annotated_fields(cls):
            arity = _vllm_arity(annotation)
            if dashed(name) not in flags:
                value_rule(dashed(name), name, annotation)
            flags.setdefault(dashed(name), arity)
            if arity == "none":
                flags.setdefault("--no-" + dashed(name)[2:], "none")
    kv = classes.get("KVEventsConfig")
    return Cli(
        engine="vllm",
        version=version,
        flags=flags,
        positionals=positionals,
        kv_events_fields=frozenset(n for n, _ in annotated_fields(kv)) if kv else frozenset(),
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
            out |= {s for s in map(str_const, node.value.elts) if s is not None}
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
            key = str_const(value.slice)
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
        for fname, annotation in annotated_fields(node):
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
