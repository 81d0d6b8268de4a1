"""`ctl bench REPLICA`: measure one replica's capacity and record its routing weight."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from llmgw.adminclient.client import AdminClient
from llmgw.adminclient.errors import AdminError, AdminNotFound, AdminRejected
from llmgw.ctl import capacity
from llmgw.ctl.context import Ctx
from llmgw.ctl.errors import BenchFailed, CtlError
from llmgw.ctl.shown import visible
from llmgw.ctl.tables import frameless
from llmgw.wire.admin import ReplicaView, WeightRequest

if TYPE_CHECKING:
    from llmgw.ctl.bench import LevelProgress

Callbacks = tuple[Callable[["LevelProgress"], None], Callable[[capacity.Level], None]]


def levels_table(levels: list[capacity.Level]) -> Table:
    table = frameless()
    for h in ("CONCURRENCY", "REQ/S", "TOK/S", "P50", "P95", "OK", "FAILED"):
        table.add_column(h, justify="right")
    for lv in levels:
        table.add_row(*level_row(lv))
    return table


def level_row(lv: capacity.Level) -> list[str]:
    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}s"

    return [
        str(lv.concurrency),
        f"{lv.req_s:.1f}",
        f"{lv.tok_s:.0f}",
        secs(lv.latency_p50_s),
        secs(lv.latency_p95_s),
        str(lv.completed),
        str(lv.failed),
    ]


@contextlib.contextmanager
def _progress(console: Console, quiet: bool) -> Iterator[Callbacks]:
    """(on_start, on_level) callbacks that drive a live display, or do nothing when quiet."""
    done: list[capacity.Level] = []
    current: list[LevelProgress] = []

    def view() -> RenderableType:
        table = levels_table(done)
        if current:
            p = current[0]
            line = Text(
                f"concurrency {p.concurrency}: {min(p.elapsed_s, p.duration_s):.1f}s of "
                f"{p.duration_s:g}s, {p.completed} done, {p.failed} failed, {p.tokens} tokens",
                style="cyan",
            )
            return Group(table, line)
        return table

    if quiet:
        yield (lambda _p: None), (lambda _lv: None)
        return
    with Live(console=console, refresh_per_second=4, get_renderable=view, transient=True):

        def on_start(p: LevelProgress) -> None:
            current[:] = [p]

        def on_level(lv: capacity.Level) -> None:
            current.clear()
            done.append(lv)

        yield on_start, on_level


def bench(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.max_concurrency < 1 or args.duration_s <= 0 or args.max_tokens < 1:
        raise CtlError("bench: --max-concurrency and --max-tokens must be ≥ 1, --duration-s > 0")
    client = ctx.client()
    replica = client.replica(args.replica)
    if not replica.endpoint_url:
        raise BenchFailed(f"replica {replica.id} has no endpoint yet (state {replica.state})")
    if replica.state != "ready":
        shown = visible(f"replica {replica.id} is {replica.state}, not ready")
        ctx.err.write(f"llmgw ctl: warning: {shown}\n")

    api_key = engine_key(client, replica.id)

    from llmgw.ctl.bench import ramp

    console = ctx.console()
    as_json = ctx.format(json_flag=args.json) == "json"
    with _progress(console, quiet=as_json) as (on_start, on_level):
        levels, stopped = asyncio.run(
            ramp(
                replica.endpoint_url,
                replica.model,
                max_concurrency=args.max_concurrency,
                duration_s=args.duration_s,
                max_tokens=args.max_tokens,
                api_key=api_key,
                on_start=on_start,
                on_level=on_level,
            )
        )
    best = capacity.peak(levels)
    if best is None:
        raise BenchFailed(f"replica {replica.id}: no level completed enough requests ({stopped})")
    others = benched_peers(client.replicas(model=replica.model), replica.id)
    weight = capacity.weight(best.tok_s, others)
    if not args.no_record:
        stored = client.set_weight(
            replica.id, WeightRequest(weight=weight, capacity_tok_s=best.tok_s)
        )
        if stored.capacity_tok_s is None:
            # Without the raw figure the next bench of this model cannot count this
            # replica as a peer, and would give its replica 1.0 again.
            ctx.err.write(
                "llmgw ctl: warning: the controller stored the weight but not the capacity; "
                "later benches cannot normalize against this replica\n"
            )
    if as_json:
        ctx.print_json(
            {
                "replica": replica.id,
                "model": replica.model,
                "endpoint_url": replica.endpoint_url,
                "levels": [dict(vars(lv), tok_s=lv.tok_s, req_s=lv.req_s) for lv in levels],
                "stopped": stopped,
                "capacity_tok_s": best.tok_s,
                "capacity_req_s": best.req_s,
                "peak_concurrency": best.concurrency,
                "weight": weight,
                "benched_peers": len(others),
                "recorded": not args.no_record,
            }
        )
        return 0
    console.print(levels_table(levels))
    basis = (
        f"vs mean {sum(others) / len(others):.0f} tok/s of {len(others)} benched peer(s)"
        if others
        else "first benched replica of its model"
    )
    # A Text, not a str: the engine's error in `stopped` and the replica's id are data.
    console.print(
        Text(
            f"stopped: {visible(stopped)}\n"
            f"capacity {best.tok_s:.0f} tok/s ({best.req_s:.1f} req/s) at concurrency "
            f"{best.concurrency}\n"
            f"weight {weight:.2f} ({basis})"
            + ("" if args.no_record else f"; recorded for {visible(replica.id)}")
        )
    )
    return 0


def engine_key(client: AdminClient, replica_id: str) -> str | None:
    """The replica's engine key, or None when the controller knows none.

    Engines answer only with their key, which the controller hands to the admin token
    alone (docs/security.md). A secret: it goes into the requests' Authorization
    header and is never printed, not even with --json. None (409: no key known; 404:
    a controller older than the route) benches without one; an engine that wants a
    key then fails the first level with its 401, which the error shows.
    """
    try:
        return client.engine_key(replica_id).api_key
    except (AdminRejected, AdminNotFound):
        return None
    except AdminError as exc:
        if exc.status == 403:
            raise BenchFailed(
                f"replica {replica_id}: its engine only answers with its key, which the "
                "controller gives to the admin token alone (this token may not have it)"
            ) from exc
        raise


def benched_peers(replicas: list[ReplicaView], replica_id: str) -> list[float]:
    """Raw capacities of the model's other replicas that have been benched."""
    return [
        r.capacity_tok_s
        for r in replicas
        if r.id != replica_id and r.capacity_tok_s is not None and r.state != "stopped"
    ]
