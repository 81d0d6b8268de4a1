"""LoRA adapters applied and deleted, decided purely (docs/sleep-and-adapters.md).

An adapter has no replicas: its base's serve it. What is checked here, before
anything is written, is what would otherwise fail far from the operator: a base
that does not exist (or is an alias, or is itself an adapter), a base engine
that cannot load adapters, a name another model or adapter already serves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from llmgw.controller.errors import Conflict, InvalidSpec
from llmgw.controller.fleet.batch import Batch
from llmgw.controller.fleet.records import Adapter, FleetState, Model
from llmgw.wire.adapters import (
    AdapterSpec,
    adapter_engine_problem,
    llamacpp_path_problem,
    loads_at_run_time,
    source_problem,
)
from llmgw.wire.models import ModelSpec


def check_adapters(
    state: FleetState,
    adapters: Sequence[tuple[int, AdapterSpec]],
    models: Mapping[str, ModelSpec],
    seen: dict[str, str],
) -> None:
    """Refuse the whole request for any adapter that cannot be applied.

    `adapters` are (index in the request, spec); `models` the model specs of the same
    request by name (a base may come with its adapters); `seen` every served name of
    the request's models → its model, which the adapters' names are added to.
    """
    # Stored aliases, but for the models this request applies again: theirs are the
    # request's (in `seen`), so a name one of them gives up may go to an adapter.
    aliases = {
        n: m.name for m in state.models.values() if m.name not in models for n in m.spec.aliases
    }
    request_adapters = {a.name for _, a in adapters}
    for i, a in adapters:
        label = f"models[{i}] ({a.name!r})"
        if a.name in seen:
            raise InvalidSpec(
                f"{label}: name {a.name!r} is also used by {seen[a.name]!r} in the same request",
                param=f"[{i}].name",
            )
        seen[a.name] = a.name
        if a.name in state.models:
            raise Conflict(
                f"name {a.name!r} is already a model's (delete the model first)", param="name"
            )
        if a.name in aliases:
            raise Conflict(
                f"adapter name {a.name!r} is already an alias of model {aliases[a.name]!r}",
                param="name",
            )
        base = a.adapter_of
        if base in request_adapters or (base in state.adapters and base not in models):
            raise InvalidSpec(
                f"{label}: adapter_of: {base!r} is an adapter; an adapter's base must be a "
                "model (adapters of adapters are not served); nothing was applied",
                param=f"[{i}].adapter_of",
            )
        spec = models.get(base)
        if spec is None and (m := state.models.get(base)) is not None:
            spec = m.spec
        if spec is None:
            alias_of = aliases.get(base) or next(
                (name for name, m in models.items() if base in m.aliases), None
            )
            hint = (
                f" ({base!r} is an alias of {alias_of!r}: name the model)"
                if alias_of is not None
                else " (apply the base model first, or in the same request)"
            )
            raise InvalidSpec(
                f"{label}: adapter_of: no model named {base!r}{hint}; nothing was applied",
                param=f"[{i}].adapter_of",
            )
        why = adapter_engine_problem(spec.engine)
        if why is not None:
            raise InvalidSpec(
                f"{label}: adapter_of: {base!r}: {why}; nothing was applied",
                param=f"[{i}].adapter_of",
            )
        bad_source = source_problem(a.source)
        bad_path = (f"source {bad_source}" if bad_source else None) or (
            llamacpp_path_problem(a.source) if spec.engine == "llamacpp" else None
        )
        if bad_path is not None:
            raise InvalidSpec(f"{label}: {bad_path}; nothing was applied", param=f"[{i}].source")
    for name, spec in models.items():
        for n in spec.served_names:
            if n in state.adapters:
                raise Conflict(
                    f"name {n!r} of model {name!r} is already an adapter's", param="name"
                )
        served = [a for a in state.adapters.values() if a.base == name]
        why = adapter_engine_problem(spec.engine) if served else None
        if why is not None:
            shown = ", ".join(sorted(a.name for a in served))
            raise InvalidSpec(
                f"model {name!r}: engine: it serves adapters ({shown}) and {why}; "
                "nothing was applied",
                param="engine",
            )
        _check_kept_paths(name, spec, [a for a in served if a.name not in request_adapters])


def _check_kept_paths(name: str, spec: ModelSpec, kept: Sequence[Adapter]) -> None:
    """A base that turns llama.cpp keeps its adapters: each one's path must suit
    llama-server, as it must when an adapter is applied to a llama.cpp base (else the
    base's every replica would fail to start). Adapters of the request are checked
    with their own entry."""
    if spec.engine != "llamacpp":
        return
    for a in sorted(kept, key=lambda a: a.name):
        bad_path = llamacpp_path_problem(a.spec.source)
        if bad_path is not None:
            raise InvalidSpec(
                f"model {name!r}: engine: its adapter {a.name!r} has {bad_path}; "
                "apply the adapter with another source in the same request; nothing was applied",
                param="engine",
            )


def put_adapters(batch: Batch, adapters: Sequence[AdapterSpec]) -> None:
    """Create or update each adapter; each change rolls its base's replicas over where
    the engine cannot load adapters at run time."""
    state, now = batch.base, batch.now
    rolled: set[str] = set()
    for spec in adapters:
        old = state.adapters.get(spec.name)
        if old is not None and old.spec == spec:
            continue
        batch.changes.adapters.append(Adapter(spec=spec, updated_at=now))
        moved = old is not None and old.base != spec.adapter_of
        verb = "applied" if old is None else "updated"
        msg = f"adapter {verb}: LoRA of {spec.adapter_of} from {spec.source}"
        if moved and old is not None:
            msg += f" (was of {old.base})"
            rolled.add(old.base)
        batch.event(f"adapter.{verb}", "model", spec.name, msg, model=spec.adapter_of)
        rolled.add(spec.adapter_of)
    for base in sorted(rolled):
        _roll_if_static(batch, base)


def delete_adapter(batch: Batch, adapter: Adapter) -> None:
    batch.changes.deleted_adapters.append(adapter.name)
    batch.event(
        "adapter.deleted",
        "model",
        adapter.name,
        f"adapter of {adapter.base} deleted",
        model=adapter.base,
    )
    _roll_if_static(batch, adapter.base)


def _roll_if_static(batch: Batch, base: str) -> None:
    """A base whose engine loads adapters only at start gets new replicas for the new list
    (make-before-break, as for a changed spec); the others load it where they run."""
    model: Model | None = batch.model(base)
    if model is None or loads_at_run_time(model.spec.engine, model.spec.env):
        return
    if model.updated_at == batch.now:
        return
    batch.put_model(dataclasses.replace(model, updated_at=batch.now))
    batch.event("model.updated", "model", base, "adapters changed; replicas roll over", model=base)
