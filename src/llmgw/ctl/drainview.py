"""What a drain waits for, in words: `ctl drain`'s live view and lines, `status`, `nodes`.

Every function here is pure (views in, text out) so the wording is tested alone.
Names and reasons from the fleet are made visible (`shown`) in every line.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.text import Text

from llmgw.ctl.shown import visible
from llmgw.wire.admin import DrainWait, NodeView


def wait_text(w: DrainWait) -> str:
    """`r-1 (m): reason`, with `blocked: ` first when nothing changes without room or --force."""
    blocked = "blocked: " if w.blocked else ""
    return visible(f"{w.replica} ({w.model}): {blocked}{w.reason}")


def waits_cell(node: NodeView) -> str:
    """The nodes table's WAITING FOR cell: what a draining node's drain waits for, or ''."""
    if node.state != "draining" and not node.drain_waiting:
        return ""
    if not node.drain_waiting:
        return "replicas stopping" if node.state == "draining" else ""
    return "; ".join(wait_text(w) for w in node.drain_waiting)


def change_lines(
    before: dict[str, str], after: Sequence[DrainWait], left: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """The lines a piped drain prints for one poll, and the new state to compare with.

    `before` maps replica → what it waited for at the last poll; `left` is the
    replicas still on the node. A replica whose reason changed gets a line; one
    that left the node gets `moved`.
    """
    now = {w.replica: wait_text(w) for w in after}
    lines = [text for rid, text in now.items() if before.get(rid) != text]
    still = set(left)
    lines += [f"{visible(rid)}: moved" for rid in before if rid not in still and rid not in now]
    # A replica that left must not be reported moved twice: drop it from the state.
    state = {**{rid: t for rid, t in before.items() if rid in still}, **now}
    return lines, state


def drain_screen(
    node: str, *, moved: int, total: int, waits: Sequence[DrainWait], elapsed_s: float
) -> RenderableType:
    """The live view in a terminal: progress, then one line per replica still waited for."""
    head = Text(
        f"draining {visible(node)}: {moved}/{total} replicas moved · {elapsed_s:.0f}s", style="bold"
    )
    rows = [Text(f"  {wait_text(w)}", style="red" if w.blocked else "") for w in waits]
    if any(w.blocked for w in waits):
        rows.append(
            Text(
                "  blocked replicas keep serving; --evict-idle makes room from idle replicas "
                "of other models, --force drains them anyway (capacity drops)",
                style="dim",
            )
        )
    return Group(head, *rows)


def draining_block(nodes: Sequence[NodeView]) -> RenderableType | None:
    """`ctl status`'s Draining section: each draining node and what blocks it; None if none."""
    draining = [n for n in nodes if n.state == "draining"]
    if not draining:
        return None
    lines: list[RenderableType] = [Text(f"Draining ({len(draining)} nodes)", style="bold yellow")]
    # One screen at any fleet size: a few nodes, and of each only what blocks it (the
    # rest is in `ctl nodes` and `ctl drain NODE`).
    for n in draining[:STATUS_NODES]:
        blocked = [w for w in n.drain_waiting if w.blocked]
        what = f"{len(n.drain_waiting)} replica(s) waited for" + (
            f", {len(blocked)} blocked" if blocked else ""
        )
        lines.append(
            Text(f"  {visible(n.name)}  {what if n.drain_waiting else 'replicas stopping'}")
        )
        lines += [Text(f"    {wait_text(w)}", style="red") for w in blocked[:STATUS_WAITS]]
        if len(blocked) > STATUS_WAITS:
            lines.append(Text(f"    …and {len(blocked) - STATUS_WAITS} more blocked", style="dim"))
    if len(draining) > STATUS_NODES:
        more = len(draining) - STATUS_NODES
        lines.append(Text(f"  …and {more} more (ctl nodes)", style="dim"))
    return Group(*lines)


# What `ctl status` shows of drains: this many nodes, this many blocked replicas each.
STATUS_NODES = 3
STATUS_WAITS = 2
