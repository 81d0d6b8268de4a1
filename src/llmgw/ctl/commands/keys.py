"""Client key commands: `keys create`, `keys list`, `keys revoke` (docs/tenants.md).

`keys create` prints the key alone on its last line (the only time it is shown),
so `KEY=$(llmgw ctl keys create … | tail -1)` works; `-o json` prints the
controller's answer with the key in it.
"""

from __future__ import annotations

import argparse
import re

import msgspec
from rich.table import Table

from llmgw.ctl import output, specs
from llmgw.ctl.context import Ctx
from llmgw.ctl.durations import duration_problem, seconds_of
from llmgw.ctl.errors import CtlError
from llmgw.ctl.render import UNKNOWN, fmt_duration
from llmgw.ctl.shown import text, visible
from llmgw.ctl.tables import frameless, keep_whole
from llmgw.wire.keys import MAX_EXPIRES_IN_S, KeyCreate, KeyView
from llmgw.wire.names import LABEL_RULE, MODEL_NAME_RULE


def parse_duration(text: str) -> float:
    """Seconds in `--expires-in`: a number with a unit (s, m, h, d, w), e.g. `90d` or `1h30m`."""
    why = duration_problem(text)
    if why is not None:
        raise CtlError(f"--expires-in {text!r}: {why}")
    return seconds_of(text)


def keys(args: argparse.Namespace, ctx: Ctx) -> int:
    sub = args.keys_command
    if sub == "create":
        return create(args, ctx)
    if sub == "list":
        return list_keys(args, ctx)
    if sub == "revoke":
        return revoke(args, ctx)
    raise CtlError("keys: give a subcommand: create, list or revoke")


def _request(args: argparse.Namespace) -> KeyCreate:
    if (args.budget_tokens is None) != (args.per is None):
        raise CtlError("keys create: --budget-tokens and --per go together")
    fields: dict[str, object] = {"name": args.name, "team": args.team}
    if args.models is not None:
        fields["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
        if not fields["models"]:
            raise CtlError("keys create: --models names no model (omit it for every model)")
    for flag in ("rpm", "tpm", "priority"):
        if getattr(args, flag) is not None:
            fields[flag] = getattr(args, flag)
    if args.per is not None:
        fields["budget"] = {"tokens": args.budget_tokens, "per": args.per}
    if args.expires_in is not None:
        fields["expires_in_s"] = parse_duration(args.expires_in)
    try:
        return msgspec.convert(fields, KeyCreate)
    except msgspec.ValidationError as exc:
        raise CtlError(f"keys create {args.name}: {_problem(exc, fields)}") from exc


# Request fields whose flag is spelled otherwise; NAME is the positional argument.
_FLAGS = {"budget": "--budget-tokens", "expires_in_s": "--expires-in", "name": "NAME"}


def _problem(exc: msgspec.ValidationError, fields: dict[str, object]) -> str:
    """A validation message in the flags the operator typed: `--rpm: Expected int >= 1`."""
    message = str(exc)
    if message.startswith("models "):
        # KeyLimits' own check (a repeated name): msgspec gives it no path.
        return f"--models: {message}"
    m = re.fullmatch(r"(.*) - at `\$\.(\w+)(?:\[(\d+)\]|\.(\w+))?`", message)
    if m is None:
        return specs.describe(exc)
    field = m.group(2)
    flag = _FLAGS.get(field, "--" + field.replace("_", "-"))
    if field in ("name", "team") and "regex" in m.group(1):
        return f"{flag}: {LABEL_RULE}"
    if field == "expires_in_s" and "<=" in m.group(1):
        # msgspec says it in seconds; the flag was given in days or weeks.
        return f"{flag}: at most {MAX_EXPIRES_IN_S // 86400}d (a hundred years)"
    models = fields.get("models")
    if field == "models" and m.group(3) is not None and isinstance(models, list):
        given = visible(repr(models[int(m.group(3))]))
        return f"{flag}: {given} is not a model's name: {MODEL_NAME_RULE}"
    return f"{flag}: {m.group(1).replace('`', '')}"


def create(args: argparse.Namespace, ctx: Ctx) -> int:
    created = ctx.client().create_key(_request(args))
    if ctx.format(json_flag=args.json) == "json":
        ctx.print_answer()
        return 0
    ctx.out.write(
        visible(f"key {created.name} of team {created.team} created; it is shown only once:") + "\n"
    )
    # Made visible too: the controller's key is data from the network, and one holding
    # OSC 52 would set the operator's clipboard. A key the controller makes is URL-safe
    # base64, which `visible` leaves as it is.
    ctx.out.write(visible(created.key) + "\n")
    return 0


def revoke(args: argparse.Namespace, ctx: Ctx) -> int:
    answer = ctx.client().revoke_key(args.name)
    if ctx.format(json_flag=args.json) == "json":
        ctx.print_answer()
        return 0
    ctx.out.write(visible(f"key {answer.revoked} revoked; routers refuse it within seconds") + "\n")
    return 0


def leases_cell(v: KeyView) -> str:
    """How a key's limit is split now: `3 (max 52%)`, the routers holding a share and
    the largest one's part of what is leased (of its rpm, else tpm, else budget);
    `-` for a key with no limit or no shares yet."""
    if not v.shares:
        return UNKNOWN
    sh = v.shares
    for values in ([x.rpm for x in sh], [x.tpm for x in sh], [x.budget for x in sh]):
        got = [x for x in values if x is not None]
        if got:
            total = sum(got)
            if total <= 0.0:
                return f"{len(sh)} (none leased)"
            return f"{len(sh)} (max {max(got) / total:.0%})"
    return UNKNOWN


def keys_table(views: list[KeyView], *, now: float) -> Table:
    t = frameless()
    for col in (
        "NAME",
        "TEAM",
        "MODELS",
        "RPM",
        "TPM",
        "BUDGET",
        "PRIORITY",
        "EXPIRES",
        "LEASES",
    ):
        t.add_column(col)
    # NAME is what `keys revoke NAME` takes back: never cut (the other columns give way;
    # `-o wide` or `-o json` shows them whole).
    keep_whole(t, 0, [visible(v.name) for v in views])
    for v in views:
        budget = UNKNOWN if v.budget is None else f"{v.budget.tokens}/{v.budget.per}"
        if v.expires_at is None:
            expires = "never"
        elif v.expires_at <= now:
            expires = "expired"
        else:
            expires = "in " + fmt_duration(v.expires_at - now)
        # Text cells: a str cell is rich markup, and a key's models are not checked names;
        # nor are the band and budget period of a newer controller (read as strings).
        t.add_row(
            text(v.name),
            text(v.team),
            text(",".join(v.models)) if v.models else "*",
            UNKNOWN if v.rpm is None else str(v.rpm),
            UNKNOWN if v.tpm is None else str(v.tpm),
            text(budget),
            text(v.priority),
            expires,
            leases_cell(v),
        )
    return t


def list_keys(args: argparse.Namespace, ctx: Ctx) -> int:
    views = ctx.client().keys()
    fmt = ctx.format(json_flag=args.json)
    if fmt == "json":
        ctx.print_answer()
        return 0
    table = keys_table(views, now=ctx.clock.wall())
    fmt = output.fit(fmt, table, ctx.err)
    if fmt in ("wide", "tsv"):
        if views or fmt == "tsv":
            output.write_table(ctx.out, table, fmt)
        else:
            ctx.err.write("no keys\n")
        return 0
    ctx.console().print(table if views else "no keys")
    return 0
