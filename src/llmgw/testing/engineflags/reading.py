"""What both engines' readers share: parsing a source file and reading `ast` nodes.

The rules of argparse itself live here (`action`/`nargs` → how many values,
`type=int`), and how a field's annotation maps to a value rule (plain `int`, or
only `Literal[...]`); each engine's own rules are in its module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from llmgw.testing.engineflags.commandline import Arity, EngineFlagsError

# The value rule a flag gets: every value an integer, or one of these choices.
Rule = tuple[Literal["int"], None] | tuple[Literal["choices"], list[str]] | None


def parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError) as exc:
        raise EngineFlagsError(f"cannot read {path}: {exc}") from exc


def top_classes(trees: Iterable[ast.Module]) -> dict[str, ast.ClassDef]:
    out: dict[str, ast.ClassDef] = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, node)
    return out


def annotated_fields(cls: ast.ClassDef) -> Iterator[tuple[str, ast.expr]]:
    """(name, annotation) of each annotated field in a class body."""
    for node in cls.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and not node.target.id.startswith("_")
        ):
            yield node.target.id, node.annotation


def dashed(name: str) -> str:
    return "--" + name.replace("_", "-")


def str_const(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def add_argument_calls(tree: ast.AST) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            yield node


def union_parts(annotation: ast.expr) -> list[ast.expr]:
    """`A | B | None` (or `Optional[A]`, parenthesised or not) → [A, B, None]."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return [*union_parts(annotation.left), *union_parts(annotation.right)]
    if (
        isinstance(annotation, ast.Subscript)
        and isinstance(annotation.value, ast.Name)
        and annotation.value.id == "Optional"
    ):
        return [*union_parts(annotation.slice), ast.Constant(None)]
    return [annotation]


def is_none(node: ast.expr) -> bool:
    return (isinstance(node, ast.Constant) and node.value is None) or (
        isinstance(node, ast.Name) and node.id == "None"
    )


def literal_options(node: ast.expr, aliases: dict[str, ast.expr]) -> list[str] | None:
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


def literal_aliases(trees: Iterable[ast.Module]) -> dict[str, ast.expr]:
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


def value_rule_of(parts: list[ast.expr], aliases: dict[str, ast.expr]) -> Rule:
    """An int-only or Literal-only type (None aside) → the value rule argparse gets."""
    real = [p for p in parts if not is_none(p)]
    if len(real) == 1 and isinstance(real[0], ast.Name) and real[0].id == "int":
        return "int", None
    options = [literal_options(p, aliases) for p in real]
    if real and all(o is not None for o in options):
        return "choices", sorted({v for o in options if o is not None for v in o})
    return None


def typed_int(call: ast.Call) -> bool:
    """`add_argument(..., type=int)` without an action or nargs of its own."""
    return action_arity(call) is None and any(
        kw.arg == "type" and isinstance(kw.value, ast.Name) and kw.value.id == "int"
        for kw in call.keywords
    )


def action_arity(call: ast.Call) -> Arity | None:
    """The arity an explicit action/nargs keyword gives, or None when there is none."""
    for kw in call.keywords:
        if kw.arg == "action":
            action = str_const(kw.value)
            if action in ("store_true", "store_false", "store_const", "count"):
                return "none"
            if action in ("store", "append"):
                return "one"
            if isinstance(kw.value, ast.Attribute) and kw.value.attr == "BooleanOptionalAction":
                return "none"
            return "any"  # a custom Action class: its arity is its own
        if kw.arg == "nargs":
            nargs = str_const(kw.value)
            if nargs in ("+", "*"):
                return "many"
            if nargs == "?":
                return "optional"
            return "any"
    return None
