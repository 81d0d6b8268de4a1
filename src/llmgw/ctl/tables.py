"""Pure tables for `ctl nodes | models | replicas | events`: wire views in, rich Tables out.

Every cell that may be unknown goes through render's `idle_cell`/`age_cell`, so
`-` is written in one place and an unreported idle time can never read as 0.
Every cell that holds fleet data is a `shown.text`: its control and bidi
characters visible, never parsed as markup (a `str` cell would be), and the
same in every -o format, since wide and tsv read the cells' plain text.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from llmgw.ctl.drainview import waits_cell
from llmgw.ctl.render import UNKNOWN, age_cell, fmt_count, idle_cell
from llmgw.ctl.shown import text, visible
from llmgw.wire.admin import EventView, ModelView, NodeView, ReplicaView

_STATE_STYLE = {
    "ready": "green",
    "cordoned": "yellow",
    "draining": "yellow",
    "unreachable": "bold red",
    "pending": "cyan",
    "starting": "cyan",
    "stopped": "dim",
    "failed": "bold red",
    "sleeping": "blue",
    "waking": "cyan",
}


def _state(state: str) -> Text:
    return text(state, _STATE_STYLE.get(state, ""))


def frameless() -> Table:
    """The look of every ctl table: no rules or borders, bold headers, two spaces
    between columns. One place, so a new table cannot come out boxed while the
    others (and the docs' examples of them) are not."""
    return Table(box=None, header_style="bold", pad_edge=False, padding=(0, 2, 0, 0))


def _table(*headers: str) -> Table:
    table = frameless()
    for h in headers:
        table.add_column(h, no_wrap=True, overflow="ellipsis")
    return table


def keep_whole(table: Table, column: int, values: Sequence[str]) -> None:
    """Never cut this column, header included: it holds the names operators pass
    back to ctl (`ctl bench REPLICA`, `ctl drain NODE`), and a cut name cannot be
    pasted; or a short figure that a narrow terminal would otherwise squeeze to
    nothing (rich takes width from every column, the narrow ones first)."""
    if values:
        header = str(table.columns[column].header)
        table.columns[column].min_width = max(len(header), *(len(v) for v in values))


def nodes_table(nodes: Sequence[NodeView], *, now: float) -> Table:
    """One row per node: state, class, GPUs used/free/unhealthy, fabrics, heartbeat age."""
    table = _table("NODE", "STATE", "CLASS", "USED", "FREE", "UNHEALTHY", "FABRICS", "HEARTBEAT")
    rows = [
        (
            n,
            f"{n.gpu_total - n.gpu_free - len(n.unhealthy)}/{n.gpu_total}",
            str(n.gpu_free),
            str(len(n.unhealthy)),
            age_cell(n.last_heartbeat, now) + ("" if n.last_heartbeat is None else " ago"),
        )
        for n in nodes
    ]
    keep_whole(table, 0, [visible(n.name) for n in nodes])
    keep_whole(table, 1, [visible(n.state) for n in nodes])
    # Classes and fabrics give way in a narrow terminal (see replicas_table).
    for column in (2, 6):
        table.columns[column].no_wrap = False
    keep_whole(table, 3, [used for _, used, _, _, _ in rows])
    keep_whole(table, 4, [free for _, _, free, _, _ in rows])
    keep_whole(table, 5, [unhealthy for _, _, _, unhealthy, _ in rows])
    keep_whole(table, 7, [heartbeat for _, _, _, _, heartbeat in rows])
    # What a draining node's drain waits for (drainview.waits_cell); the column
    # is there only while some node drains.
    draining = any(n.state == "draining" for n in nodes)
    if draining:
        table.add_column("WAITING FOR", no_wrap=False, overflow="fold")
    for n, used, free, unhealthy, heartbeat in rows:
        cells: list[str | Text] = [
            text(n.name),
            _state(n.state),
            _one_line(text(",".join(n.classes) or UNKNOWN)),
            used,
            free,
            Text(unhealthy, style="bold red" if n.unhealthy else "dim"),
            _one_line(text(",".join(n.fabrics) or UNKNOWN)),
            heartbeat,
        ]
        if draining:
            blocked = any(w.blocked for w in n.drain_waiting)
            cells.append(text(waits_cell(n), "red" if blocked else ""))
        table.add_row(*cells)
    return table


def model_status(m: ModelView) -> Text:
    """`ok`, `short` (still starting), or `unplaceable: <the controller's reason>`."""
    if m.unplaceable_reason:
        return text(f"unplaceable: {m.unplaceable_reason}", "bold red")
    if m.ready < m.min:
        return Text("short", style="yellow")
    return Text("ok", style="green")


def models_table(models: Sequence[ModelView]) -> Table:
    """One row per model: engine, GPUs per replica, ready/desired, bounds, status."""
    table = _table("MODEL", "ENGINE", "GPUS", "READY", "MIN..MAX", "PRIORITY", "STATUS")
    table.columns[-1].max_width = 70
    keep_whole(
        table,
        0,
        [
            *(visible(m.name) for m in models),
            *(_under(visible(a.name)) for m in models for a in m.adapters),
        ],
    )
    for m in models:
        spec = m.spec
        shape = f"{spec.gpus_per_node}" if spec.nodes == 1 else f"{spec.nodes}x{spec.gpus_per_node}"
        table.add_row(
            text(m.name),
            text(spec.engine),
            shape,
            f"{m.ready}/{m.desired}",
            f"{m.min}..{m.max}",
            str(spec.priority),
            model_status(m),
        )
        # Adapters under their base: its replicas serve them.
        for a in m.adapters:
            under = text(_under(a.name))
            table.add_row(under, "lora", "", "", "", "", text(f"adapter of {m.name}"))
    return table


def _under(name: str) -> str:
    return f"└ {name}"


def _one_line(text: Text) -> Text:
    """A cell that never wraps, cut with an ellipsis, even in a wrappable column."""
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def shards_cell(r: ReplicaView) -> str:
    """`node:gpu,gpu` for each shard, rank order."""
    if not r.shards:
        return UNKNOWN
    ranked = sorted(r.shards, key=lambda s: s.rank)
    return " ".join(f"{s.node}:{','.join(str(g) for g in s.gpus)}" for s in ranked)


def replicas_table(replicas: Sequence[ReplicaView]) -> Table:
    """One row per replica; IDLE is `-` when no router has reported it, never 0."""
    table = _table("REPLICA", "MODEL", "STATE", "SHARDS", "ENDPOINT", "IDLE", "WEIGHT", "RESTARTS")
    table.columns[3].max_width = 40
    # Model, state's reason, shards and endpoint give way in a narrow terminal:
    # rich shrinks only wrappable columns to fit, and otherwise cuts every column
    # evenly, which squeezed STATE and IDLE to nothing. Shards wrap one per line;
    # the other cells are single-line Texts that end in an ellipsis; min widths
    # keep ids, states and figures whole.
    for column in (1, 2, 3, 4):
        table.columns[column].no_wrap = False
    idle = [idle_cell(r.idle_seconds) for r in replicas]
    weight = [f"{r.weight:.2f}" for r in replicas]
    restarts = [fmt_count(r.restarts) for r in replicas]
    keep_whole(table, 0, [visible(r.id) for r in replicas])
    keep_whole(table, 2, [visible(r.state) for r in replicas])
    keep_whole(table, 5, idle)
    keep_whole(table, 6, weight)
    keep_whole(table, 7, restarts)
    for r, idle_, weight_, restarts_ in zip(replicas, idle, weight, restarts, strict=True):
        state = _state(r.state)
        if r.reason and r.state in ("failed", "draining"):
            state.append(f" ({visible(r.reason)})", style="dim")
        elif r.state == "sleeping" and any(s.state in ("starting", "ready") for s in r.shards):
            # Told to sleep, its engine not asleep yet: it still holds its cards.
            state.append(" (falling asleep)", style="dim")
        table.add_row(
            text(r.id),
            _one_line(text(r.model)),
            _one_line(state),
            text(shards_cell(r)),
            _one_line(text(r.endpoint_url or UNKNOWN)),
            idle_,
            weight_,
            restarts_,
        )
    return table


def event_time(at: float) -> str:
    """Local wall time of an event, to the second; `-` for a time no clock can show."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    except (OverflowError, ValueError, OSError):
        return UNKNOWN  # NaN, or past the platform's time_t: a broken answer, not a crash


# The table's message column: the first sentence-ish part, one line. Replica
# failures carry the engine's log tail after " | "-joined lines; that and
# anything past this many characters is in `ctl events --detail ID` / --json.
EVENT_MESSAGE_CHARS = 120


def event_summary(message: str) -> str:
    """One line of an event's message; cut ones end in `…` (the whole is in --detail)."""
    first = " ".join(message.split("\n", 1)[0].split())
    cut = first.split(" | ", 1)[0]
    if len(cut) > EVENT_MESSAGE_CHARS:
        cut = cut[: EVENT_MESSAGE_CHARS - 1].rstrip() + "…"
    elif cut != " ".join(message.split()):
        cut += " …"
    return cut


def events_table(events: Sequence[EventView]) -> Table:
    """Oldest first, as the controller sends them: one line per event, ids for --detail."""
    table = _table("ID", "TIME", "KIND", "SUBJECT", "MODEL", "MESSAGE")
    keep_whole(table, 0, [str(e.id) for e in events])
    for e in events:
        table.add_row(
            str(e.id),
            event_time(e.at),
            text(e.kind),
            text(f"{e.subject} {e.subject_id}"),
            text(e.model or UNKNOWN),
            _one_line(text(event_summary(e.message))),
        )
    return table


def event_detail(e: EventView) -> str:
    """`ctl events --detail ID`: every field, the message whole, log-tail lines one per line."""
    lines = [
        f"id       {e.id}",
        f"time     {event_time(e.at)}",
        f"kind     {visible(e.kind)}",
        f"subject  {visible(e.subject)} {visible(e.subject_id)}",
        f"model    {visible(e.model or UNKNOWN)}",
    ]
    head, _, tail = e.message.partition(": ")
    parts = tail.split(" | ") if " | " in tail else []
    if parts:
        lines.append(f"message  {visible(head)}:")
        lines += [f"  {visible(p)}" for p in parts]
    else:
        lines.append(f"message  {visible(e.message)}")
    return "\n".join(lines) + "\n"
