"""Node commands: cordon, uncordon, drain (which waits, with progress, until the node is empty)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from llmgw.adminclient.client import AdminClient
from llmgw.adminclient.errors import AdminError
from llmgw.ctl import drainview
from llmgw.ctl.context import Ctx
from llmgw.ctl.errors import CtlError, DrainTimeout
from llmgw.ctl.shown import visible
from llmgw.runtime.clock import Clock
from llmgw.wire.admin import DrainWait, NodeView, ReplicaView

# Replica states that still hold a node's cards. A failed replica is restarted
# elsewhere (never on a draining node), and a stopped one holds nothing.
HOLDING = frozenset({"pending", "starting", "ready", "draining"})


def _said(ctx: Ctx, node: NodeView, verb: str) -> int:
    ctx.out.write(visible(f"node {node.name} {verb} (state {node.state})") + "\n")
    return 0


def cordon(args: argparse.Namespace, ctx: Ctx) -> int:
    return _said(ctx, ctx.client().cordon(args.node), "cordoned")


def uncordon(args: argparse.Namespace, ctx: Ctx) -> int:
    return _said(ctx, ctx.client().uncordon(args.node), "uncordoned")


def on_node(replicas: list[ReplicaView], node: str) -> list[ReplicaView]:
    """Replicas that still hold cards on `node`, by id."""
    return [r for r in replicas if r.state in HOLDING and any(s.node == node for s in r.shards)]


def wait_node_empty(
    client: AdminClient,
    node: str,
    *,
    timeout_s: float,
    clock: Clock,
    sleep: Callable[[float], None],
    poll_s: float = 0.5,
    on_progress: Callable[[list[ReplicaView]], None] = lambda _left: None,
) -> None:
    """Return once no live replica holds cards on `node`; DrainTimeout after `timeout_s`."""
    deadline = clock.monotonic() + timeout_s
    while True:
        left = on_node(client.replicas(), node)
        on_progress(left)
        if not left:
            return
        if clock.monotonic() >= deadline:
            ids = ", ".join(r.id for r in left[:5]) + (", …" if len(left) > 5 else "")
            raise DrainTimeout(
                f"node {node} still holds {len(left)} replica(s) after {timeout_s:g}s: {ids}"
            )
        sleep(min(poll_s, max(0.0, deadline - clock.monotonic())))


def _waits(client: AdminClient, node: str) -> tuple[DrainWait, ...] | None:
    """What the drain waits for now; None when the lookup failed (the next poll tries again)."""
    try:
        return client.node(node).drain_waiting
    except AdminError:
        return None


def _blocked(client: AdminClient, node: str) -> str:
    """Why the drain cannot finish, when no replacement fits somewhere; '' otherwise."""
    waits = [w for w in _waits(client, node) or () if w.blocked]
    if not waits:
        return ""  # the timeout is the news; a failed lookup must not hide it
    shown = "; ".join(f"{w.replica} ({w.model}): {w.reason}" for w in waits[:3])
    more = f" (and {len(waits) - 3} more)" if len(waits) > 3 else ""
    return f"; {shown}{more}"


def drain(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.timeout < 0:
        raise CtlError("--timeout must not be negative")
    client = ctx.client()
    view = client.drain(
        args.node, grace_s=args.grace_s, force=args.force, evict_idle=args.evict_idle
    )
    if args.no_wait:
        return _said(ctx, view, "draining")
    start = len(on_node(client.replicas(), args.node))
    began = ctx.clock.monotonic()
    if ctx.is_terminal():
        from rich.live import Live

        with Live(console=ctx.console(), transient=True, auto_refresh=False) as live:

            def show(left: list[ReplicaView]) -> None:
                waits = _waits(client, args.node) or ()
                total = max(start, len(left))
                screen = drainview.drain_screen(
                    args.node,
                    moved=total - len(left),
                    total=total,
                    waits=waits,
                    elapsed_s=ctx.clock.monotonic() - began,
                )
                live.update(screen, refresh=True)

            _wait(client, args, ctx, show)
    else:
        # Piped: a line when what a replica waits for changes, and when it has moved.
        seen: dict[str, str] = {}

        def lines(left: list[ReplicaView]) -> None:
            nonlocal seen
            waits = _waits(client, args.node)
            if waits is None:
                return
            out, seen = drainview.change_lines(seen, waits, [r.id for r in left])
            for line in out:
                ctx.out.write(f"{line}\n")  # drainview made it visible
            ctx.out.flush()

        _wait(client, args, ctx, lines)
    ctx.out.write(visible(f"node {args.node} drained ({start} replica(s) moved)") + "\n")
    return 0


def _wait(
    client: AdminClient,
    args: argparse.Namespace,
    ctx: Ctx,
    on_progress: Callable[[list[ReplicaView]], None],
) -> None:
    try:
        wait_node_empty(
            client,
            args.node,
            timeout_s=args.timeout,
            clock=ctx.clock,
            sleep=ctx.sleep,
            on_progress=on_progress,
        )
    except DrainTimeout as exc:
        raise DrainTimeout(f"{exc}{_blocked(client, args.node)}") from None
