"""YAML for config files: PyYAML's safe loader, less its two ways to exhaust a process.

- Aliases. `&a [lol, …]`, `&b [*a, *a, …]`, nine levels deep, is a file of 500 bytes
  whose value stands for billions of strings ("billion laughs"). PyYAML builds it small,
  one object per anchor, but whatever walks it as a tree writes every copy: `str()` of
  the controller's `host: *bomb` for its flag, `repr()` of the router's
  `http_server: *bomb` in its error, each grew memory without end. So the document's
  nodes are counted before anything is built, each alias as the copy a walk meets, and
  one whose aliases repeat more than MAX_REPEATED_NODES, or that holds itself (an alias
  inside its own anchor), is refused. Anchors and `<<` merges within that stay as they were.
  Characters are counted the same way: a 1 MB string and 100,000 aliases of it are few
  nodes, but 100 GB once a spec file's `args` are encoded to be sent (`ctl apply`, `llmgw
  up`'s models), and ctl scanned every copy first.
- Depth. PyYAML's composer recurses once per level, so a document nested some
  thousand levels deep raised RecursionError, a traceback at start.

One reading is YAML 1.2's rather than PyYAML's 1.1: a number with an exponent and no
dot (`1e3`, JSON's `1e+308`) is a float (`Loader`). YAML 1.1 reads it as a string, so a
JSON spec file's `"idle_timeout_s": 1e3` was refused as "expected float, got str".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

# Far above what anchors save in a config (a defaults block merged into each of a
# thousand endpoints repeats some tens of thousands), far below what hurts to walk.
MAX_REPEATED_NODES = 1_000_000
# As much again as the largest spec file (16 MiB): far above what a config repeats.
MAX_REPEATED_CHARS = 16 * 1024 * 1024


# libyaml's parser where PyYAML was built with it: the pure-Python one took 10-20 s of
# CPU to read a 1 MB string and 100,000 aliases of it before `check` could refuse them
# (0.14 s with libyaml). libyaml also bounds nesting itself ("exceeded maximum nesting
# depth"), where the Python one recursed until RecursionError.
_SafeBase: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TextBase: type[yaml.BaseLoader] = getattr(yaml, "CBaseLoader", yaml.BaseLoader)


class Loader(_SafeBase):  # type: ignore[valid-type,misc]
    """PyYAML's safe loader, with YAML 1.2's floats that have an exponent but no dot."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


class YamlError(ValueError):
    """The text is not YAML, or not YAML a config may be; the message says which, in one line."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


@dataclass(frozen=True, slots=True)
class _Size:
    """What a walk of a node's value meets: nodes and scalar characters."""

    nodes: int
    chars: int


def _expanded(root: yaml.Node) -> tuple[_Size, _Size] | None:
    """(what a walk of the values meets, the distinct nodes' own), or None when one holds
    itself.

    Without recursion: the document may be as deep as the composer's stack went."""
    size: dict[int, _Size] = {}
    own_chars = 0
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            kids = [size[id(c)] for c in _children(node)]
            chars = len(node.value) if isinstance(node, yaml.ScalarNode) else 0
            own_chars += chars
            size[key] = _Size(
                nodes=1 + sum(k.nodes for k in kids), chars=chars + sum(k.chars for k in kids)
            )
            continue
        if key in size:
            continue
        if key in open_:
            # Met again before its own subtree is done: it is inside itself.
            return None
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node))
    return size[id(root)], _Size(nodes=len(size), chars=own_chars)


def check(node: yaml.Node) -> None:
    """Raise YamlError when a composed document's aliases stand for more than a config
    holds (the module docstring), before anything is built from it."""
    counted = _expanded(node)
    if counted is None:
        raise YamlError("not a config: an alias inside its own anchor (an endless value)")
    walked, distinct = counted
    if walked.nodes - distinct.nodes > MAX_REPEATED_NODES:
        raise YamlError(
            f"not a config: its aliases repeat more than {MAX_REPEATED_NODES} nodes "
            f"({walked.nodes} in all)"
        )
    if walked.chars - distinct.chars > MAX_REPEATED_CHARS:
        raise YamlError(
            f"not a config: its aliases repeat more than {MAX_REPEATED_CHARS} characters "
            f"({walked.chars} in all)"
        )


_TYPED = frozenset(("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"))
_STR = "tag:yaml.org,2002:str"
# A model spec's fields whose values an engine takes as text (ctl's and up's spec files).
SPEC_TEXT = frozenset(("args", "env"))


def as_text_under(root: yaml.Node, keys: frozenset[str]) -> None:
    """Make the unquoted numbers and true/false under any of `keys` (a list's items, a
    mapping's values) their text as written: `args: [--max-model-len, 8192]` is the
    argument "8192", `env: {V: 1e-5}` the value "1e-5" (not "1e-05"). Nulls stay null.

    An engine's arguments and environment are text; YAML typed them, and a spec then
    failed with "expected str, got int" over the way nearly everyone writes them. Walked
    without recursion, each node once (aliases share nodes)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value in keys:
                    items = v.value if isinstance(v, yaml.SequenceNode) else []
                    if isinstance(v, yaml.MappingNode):
                        items = [val for _, val in v.value]
                    for item in items:
                        if isinstance(item, yaml.ScalarNode) and item.tag in _TYPED:
                            item.tag = _STR
        stack.extend(_children(node))


def too_deep(exc: yaml.YAMLError) -> bool:
    """Whether libyaml refused the document for its nesting (the Python parser's
    RecursionError): both are said the same way."""
    return "maximum nesting depth" in str(exc)


def load(text: str, *, as_typed: bool = False, text_under: frozenset[str] = frozenset()) -> Any:
    """The one document in `text` (None when empty), as `yaml.safe_load`, or YamlError.

    `as_typed`: every scalar is the text as written (`0123`, `yes` and `1e3` stay text;
    YAML's BaseLoader), for files whose settings are all text. `text_under`: keys whose
    values' numbers and true/false are read as written (`as_text_under`)."""
    loader: yaml.SafeLoader | yaml.BaseLoader = yaml.BaseLoader(text) if as_typed else Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check(node)
        if text_under:
            as_text_under(node, text_under)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        if too_deep(exc):
            raise YamlError("not valid YAML: nested too deeply") from None
        # One line: the parser's text puts the position and a caret on lines of their own.
        raise YamlError(f"not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise YamlError("not valid YAML: nested too deeply") from None
    finally:
        loader.dispose()
