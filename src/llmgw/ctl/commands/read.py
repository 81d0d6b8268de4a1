"""Read commands: status, nodes, models, replicas, events. Each has `--json` (docs/ctl.md).

`--json` prints the controller's own wire value re-encoded from `llmgw.wire`
types, so its shape is the documented contract and not whatever a newer
controller happens to add.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from llmgw.adminclient.errors import AdminError
from llmgw.ctl import drainview, output, render, tables
from llmgw.ctl.context import Ctx
from llmgw.ctl.errors import CtlError
from llmgw.ctl.shown import text


def status_screen(ctx: Ctx) -> RenderableType:
    """Fetch the summary (and, only if needed, the reasons it lacks) and render it."""
    client = ctx.client()
    summary = client.summary()
    reasons: dict[str, str] = {}
    missing = set(summary.unplaceable) - set(render.unplaceable_reasons(summary))
    if missing:
        # An older summary names unplaceable models without reasons; the models
        # list carries them, and "why is my model not running" needs the why.
        reasons = {
            m.name: m.unplaceable_reason
            for m in client.models()
            if m.name in missing and m.unplaceable_reason
        }
    clock = time.strftime("%H:%M:%S", time.localtime(ctx.clock.wall()))
    screen = render.status_view(
        summary, title=f"llmgw fleet · {ctx.url} · {clock}", reasons=reasons
    )
    if summary.nodes.draining:
        # Which nodes drain and what blocks them: the node list carries it.
        block = drainview.draining_block(client.nodes())
        if block is not None:
            return Group(screen, Text(""), block)
    return screen


# The status screen piped (-o wide): wide enough that no name or reason is cut.
WIDE_STATUS_COLUMNS = 200


def status(args: argparse.Namespace, ctx: Ctx) -> int:
    fmt = ctx.format(json_flag=args.json)
    if fmt == "tsv":
        raise CtlError("status is a screen: use -o table, wide or json")
    if fmt == "json":
        if args.watch:
            raise CtlError("--watch and --json do not combine")
        ctx.client().summary()
        ctx.print_answer()
        return 0
    if not args.watch:
        console = ctx.console()
        if fmt == "wide" and ctx.width is None:
            console.width = WIDE_STATUS_COLUMNS
        console.print(status_screen(ctx))
        return 0
    if args.interval <= 0:
        raise CtlError("--interval must be above 0")
    return watch(ctx, interval_s=args.interval)


def watch(ctx: Ctx, *, interval_s: float) -> int:
    """Refresh the status screen in place until Ctrl-C; a lost controller is shown, not fatal."""
    from rich.live import Live

    screen = status_screen(ctx)  # the first answer must come, or there is nothing to watch
    try:
        with Live(screen, console=ctx.console(), auto_refresh=False) as live:
            while True:
                ctx.sleep(interval_s)
                try:
                    screen = status_screen(ctx)
                except AdminError as exc:
                    # The controller's words may quote fleet data: made visible.
                    warning = text(f"{exc} — retrying every {interval_s:g}s", "bold red")
                    live.update(Group(warning, screen), refresh=True)
                    continue
                live.update(screen, refresh=True)
    except KeyboardInterrupt:
        return 0


def _print_table(ctx: Ctx, fmt: str, table: Table, rows: int, what: str) -> None:
    """A table in the chosen format; "no X" goes to stderr when piped (stdout stays data)."""
    fmt = output.fit(fmt, table, ctx.err)
    if fmt in ("wide", "tsv"):
        if rows:
            output.write_table(ctx.out, table, fmt)
        elif fmt == "wide":
            ctx.err.write(f"no {what}\n")
        else:
            output.write_table(ctx.out, table, fmt)  # the header alone: still a valid TSV
        return
    console = ctx.console()
    if rows:
        console.print(table)
    else:
        console.print(Text(f"no {what}", style="dim"))


def nodes(args: argparse.Namespace, ctx: Ctx) -> int:
    views = ctx.client().nodes()
    fmt = ctx.format(json_flag=args.json)
    if fmt == "json":
        ctx.print_answer()
    else:
        table = tables.nodes_table(views, now=ctx.clock.wall())
        _print_table(ctx, fmt, table, len(views), "nodes")
    return 0


def models(args: argparse.Namespace, ctx: Ctx) -> int:
    views = ctx.client().models()
    fmt = ctx.format(json_flag=args.json)
    if fmt == "json":
        ctx.print_answer()
    else:
        _print_table(ctx, fmt, tables.models_table(views), len(views), "models")
    return 0


def replicas(args: argparse.Namespace, ctx: Ctx) -> int:
    views = ctx.client().replicas(model=args.model, state=args.state)
    fmt = ctx.format(json_flag=args.json)
    if fmt == "json":
        ctx.print_answer()
    else:
        _print_table(ctx, fmt, tables.replicas_table(views), len(views), "replicas")
    return 0


def events(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.limit <= 0:
        raise CtlError("--limit must be at least 1")
    client = ctx.client()
    fmt = ctx.format(json_flag=args.json)
    if args.detail is not None:
        event = client.event(args.detail)
        if fmt == "json":
            ctx.print_answer(index=0)
        else:
            ctx.out.write(tables.event_detail(event))
        return 0
    views = client.events(model=args.model, replica=args.replica, node=args.node, limit=args.limit)
    if fmt == "json":
        ctx.print_answer()
    else:
        _print_table(ctx, fmt, tables.events_table(views), len(views), "events")
    return 0
