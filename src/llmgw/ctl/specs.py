"""Model spec files for `ctl apply -f`: read, flatten, validate, all before anything is sent.

A file holds one or many specs: a single mapping, a list of mappings, or several
YAML documents (`---`) of either kind. Every spec is validated locally against
`wire.models.ModelSpec` (the type the controller decodes), and every problem is
reported — file, model (by name, else by position) and field — so one run
shows all of them. Nothing is applied unless all are valid: partial applies
are how a fleet ends up half on the old config.
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import yaml

from llmgw.ctl.errors import SpecError
from llmgw.ctl.shown import visible
from llmgw.runtime import safeyaml, textfile
from llmgw.wire.adapters import AdapterSpec, adapter_problem, is_adapter
from llmgw.wire.models import NAME_RULE, ModelSpec, env_from_problem, spec_problem
from llmgw.wire.names import STORED_MODEL_NAME_PATTERN, shown_name

# msgspec ends a located error with " - at `$.field[0]`".
_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
# msgspec names the field in the message itself for these two.
_NAMED = re.compile(r"^Object (?:missing required|contains unknown) field `(?P<field>[^`]+)`$")


def _where(index: int, raw: object) -> str:
    name = raw.get("name") if isinstance(raw, dict) else None
    if isinstance(name, str) and name:
        return f"model {shown_name(name)} (#{index + 1})"
    return f"model #{index + 1}"


def describe(error: msgspec.ValidationError) -> str:
    """`field <path>: <problem>` from a msgspec validation message."""
    message = str(error)
    located = _AT.search(message)
    if located:
        return f"field {located['path'] or '(root)'}: {message[: located.start()]}"
    named = _NAMED.match(message)
    if named:
        what = "missing" if "missing" in message else "unknown field"
        return f"field {named['field']}: {what}"
    # __post_init__ checks that span fields (max below min, alias repeats the name).
    return f"spec: {message}"


def _literals(tp: object) -> list[str]:
    """Every literal value a type allows, anywhere inside it (for "allowed: …")."""
    found: list[str] = []

    def walk(info: msgspec.inspect.Type) -> None:
        if isinstance(info, msgspec.inspect.LiteralType):
            found.extend(str(v) for v in info.values)
        elif isinstance(info, msgspec.inspect.UnionType):
            for t in info.types:
                walk(t)
        elif isinstance(
            info,
            msgspec.inspect.ListType
            | msgspec.inspect.TupleType
            | msgspec.inspect.VarTupleType
            | msgspec.inspect.SetType
            | msgspec.inspect.FrozenSetType,
        ):
            items = getattr(info, "item_type", None)
            for t in [items] if items is not None else getattr(info, "item_types", ()):
                walk(t)
        elif isinstance(info, msgspec.inspect.DictType):
            walk(info.value_type)

    walk(msgspec.inspect.type_info(tp))
    return sorted(set(found))


def _in_words(problem: str, tp: object) -> str:
    """msgspec's wording, made readable: enums list their values, names their rule."""
    if problem.startswith("Invalid enum value"):
        allowed = _literals(tp)
        if allowed:
            return f"{problem}; allowed: {', '.join(allowed)}"
    if STORED_MODEL_NAME_PATTERN in problem:
        return (
            problem.split(" matching regex", 1)[0].replace("Expected `str`", "not a valid name")
            + f": {NAME_RULE}"
        )
    return problem


def _field_problems(raw: dict[str, Any], kind: type[ModelSpec | AdapterSpec]) -> list[str]:
    """Every problem of one spec mapping, each field on its own (msgspec stops at the first)."""
    fields = {f.encode_name: f for f in msgspec.structs.fields(kind)}
    problems: list[str] = []
    for key in raw:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean {close[0]}?)" if close else f"; fields: {', '.join(fields)}"
            if kind is AdapterSpec:
                hint += " (an adapter's engine, GPUs and replicas are its base's)"
            problems.append(f"field {key}: unknown field{hint}")
    refs = env_from_problem(raw)
    if refs is not None:
        problems.append(f"field {refs[0]}: {refs[1]}")
    for name, f in fields.items():
        if name not in raw:
            if f.required:
                problems.append(f"field {name}: missing (required)")
            continue
        if name == "env_from" and refs is not None:
            continue
        try:
            msgspec.convert(raw[name], f.type)
        except msgspec.ValidationError as exc:
            message = str(exc)
            located = _AT.search(message)
            sub = located["path"] if located else ""
            problem = message[: located.start()] if located else message
            path = f"{name}{sub}" if sub.startswith("[") else (f"{name}.{sub}" if sub else name)
            problems.append(f"field {path}: {_in_words(problem, f.type)}")
    return problems


_SURROGATE = (
    "a string holds a lone surrogate (an escape such as \\ud83d that is half of a "
    "character); write the whole character"
)
_NOT_FINITE = "not a finite number (JSON, which carries the spec, has no .inf or .nan)"


def unsendable(value: object) -> tuple[str, str] | None:
    """Where in a parsed document a value cannot be sent, and why; None when all can.

    - A string holding a lone surrogate: YAML's `"\\ud83d"` escape gives Python a string
      that no UTF-8 encoder takes; sent, it would end ctl in UnicodeEncodeError (the
      controller's own decoder refuses it too).
    - A number that is not finite: YAML's `.inf` and `.nan`. JSON has neither, and the
      encoder writes them as null, so `sleep_after_s: .inf` would arrive as "not given"
      and `idle_timeout_s: .inf` as a type error about a null the file does not hold.

    Walked without recursion, and each container once: YAML anchors can make a
    document deeper than the stack, or a cycle.
    """
    stack: list[tuple[str, object]] = [("", value)]
    seen: set[int] = set()
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= ch <= "\udfff" for ch in item):
                return path or "(root)", _SURROGATE
            continue
        if isinstance(item, float) and not math.isfinite(item):
            return path or "(root)", _NOT_FINITE
        if not isinstance(item, dict | list) or id(item) in seen:
            continue
        seen.add(id(item))
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, sub in pairs:
            # visible(): the path is printed, and a key may be the string at fault.
            step = f"[{key}]" if isinstance(item, list) else f".{visible(key)}"
            where = f"{path}{step}".lstrip(".")
            bad_key = unsendable(key) if isinstance(key, str | float) else None
            if bad_key is not None:
                return where, bad_key[1]
            stack.append((where, sub))
    return None


def _load_all(text: str) -> list[Any]:
    """`yaml.safe_load_all(text)`, each document held to safeyaml's bounds before it is
    built: aliases of a long string stood for gigabytes of arguments to scan and send."""
    loader = safeyaml.Loader(text)
    try:
        documents = []
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # check_node said there is one: never None here
                break
            safeyaml.check(node)
            safeyaml.as_text_under(node, safeyaml.SPEC_TEXT)
            documents.append(loader.construct_document(node))
        return documents
    finally:
        loader.dispose()


def parse_documents(text: str, source: str) -> list[Any]:
    """The file's specs, flattened from all documents, not yet validated."""
    try:
        documents = _load_all(text)
    except safeyaml.YamlError as exc:
        raise SpecError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        if safeyaml.too_deep(exc):
            raise SpecError(f"{source}: not valid YAML: nested too deeply") from None
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        # One line: a reader error's text has the position on a second one.
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise SpecError(f"{source}: not valid YAML{where}: {problem}") from exc
    except RecursionError:
        raise SpecError(f"{source}: not valid YAML: nested too deeply") from None
    raws: list[Any] = []
    for doc in documents:
        if doc is None:
            continue
        raws.extend(doc if isinstance(doc, list) else [doc])
    if not raws:
        raise SpecError(f"{source}: no model specs in the file")
    for i, raw in enumerate(raws):
        bad = unsendable(raw)
        if bad is not None:
            # The path, not the value: a string at fault is what cannot be printed.
            raise SpecError(f"{source}: {_where(i, raw)}: field {bad[0]}: {bad[1]}")
    return raws


def validate(raws: list[Any], source: str) -> list[ModelSpec | AdapterSpec]:
    """Every spec valid, or a SpecError listing every problem, one per line. An entry
    with `adapter_of` is a LoRA adapter's (wire.adapters)."""
    problems: list[str] = []
    specs: list[ModelSpec | AdapterSpec] = []
    first_seen: dict[str, int] = {}
    for i, raw in enumerate(raws):
        where = _where(i, raw)
        if not isinstance(raw, dict):
            problems.append(f"{source}: {where}: expected a mapping, got {type(raw).__name__}")
            continue
        name = raw.get("name")
        if isinstance(name, str) and name in first_seen:
            # Two specs for one model in one apply: which one was meant is a guess.
            problems.append(
                f"{source}: {where}: field name: {name!r} is already #{first_seen[name]}"
            )
            continue
        if isinstance(name, str):
            first_seen[name] = i + 1
        kind: type[ModelSpec | AdapterSpec] = AdapterSpec if is_adapter(raw) else ModelSpec
        each = _field_problems(raw, kind)
        if each:
            problems.extend(f"{source}: {where}: {p}" for p in each)
            continue
        try:
            # Fields one by one were fine: what is left spans fields (max below min).
            spec: ModelSpec | AdapterSpec = msgspec.convert(raw, kind)
        except msgspec.ValidationError as exc:
            problems.append(f"{source}: {where}: {describe(exc)}")
            continue
        wrong = spec_problem(spec) if isinstance(spec, ModelSpec) else adapter_problem(spec)
        if wrong is not None:
            problems.append(f"{source}: {where}: field {wrong[0]}: {wrong[1]}")
            continue
        specs.append(spec)
    if problems:
        bad = len({p.split(": field ")[0].split(": spec: ")[0] for p in problems})
        head = f"{len(problems)} problem(s) in {bad} model spec(s); nothing applied"
        raise SpecError("\n".join([head, *problems]))
    return specs


# A spec file larger than this is not one (a fleet's specs are kilobytes): refused
# before it is held whole, so `-f /dev/zero` ends at once instead of filling memory.
MAX_FILE_BYTES = 16 * 1024 * 1024


def read_text(stream: BinaryIO, source: str) -> str:
    """A spec file's text: UTF-8 and at most MAX_FILE_BYTES, or a SpecError saying which."""
    try:
        return textfile.read_stream(stream, max_bytes=MAX_FILE_BYTES)
    except textfile.TextFileError as exc:
        raise SpecError(f"{source}: {exc}") from None


def load_specs(path: Path) -> list[ModelSpec | AdapterSpec]:
    """Read and validate a spec file (standard input: `read_text` of its bytes)."""
    try:
        with path.open("rb") as f:
            text = read_text(f, str(path))
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return validate(parse_documents(text, str(path)), str(path))
