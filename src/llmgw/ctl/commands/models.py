"""Model commands: apply -f (validated locally, sent in one call), delete, scale."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from llmgw.ctl import specs
from llmgw.ctl.context import Ctx
from llmgw.ctl.errors import CtlError
from llmgw.ctl.shown import visible
from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.models import ModelSpec, ScaleRequest


def _load(file: str) -> list[ModelSpec | AdapterSpec]:
    if file == "-":
        source = "<stdin>"
        text = specs.read_text(sys.stdin.buffer, source)
        return specs.validate(specs.parse_documents(text, source), source)
    return specs.load_specs(Path(file))


def apply(args: argparse.Namespace, ctx: Ctx) -> int:
    # Validate everything before the first byte goes out: the controller is
    # all-or-nothing too, but a local error can name the file it came from.
    model_specs = _load(args.file)
    if args.dry_run:
        names = ", ".join(s.name for s in model_specs)
        ctx.out.write(
            visible(f"{args.file}: {len(model_specs)} valid model spec(s): {names}") + "\n"
        )
        return 0
    for spec, view in zip(model_specs, ctx.client().apply(model_specs), strict=False):
        if isinstance(spec, AdapterSpec):
            line = f"adapter {spec.name} of {view.name} applied (base ready {view.ready}/"
            ctx.out.write(visible(line + f"{view.desired})") + "\n")
            continue
        line = f"model {view.name} applied (ready {view.ready}/{view.desired})"
        if view.unplaceable_reason:
            line += f"; unplaceable: {view.unplaceable_reason}"
        ctx.out.write(visible(line) + "\n")
    return 0


def delete(args: argparse.Namespace, ctx: Ctx) -> int:
    answer = ctx.client().delete_entry(args.model)
    name = answer.get("deleted", args.model)
    base = answer.get("adapter_of")
    if base is not None:
        ctx.out.write(visible(f"adapter {name} of {base} deleted") + "\n")
        return 0
    ctx.out.write(visible(f"model {name} deleted; its replicas drain") + "\n")
    return 0


def scale(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.min_replicas is None and args.max_replicas is None:
        raise CtlError("scale: give --min, --max or both")
    given = {"min_replicas": args.min_replicas, "max_replicas": args.max_replicas}
    try:
        request = msgspec.convert({k: v for k, v in given.items() if v is not None}, ScaleRequest)
    except msgspec.ValidationError as exc:
        raise CtlError(f"scale {args.model}: {specs.describe(exc)}") from exc
    if (
        args.min_replicas is not None
        and args.max_replicas is not None
        and args.max_replicas < args.min_replicas
    ):
        raise CtlError(f"scale: --max {args.max_replicas} is below --min {args.min_replicas}")
    view = ctx.client().scale(args.model, request)
    ctx.out.write(
        visible(
            f"model {view.name} scaled to {view.min}..{view.max} "
            f"(desired {view.desired}, ready {view.ready})"
        )
        + "\n"
    )
    return 0
