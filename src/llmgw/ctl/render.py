"""Pure rendering for ctl: wire values in, strings and rich renderables out.

Nothing here reads the network, the clock or the terminal: every time-dependent
cell takes `now`, and `to_text` renders to a string at a fixed width, so tests
(and the README capture) see exactly what an operator sees, without colour.

The status screen answers, on one screen at any fleet size: how full am I,
what is broken, what is holding cards nobody is using, why is my model not
running. It aggregates first, then lists
only what needs attention, each list cut at a limit with "…and N more".
Names and reasons from the fleet are `shown.text` cells: never markup, their
control and bidi characters visible.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from llmgw.ctl.shown import text, visible
from llmgw.wire.admin import ClassUse, FabricUse, IdleReplica, Summary

T = TypeVar("T")

# What a table shows for anything not known (idle time no router reported, a
# heartbeat that never came). Written here only.
UNKNOWN = "-"

BAR_USED = "█"
BAR_FREE = "░"
# Unhealthy cards get their own glyph and colour at the bar's end: counted as
# free, they are how a cluster looks like it has room it does not.
BAR_UNHEALTHY = "×"


def fmt_duration(seconds: float) -> str:
    """A duration in its largest whole unit, rounded down: `45s`, `3m`, `2h`, `3d`.

    Rounded down so an idle time is never shown longer than it is: a replica
    idle 9m59s must not read as `10m` next to the 10-minute eviction threshold.
    """
    try:
        finite = math.isfinite(seconds)
    except OverflowError:
        finite = False  # an integer past a float's range (JSON integers have no bound)
    if not finite:
        return UNKNOWN  # a broken answer's NaN, infinity or 10**400 is not a duration
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def idle_cell(idle_seconds: int) -> str:
    """The idle column: the JSON's negative "no router has reported it" becomes `-`, never 0."""
    return UNKNOWN if idle_seconds < 0 else fmt_duration(idle_seconds)


def age_cell(at: float | None, now: float) -> str:
    """How long ago a unix timestamp was, or `-` when it never happened."""
    return UNKNOWN if at is None else fmt_duration(now - at)


def fmt_count(n: int) -> str:
    return f"{n:,}"


def take(items: Sequence[T], limit: int) -> tuple[list[T], int]:
    """The first `limit` items and how many were left out."""
    shown = list(items[: max(0, limit)])
    return shown, len(items) - len(shown)


def more_line(hidden: int, detail: str = "") -> str:
    """`…and N more` (with a detail such as what they hold), or "" when nothing was cut."""
    if hidden <= 0:
        return ""
    return f"…and {fmt_count(hidden)} more" + (f" ({detail})" if detail else "")


def bar_cells(total: int, used: int, unhealthy: int, width: int) -> tuple[int, int, int]:
    """Cells for (used, free, unhealthy) in a bar `width` wide; they always sum to `width`.

    Largest remainder, then every non-zero part gets at least one cell: one bad
    card in 1,600 must still show, and a full class must not look like it has room.
    """
    if width <= 0:
        return 0, 0, 0
    parts = [max(0, used), max(0, total - used - unhealthy), max(0, unhealthy)]
    denominator = sum(parts)
    if denominator == 0:
        return 0, width, 0
    exact = [p * width / denominator for p in parts]
    cells = [int(x) for x in exact]
    by_remainder = sorted(range(3), key=lambda i: exact[i] - cells[i], reverse=True)
    for i in by_remainder[: width - sum(cells)]:
        cells[i] += 1
    for i in range(3):
        if parts[i] > 0 and cells[i] == 0:
            donor = max(range(3), key=lambda j: cells[j])
            if cells[donor] > 1:
                cells[donor] -= 1
                cells[i] = 1
    return cells[0], cells[1], cells[2]


def usage_bar(total: int, used: int, unhealthy: int, *, width: int = 30) -> Text:
    """`███░░░×`: used, then free, then unhealthy apart in red."""
    if total <= 0:
        return Text(" " * width)
    u, f, h = bar_cells(total, used, unhealthy, width)
    bar = Text()
    bar.append(BAR_USED * u, style="cyan")
    bar.append(BAR_FREE * f, style="dim")
    bar.append(BAR_UNHEALTHY * h, style="bold red")
    return bar


def to_text(renderable: RenderableType, *, width: int = 100) -> str:
    """Render as plain text (no ANSI codes) at a fixed width: tests and the README capture."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False)
    console.print(renderable)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


@dataclass(frozen=True, kw_only=True)
class StatusLimits:
    """How many rows each list on the status screen shows before "…and N more"."""

    classes: int = 6
    fabrics: int = 8
    unplaceable: int = 8
    idle: int = 8


def _counts(label: str, parts: Sequence[tuple[int, str, str]]) -> Text:
    """`Label  n a · n b …`, each count styled only when it is non-zero and worth a look."""
    line = Text()
    line.append(f"{label:<10}", style="bold")
    for i, (n, name, alarm) in enumerate(parts):
        if i:
            line.append(" · ", style="dim")
        line.append(f"{fmt_count(n)} {name}", style=alarm if n and alarm else "")
    return line


def _gpu_grid(gpus: Sequence[ClassUse], limit: int) -> RenderableType:
    if not gpus:
        return Text.assemble(("GPUs", "bold"), ("  none reported", "dim"))
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", min_width=8)
    grid.add_column()
    for _ in range(4):
        grid.add_column(justify="right")
    grid.add_row(
        Text("GPUs", style="bold"), Text("used / free / unhealthy", style="dim"),
        *(Text(h, style="dim") for h in ("used", "free", "unhealthy", "total")),
    )  # fmt: skip
    shown, hidden = take(gpus, limit)
    for c in shown:
        grid.add_row(
            text(f"  {c.gpu_class}"),
            usage_bar(c.total, c.used, c.unhealthy),
            fmt_count(c.used),
            Text(fmt_count(max(0, c.free)), style="green" if c.free > 0 else "yellow"),
            Text(fmt_count(c.unhealthy), style="bold red" if c.unhealthy else "dim"),
            fmt_count(c.total),
        )
    if hidden:
        rest = gpus[limit:]
        free = sum(max(0, c.free) for c in rest)
        grid.add_row(Text(f"  {more_line(hidden, f'{fmt_count(free)} free')}", style="dim"))
    return grid


def _fabric_grid(fabrics: Sequence[FabricUse], limit: int) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", min_width=8)
    grid.add_column(justify="right")
    grid.add_column(justify="right")
    grid.add_row(
        Text("Fabrics", style="bold"), Text("nodes", style="dim"),
        Text("free whole nodes", style="dim"),
    )  # fmt: skip
    shown, hidden = take(fabrics, limit)
    for f in shown:
        free = Text(fmt_count(f.largest_free_block), style="" if f.largest_free_block else "yellow")
        grid.add_row(text(f"  {f.fabric}"), fmt_count(f.nodes), free)
    if hidden:
        rest = fabrics[limit:]
        detail = f"{fmt_count(sum(f.nodes for f in rest))} nodes"
        grid.add_row(Text(f"  {more_line(hidden, detail)}", style="dim"))
    return grid


def _unplaceable(names: Sequence[str], reasons: Mapping[str, str], limit: int) -> RenderableType:
    if not names:
        return Text.assemble(("Unplaceable", "bold"), ("  none", "green"))
    shown, hidden = take(names, limit)
    # Names keep their width (up to a bound) and the reason gives way: a cut name
    # cannot be looked up, a cut reason still says where to look.
    name_width = min(40, max(len(visible(n)) for n in shown) + 2)
    # expand + ratio: the reason takes exactly the width left, so it is cut with
    # an ellipsis rather than cropped mid-word at the terminal's edge.
    grid = Table.grid(padding=(0, 2), expand=True)
    grid.add_column(no_wrap=True, overflow="ellipsis", min_width=name_width, max_width=name_width)
    grid.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    for name in shown:
        grid.add_row(text(f"  {name}"), text(reasons.get(name, "no reason given"), "dim"))
    heading = Text(f"Unplaceable ({fmt_count(len(names))})", style="bold red")
    cut = [Text(f"  {more_line(hidden)}", style="dim")] if hidden else []
    return Group(heading, grid, *cut)


def _idle(idle: Sequence[IdleReplica], limit: int) -> RenderableType:
    if not idle:
        return Text.assemble(("Idle ≥10m", "bold"), ("  none", "dim"))
    held = sum(r.gpus for r in idle)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True, overflow="ellipsis", max_width=40)
    grid.add_column(no_wrap=True, overflow="ellipsis", max_width=32)
    grid.add_column(justify="right")
    grid.add_column(justify="right")
    grid.add_row(*(Text(h, style="dim") for h in ("  replica", "model", "idle", "gpus")))
    shown, hidden = take(idle, limit)
    for r in shown:
        grid.add_row(text(f"  {r.id}"), text(r.model), idle_cell(r.idle_seconds), fmt_count(r.gpus))
    title = f"Idle ≥10m ({fmt_count(len(idle))} replicas holding {fmt_count(held)} GPUs)"
    cut = []
    if hidden:
        rest_gpus = sum(r.gpus for r in idle[limit:])
        cut.append(Text(f"  {more_line(hidden, f'{fmt_count(rest_gpus)} GPUs')}", style="dim"))
    return Group(Text(title, style="bold yellow"), grid, *cut)


def unplaceable_reasons(summary: Summary) -> dict[str, str]:
    """Model name → the controller's reason, from the summary's extension field."""
    return {u.model: u.reason for u in summary.unplaceable_reasons}


def status_view(
    summary: Summary,
    *,
    title: str = "",
    reasons: Mapping[str, str] | None = None,
    limits: StatusLimits = StatusLimits(),
) -> RenderableType:
    """The whole fleet on one screen: totals, then only what needs attention."""
    n, r, m = summary.nodes, summary.replicas, summary.models
    gpu_total = sum(c.total for c in summary.gpus)
    parts: list[RenderableType] = []
    if title:
        parts += [Text(title, style="bold"), Text("")]
    parts.append(
        _counts(
            "Nodes",
            [
                (n.total, "total", ""),
                (n.ready, "ready", ""),
                (n.cordoned, "cordoned", "yellow"),
                (n.draining, "draining", "yellow"),
                (n.unreachable, "unreachable", "bold red"),
            ],
        )
        + Text(f"   ({fmt_count(gpu_total)} GPUs)", style="dim")
    )
    parts += [Text(""), _gpu_grid(summary.gpus, limits.classes)]
    if summary.fabrics:
        parts += [Text(""), _fabric_grid(summary.fabrics, limits.fabrics)]
    parts += [
        Text(""),
        _counts(
            "Replicas",
            [
                (r.ready, "ready", ""),
                (r.starting, "starting", "cyan"),
                (r.draining, "draining", "yellow"),
                (r.failed, "failed", "bold red"),
                (r.sleeping, "sleeping", "blue"),
                (r.waking, "waking", "cyan"),
            ],
        ),
        _counts(
            "Models",
            [(m.total, "total", ""), (m.satisfied, "satisfied", ""), (m.short, "short", "yellow")],
        ),
        Text(""),
        _unplaceable(
            summary.unplaceable,
            {**unplaceable_reasons(summary), **(reasons or {})},
            limits.unplaceable,
        ),
        *_waiting(summary, limits.unplaceable),
        *_flow_queued(summary, limits.unplaceable),
        Text(""),
        _idle(summary.idle_replicas, limits.idle),
    ]
    return Group(*parts)


def _flow_queued(summary: Summary, limit: int) -> list[RenderableType]:
    """Requests the routers hold because every replica of their model is at capacity."""
    queued = summary.flow_queued
    if not queued:
        return []
    shown, hidden = take(queued, limit)
    grid = Table.grid(padding=(0, 2), expand=True)
    grid.add_column(no_wrap=True, min_width=10)
    grid.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    grid.add_column(justify="right", no_wrap=True)
    for q in shown:
        grid.add_row(
            text(f"  {q.band}"), text(q.team or "(no key)"), f"{fmt_count(q.requests)} req"
        )
    total = sum(q.requests for q in queued)
    heading = Text(
        f"Queued at capacity ({fmt_count(total)} requests) — by band and team", style="bold yellow"
    )
    cut = [Text(f"  {more_line(hidden)}", style="dim")] if hidden else []
    return [Text(""), heading, grid, *cut]


def _waiting(summary: Summary, limit: int) -> list[RenderableType]:
    """Models asked for that cannot be placed: their requests are being refused now."""
    waiting = summary.waiting_unplaceable
    if not waiting:
        return []
    shown, hidden = take(waiting, limit)
    grid = Table.grid(padding=(0, 2), expand=True)
    name_width = min(40, max(len(visible(w.model)) for w in shown) + 2)
    grid.add_column(no_wrap=True, overflow="ellipsis", min_width=name_width, max_width=name_width)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    for w in shown:
        grid.add_row(text(f"  {w.model}"), f"{fmt_count(w.requests)} req", text(w.reason, "dim"))
    heading = Text(
        f"Asked for, cannot place ({fmt_count(len(waiting))}) — requests refused at once",
        style="bold red",
    )
    cut = [Text(f"  {more_line(hidden)}", style="dim")] if hidden else []
    return [Text(""), heading, grid, *cut]
