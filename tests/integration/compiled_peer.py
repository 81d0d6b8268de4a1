"""The routing work on request, for test_router_compiled.py: one JSON line in, one out.

Run as a script, once with the router's mypyc build and once without, both with one
PYTHONHASHSEED (the chain's links are Python's per-process hash): the test sends both
the same inputs and compares the answers. The first line out is the modules this
process runs compiled.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec

from llmgw.router import compiled

# The build (when the environment asks for it) loads before any hot module is imported.
compiled.load()

from llmgw.router.replicas.breaker import BreakerState, Outcome  # noqa: E402
from llmgw.router.replicas.registry import Registry, Release, Snapshot, Stats  # noqa: E402
from llmgw.router.request.inband import ErrorFrameWatch  # noqa: E402
from llmgw.router.request.tokens import StreamUsage, usage_of  # noqa: E402
from llmgw.router.routing.affinity import route_key  # noqa: E402
from llmgw.router.routing.blockhash import request_block_hashes  # noqa: E402
from llmgw.router.routing.policies import Ours  # noqa: E402
from llmgw.router.routing.prefix import PrefixIndex  # noqa: E402
from llmgw.router.routing.rendezvous import rendezvous_order  # noqa: E402
from llmgw.router.routing.scheduler import Decision, SchedulerConfig, choose, load_of  # noqa: E402
from llmgw.runtime.clock import ManualClock  # noqa: E402
from llmgw.wire.endpoints import EndpointInfo  # noqa: E402


def decided(d: Decision, ids: list[str]) -> list[Any]:
    blocks = [d.blocks_of(i) for i in ids]  # before .scores, which drops the rows
    return [d.endpoint_id, d.reason, d.header(), msgspec.to_builtins(d.scores), blocks]


def index_state(idx: PrefixIndex, ids: list[str]) -> list[Any]:
    return [len(idx), idx.entries_by_endpoint(), [[idx.units(i), idx.scale(i)] for i in ids]]


def run_index(ops: list[list[Any]], ids: list[str], max_total: int, default: int) -> list[Any]:
    idx = PrefixIndex(max_total_entries=max_total, default_capacity_units=default)
    out: list[Any] = []
    for op, *a in ops:
        if op == "record":
            idx.record(a[0], tuple(a[1]), capacity_units=a[2])
        elif op == "completed":
            idx.completed(a[0], tuple(a[1]), capacity_units=a[2])
        elif op == "match":
            out.append(idx.match(tuple(a[0]), ids))
        elif op == "trim":
            out.append(idx.trim(a[0], a[1]))
        elif op == "scale":
            idx.set_scale(a[0], a[1])
        elif op == "purge":
            idx.purge(a[0])
        elif op == "retain":
            idx.retain(a[0])
    return [*out, index_state(idx, ids)]


def snapshot_of(d: dict[str, Any]) -> Snapshot:
    """A snapshot from its builtins (`Snapshot.as_builtins`), by the public constructor."""
    return Snapshot.of(
        **{
            **d,
            "info": msgspec.convert(d["info"], EndpointInfo),
            "stats": msgspec.convert(d["stats"], Stats | None),
            "breaker": BreakerState(d["breaker"]),
        }
    )


def seen(snaps: list[Snapshot]) -> list[Any]:
    """What the scheduler reads of each snapshot, its load, and what /admin shows."""
    return [
        [s.id, s.weight, s.priority, s.engine_requests, load_of(s), s.as_builtins()] for s in snaps
    ]


def run_registry(infos: list[Any], ops: list[list[Any]]) -> list[Any]:
    """A registry's snapshots after a sequence of list changes, scrapes and dispatches."""
    clock = ManualClock()
    reg = Registry(clock=clock)
    releases: list[Release] = []
    out: list[Any] = []
    for op, *a in ops:
        if op == "replace":
            reg.replace(msgspec.convert(infos[: a[0]], list[EndpointInfo]))
        elif op == "observe":
            reg.observe(a[0], msgspec.convert(a[1], Stats))
        elif op == "acquire":
            release = reg.acquire(a[0], pending=a[1])
            if release is not None:
                releases.append(release)
        elif op == "release" and releases:
            releases.pop(0)(Outcome.OK)
        elif op == "advance":
            clock.advance(a[0])
        out.append(seen(reg.snapshots()))
    return out


def run_ours(snaps: list[Snapshot], requests: list[list[Any]], capacity: int) -> list[Any]:
    """Requests through the default policy: each chosen, recorded, then served."""
    ours = Ours(PrefixIndex(default_capacity_units=capacity))
    ids = [s.id for s in snaps]
    out: list[Any] = []
    for body, session, exclude, cached in requests:
        key = route_key(body, session)
        d = ours.choose(snaps, key, exclude)
        out.append(decided(d, ids))
        if d.endpoint_id is not None:
            stats = Stats(running=0, waiting=0, kv_usage=None, kv_capacity_tokens=capacity * 16)
            ours.served(d.endpoint_id, key, stats, decision=d, cached_tokens=cached)
    return [*out, index_state(ours.prefix, ids)]


def relayed(chunks: list[str]) -> list[Any]:
    """A stream's chunks through the token scanner and the error-frame watch."""
    scan, watch = StreamUsage(), ErrorFrameWatch()
    for c in chunks:
        data = c.encode("utf-8", "surrogateescape")
        scan.feed(data)
        watch.feed(data)
    return [
        msgspec.to_builtins(scan.usage),
        [watch.seen, watch.code, watch.message, watch.endpoint_failure],
    ]


def answer(op: str, a: dict[str, Any]) -> Any:
    if op == "usage":
        return msgspec.to_builtins(usage_of(a["body"].encode("utf-8", "surrogateescape")))
    if op == "stream":
        return relayed(a["chunks"])
    if op == "hashes":
        return request_block_hashes(a["body"], limit_bytes=a["limit"])
    if op == "rendezvous":
        return rendezvous_order(a["key"], a["ids"])
    if op == "index":
        return run_index(a["ops"], a["ids"], a["max_total"], a["default"])
    if op == "registry":
        return run_registry(a["infos"], a["ops"])
    snaps = [snapshot_of(d) for d in json.loads(a["snaps"])]
    if op == "snapshots":
        return seen(snaps)
    if op == "choose":
        d = choose(
            snaps,
            prefix_matches=a["matches"],
            home_order=a["home"],
            exclude=a["exclude"],
            session_endpoint=a["session"],
            prefix_gain=a["gains"],
            cfg=SchedulerConfig(**a["cfg"]),
        )
        return decided(d, [s.id for s in snaps])
    if op == "ours":
        return run_ours(snaps, a["requests"], a["capacity"])
    raise ValueError(op)


def main() -> None:
    print(json.dumps(compiled.STATUS.modules), flush=True)
    for line in sys.stdin:
        op, args = json.loads(line)
        try:
            out = ["ok", answer(op, args)]
        except Exception as exc:  # noqa: BLE001 - the test compares errors too (by type:
            out = ["error", type(exc).__name__]  # compiled code words its messages its way)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
