"""Node commands: cordon, uncordon, drain (which waits, with progress, until the node is empty)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from llmgw.adminclient.client import AdminClient
from llmgw.adminclient.errors import AdminError
from llmgw.ctl.context import Ctx
from llmgw.ctl.errors import CtlError, DrainTimeout
from llmgw.runtime.clock import Clock
from llmgw.wire.admin import NodeView, ReplicaView

# Replica states that still hold a node's cards. A failed replica is restarted
# elsewhere (never on a draining node), and a stopped one holds nothing.
HOLDING = frozenset({"pending", "starting", "ready", "draining"})


def _said(ctx: Ctx, node: NodeView, verb: str) -> int:
    ctx.out.write(f"node {node.name} {verb} (state {node.state})\n")
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


def _blocked(client: AdminClient, node: str) -> str:
    """Why the drain cannot finish, when no replacement fits somewhere; '' otherwise."""
    try:
        waits = [w for w in client.node(node).drain_waiting if w.blocked]
    except AdminError:
        return ""  # the timeout is the news; a failed lookup must not hide it
    if not waits:
        return ""
    first = waits[0]
    more = f" (and {len(waits) - 1} more)" if len(waits) > 1 else ""
    return f"; {first.replica} ({first.model}): {first.reason}{more}"


def drain(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.timeout < 0:
        raise CtlError("--timeout must not be negative")
    client = ctx.client()
    view = client.drain(args.node, grace_s=args.grace_s, force=args.force)
    if args.no_wait:
        return _said(ctx, view, "draining")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    start = len(on_node(client.replicas(), args.node))
    columns = (
        TextColumn(f"draining {args.node}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("replicas moved"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=ctx.console(), transient=True) as progress:
        task = progress.add_task("drain", total=max(start, 1))

        def show(left: list[ReplicaView]) -> None:
            total = max(start, len(left), 1)
            progress.update(task, total=total, completed=total - len(left) if start else 1)

        try:
            wait_node_empty(
                client,
                args.node,
                timeout_s=args.timeout,
                clock=ctx.clock,
                sleep=ctx.sleep,
                on_progress=show,
            )
        except DrainTimeout as exc:
            raise DrainTimeout(f"{exc}{_blocked(client, args.node)}") from None
    ctx.out.write(f"node {args.node} drained ({start} replica(s) moved)\n")
    return 0
