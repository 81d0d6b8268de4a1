"""SGLang's `python -m sglang.launch_server` flags, read from sglang/srt/server_args.py.

One flag per `A[T, "help"]`/`A[T, Arg(…)]` field of the namespace classes listed
in `_INPUT_NAMESPACES` (arg_groups/fields/*.py), named `--field-name` unless
`Arg(cli_name=…)`, plus `Arg(aliases=…)`, skipping `Arg(no_cli=True)`, as
`add_cli_args_from_dataclass` does; plus the `add_argument` calls in
`ServerArgs.add_cli_args`. `bool` → no value, a list → one or more values.
"""

from __future__ import annotations

import ast
from pathlib import Path

from llmgw.testing.engineflags.commandline import Arity, Cli, EngineFlagsError
from llmgw.testing.engineflags.reading import (
    Rule,
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


def read_sglang(version: str, src: Path) -> Cli:
    root = src / "sglang" / "srt"
    server_args = parse(root / "server_args.py")
    fields_trees = [parse(p) for p in sorted((root / "arg_groups" / "fields").glob("*.py"))]
    choices_py = root / "arg_groups" / "choices.py"
    extra = [parse(choices_py)] if choices_py.is_file() else []
    aliases = literal_aliases([*fields_trees, *extra])
    classes = top_classes(fields_trees)
    namespaces = _input_namespaces(server_args)
    flags: dict[str, Arity] = {}
    ints: set[str] = set()
    choices: dict[str, list[str]] = {}
    for ns in namespaces:
        cls = classes.get(ns)
        if cls is None:
            raise EngineFlagsError(f"sglang: namespace {ns} is not in arg_groups/fields")
        for name, annotation in annotated_fields(cls):
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
    for call in add_argument_calls(add_cli_args):
        arity = action_arity(call) or "one"
        for name in (s for s in map(str_const, call.args) if s is not None):
            if name.startswith("--"):
                flags[name] = arity
                ints.discard(name)
                choices.pop(name, None)
                if typed_int(call):
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


def _sglang_flag(
    name: str, annotation: ast.expr, aliases: dict[str, ast.expr]
) -> tuple[list[str], Arity, Rule] | None:
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
        if not any(str_const(m) is not None for m in meta):
            return None
        arity = _sglang_arity(type_, nargs=None, type_parser=False)
        rule = value_rule_of(union_parts(type_), aliases) if arity == "one" else None
        return [dashed(name)], arity, rule
    return _sglang_arg_flag(name, type_, arg, aliases)


def _sglang_arg_flag(
    name: str, type_: ast.expr, arg: ast.Call, aliases: dict[str, ast.expr]
) -> tuple[list[str], Arity, Rule] | None:
    """The same for a field with `Arg(...)` metadata."""
    opts = {kw.arg: kw.value for kw in arg.keywords if kw.arg}
    no_cli = opts.get("no_cli")
    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
        return None
    names = [str_const(opts.get("cli_name")) or dashed(name)]
    other_names = opts.get("aliases")
    if isinstance(other_names, ast.List):
        names += [s for s in map(str_const, other_names.elts) if s is not None]
    if "action" in opts:
        action = str_const(opts["action"])
        return names, "none" if action in ("store_true", "store_false") else "any", None
    arity = _sglang_arity(
        type_, nargs=str_const(opts.get("nargs")), type_parser="type_parser" in opts
    )
    rule: Rule = None
    if arity == "one" and "type_parser" not in opts:
        rule = value_rule_of(union_parts(type_), aliases)
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
