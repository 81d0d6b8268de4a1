"""Served names that differ only in case, refused across models and adapters.

Model names are matched exactly (a request's `model` is looked up as written), so
`Llama-3` and `llama-3` could be two models: a client that typed the other case was
served by another model, with no error to tell it, and the two read as one in every
table. A name that differs from another model's or adapter's served name only in case
is refused where a spec comes in (the controller's apply). The same model may spell
its own names in several cases (its aliases are the same model), and names stored
before this rule keep working: only a name newly taken is checked, so an unchanged
spec can always be applied again.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.controller.errors import Conflict, InvalidSpec
from llmgw.controller.fleet.records import FleetState
from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.models import ModelSpec


def _served(entry: ModelSpec | AdapterSpec) -> list[tuple[str, str]]:
    """(field, name) of each name `entry` serves."""
    if isinstance(entry, AdapterSpec):
        return [("name", entry.name)]
    return [("name", entry.name)] + [(f"aliases[{j}]", a) for j, a in enumerate(entry.aliases)]


def _stored(state: FleetState) -> dict[str, set[str]]:
    """Each stored model or adapter → the names it serves now."""
    out = {m.name: set(m.spec.served_names) for m in state.models.values()}
    out.update({a.name: {a.name} for a in state.adapters.values()})
    return out


def check_case(state: FleetState, entries: Sequence[ModelSpec | AdapterSpec]) -> None:
    """Refuse the request if one of its names newly taken differs only in case from a
    name another model or adapter serves (stored: 409; of the same request: 422)."""
    stored = _stored(state)
    applied = {e.name for e in entries}
    # Folded name → (name as written, its owner), for what stays as it is stored.
    others: dict[str, tuple[str, str]] = {}
    for owner, names in sorted(stored.items()):
        if owner not in applied:
            for n in sorted(names):
                others.setdefault(n.casefold(), (n, owner))
    # Folded name → (name as written, its owner, whether newly taken), for this request.
    ours: dict[str, list[tuple[str, str, bool]]] = {}
    for i, entry in enumerate(entries):
        before = stored.get(entry.name, set())
        for field, n in _served(entry):
            key = n.casefold()
            new = n not in before
            # Two names both kept from before may clash (stored before this rule): a
            # request applying both unchanged again passes, as each alone does.
            clash = next(
                (
                    m
                    for m in ours.get(key, ())
                    if m[1] != entry.name and m[0] != n and (new or m[2])
                ),
                None,
            )
            if clash is not None:
                raise InvalidSpec(
                    f"models[{i}] ({entry.name!r}): {field}: {n!r} differs only in case from "
                    f"{clash[0]!r} of {clash[1]!r} in the same request; nothing was applied",
                    param=f"[{i}].{field}",
                )
            ours.setdefault(key, []).append((n, entry.name, new))
            theirs = others.get(key)
            if not new or theirs is None or theirs[1] == entry.name or theirs[0] == n:
                continue
            raise Conflict(
                f"models[{i}] ({entry.name!r}): {field}: {n!r} differs only in case from "
                f"{theirs[0]!r}, served by {theirs[1]!r} (names are matched exactly: a client "
                "that typed the other case would be served by the other model); nothing was "
                "applied",
                param=f"[{i}].{field}",
            )
