"""`ctl usage [--by key|team|model] [--since DURATION] [--limit N]`: token usage by hour.

The controller sums what every router counted; this renders its rows as they
come (by hour, then by name), one line each. `-o json` prints the controller's
answer: `{"by", "since", "rows": [{"hour", "key"?, "team"?, "model"?, "requests",
"prompt_tokens", "completion_tokens"}], "truncated"}` (docs/tenants.md).
"""

from __future__ import annotations

import argparse
import time

from rich.table import Table

from llmgw.ctl import output
from llmgw.ctl.context import Ctx
from llmgw.ctl.render import UNKNOWN
from llmgw.ctl.shown import text
from llmgw.ctl.tables import frameless
from llmgw.wire.usage import UsageAnswer

# The name columns of each grouping, and the row fields they show.
_NAMES = {"key": ("KEY", "TEAM"), "team": ("TEAM",), "model": ("MODEL",)}


def hour_cell(hour: int) -> str:
    """The UTC hour a row counts: `2026-12-06 03:00`; `-` for an hour no clock can show."""
    try:
        return time.strftime("%Y-%m-%d %H:00", time.gmtime(hour))
    except (OverflowError, ValueError, OSError):
        return UNKNOWN  # past the platform's time_t: a broken answer, not a crash


def usage_table(answer: UsageAnswer) -> Table:
    t = frameless()
    names = _NAMES[answer.by]
    t.add_column("HOUR (UTC)")
    for col in names:
        t.add_column(col)
    for col in ("REQUESTS", "PROMPT", "COMPLETION", "TOTAL"):
        t.add_column(col, justify="right")
    for r in answer.rows:
        cells = {"KEY": r.key, "TEAM": r.team, "MODEL": r.model}
        t.add_row(
            hour_cell(r.hour),
            # "" is a router file's key without a team: shown as such, not as nothing.
            # Text, not str: a router file's key names are free text, and a str is markup.
            *(text(cells[n] or "(none)") for n in names),
            str(r.requests),
            str(r.prompt_tokens),
            str(r.completion_tokens),
            str(r.prompt_tokens + r.completion_tokens),
        )
    return t


def usage(args: argparse.Namespace, ctx: Ctx) -> int:
    answer = ctx.client().usage(by=args.by, since_s=args.since, limit=args.limit)
    fmt = ctx.format(json_flag=args.json)
    if fmt == "json":
        ctx.print_answer()
        return 0
    if answer.truncated:
        asked = "the controller's default limit" if args.limit is None else f"--limit {args.limit}"
        ctx.err.write(
            f"more rows than {asked}: showing the newest, from {hour_cell(answer.since)} UTC; "
            "raise --limit or shorten --since for the rest\n"
        )
    if not answer.rows and fmt != "tsv":
        ctx.err.write(f"no usage since {hour_cell(answer.since)} UTC\n")
        return 0
    table = usage_table(answer)
    fmt = output.fit(fmt, table, ctx.err)
    if fmt in ("wide", "tsv"):
        output.write_table(ctx.out, table, fmt)
        return 0
    ctx.console().print(table)
    return 0
