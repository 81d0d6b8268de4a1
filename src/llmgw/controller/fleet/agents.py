"""The agent protocol, decided purely: heartbeat in → Changes, desired shards out.

Desired state, not commands. The answer always lists every shard the node
should run, keyed by (replica_id, rank); an agent starts what is missing and
stops what is not listed. A repeated or late heartbeat therefore cannot start
anything twice: the worst it can do is report a status the controller has
already moved past, which is ignored (a failed or stopped replica is never
revived by a report; restarting it makes a new replica with a new id).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from llmgw.controller.fleet.batch import RUNS, Batch, backoff_s, log_tail_text
from llmgw.controller.fleet.index import FleetIndex
from llmgw.controller.fleet.records import SHARD_RUNNING, FleetState, Node, Replica, Shard
from llmgw.wire.agent import GPU, Heartbeat, ShardSpec, ShardStatus
from llmgw.wire.models import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    base_s: float
    cap_s: float

    def after(self, restarts: int) -> float:
        return backoff_s(restarts, base_s=self.base_s, cap_s=self.cap_s)


@dataclass(frozen=True, slots=True)
class Absorbed:
    """What one heartbeat means. `batch.changes` is empty when nothing needs storing."""

    batch: Batch
    # The node as memory should hold it (fresh last_heartbeat_at) even when the
    # store is not written: timestamps are flushed by the tick, not per heartbeat.
    node: Node
    node_changed: bool


class HeartbeatOrder:
    """Per node, the (agent_started_at, seq) of the last heartbeat applied.

    Heartbeats race: a delayed one (a slow connection, a retry) can arrive after
    a newer one, and applying it would put back shard states the agent has moved
    past, e.g. send a ready replica back to starting and out of the endpoint
    list. One that is not newer than the last applied from the same agent
    process is stale: answered, never applied.

    Only the same agent_started_at is compared. A different one is a restarted
    agent whose count began again at 1, and it is applied and becomes the mark
    even when its start time is lower: a wall clock stepped back across the
    restart must not silence a live agent. seq 0 (an agent that does not number
    heartbeats) is always applied, as before seq existed.

    Memory only, and empty at the start of each leadership term: after a
    controller restart or takeover the first heartbeat from each node is
    applied whatever its seq. That is safe: at worst it is one late report,
    which is what every heartbeat could be before seq existed, the agent's next
    heartbeat (one interval later, newer by construction) corrects it, and
    from then on the order holds again. Storing the mark would cost a write per
    heartbeat per node for that one interval of protection.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def is_stale(self, hb: Heartbeat) -> bool:
        if hb.seq <= 0:
            return False
        last = self._last.get(hb.node)
        return last is not None and last[0] == hb.agent_started_at and hb.seq <= last[1]

    def applied(self, hb: Heartbeat) -> None:
        """`hb` was applied: later ones from its agent must be newer."""
        if hb.seq > 0:
            self._last[hb.node] = (hb.agent_started_at, hb.seq)
        else:
            self._last.pop(hb.node, None)

    def forget(self, node: str) -> None:
        self._last.pop(node, None)

    def clear(self) -> None:
        self._last.clear()


def name_claimed(old: Node | None, hb: Heartbeat, *, now: float, timeout_s: float) -> str | None:
    """Why `hb` may not speak for its node, or None when it may.

    A node's name belongs to the agent heartbeating it: another agent claiming the name
    from another address while the first still heartbeats (within `timeout_s`) is a
    second host with a copied configuration, or one posing as the node. Applying its
    report would repoint the node's endpoints at it and stop the first host's engines.
    A node whose agent has been silent longer may move (a new address, a replaced host).
    """
    if old is None or old.address == hb.address or old.last_heartbeat_at is None:
        return None
    silent = now - old.last_heartbeat_at
    if silent > timeout_s:
        return None
    return (
        f"an agent at {hb.address} claims node {hb.node!r}, whose agent at {old.address} "
        f"heartbeated {silent:.0f}s ago: refused (a node may change address once its agent "
        f"has been silent for {timeout_s:g}s)"
    )


def _no_nul(text: str) -> str:
    """Agent text as records keep it: a NUL as U+FFFD (what a byte that is not UTF-8
    becomes when the agent reads a log).

    An engine's log may hold NULs (a file's zero-filled end after a crash), and what an
    agent quotes reaches the replica's reason and the event log, columns PostgreSQL's
    text cannot hold a NUL in: the write failed (503), on every heartbeat the agent
    sent with it, until the node went unreachable. SQLite kept it; now both keep this.
    """
    return text.replace("\0", "\ufffd") if "\0" in text else text


def _gpu_text(g: GPU) -> GPU:
    if g.reason is None or "\0" not in g.reason:
        return g
    return msgspec.structs.replace(g, reason=_no_nul(g.reason))


def node_from_heartbeat(hb: Heartbeat, old: Node | None, *, now: float) -> Node:
    return Node(
        name=hb.node,
        address=hb.address,
        # A node is on a fabric or not: `--fabric ib0 --fabric ib0` counted it twice in
        # the summary's ib0 (nodes and free whole nodes). First mention keeps its place.
        fabrics=tuple(dict.fromkeys(hb.fabrics)),
        labels=dict(hb.labels),
        gpus=tuple(_gpu_text(g) for g in hb.gpus),
        last_heartbeat_at=now,
        # 0.0 is the wire default: the agent did not say.
        agent_started_at=hb.agent_started_at or None,
        port_range=(hb.port_range[0], hb.port_range[1]),
        # The operator's word (cordon, drain and how) is kept, never the agent's to change.
        operator_state=old.operator_state if old is not None else "active",
        drain_grace_s=old.drain_grace_s if old is not None else None,
        drain_force=old.drain_force if old is not None else False,
        drain_evict_idle=old.drain_evict_idle if old is not None else False,
        host_memory_mib=hb.host_memory_mib,
    )


def absorb_heartbeat(
    state: FleetState, index: FleetIndex, hb: Heartbeat, *, now: float, backoff: Backoff
) -> Absorbed:
    batch = Batch(state, now)
    old = state.nodes.get(hb.node)
    node = node_from_heartbeat(hb, old, now=now)
    changed = old is None or dataclasses.replace(old, last_heartbeat_at=None) != (
        dataclasses.replace(node, last_heartbeat_at=None)
    )
    if changed:
        batch.put_node(node)
        _node_events(batch, old, node)
    reported = {(s.replica_id, s.rank): s for s in hb.shards}
    for rid in sorted(index.on_node(hb.node)):
        r = state.replicas[rid]
        if r.state not in RUNS:
            # Gone as far as we are concerned, but its engines may still be exiting.
            gone = tuple(
                _exiting_shard(s, reported.get((rid, s.rank))) if s.node == hb.node else s
                for s in r.shards
            )
            if gone != r.shards:
                batch.update(r, shards=gone)
            continue
        shards = tuple(
            _absorb_shard(s, reported.get((rid, s.rank))) if s.node == hb.node else s
            for s in r.shards
        )
        if shards != r.shards:
            _settle(batch, r, shards, backoff=backoff)
    return Absorbed(batch=batch, node=node, node_changed=changed)


def _node_events(batch: Batch, old: Node | None, new: Node) -> None:
    if old is None:
        gpus = len(new.gpus)
        batch.event(
            "node.registered", "node", new.name, f"{gpus} GPUs at {new.address}", model=None
        )
        return
    if old.agent_started_at is not None and old.agent_started_at != new.agent_started_at:
        batch.event("node.agent_restarted", "node", new.name, "agent restarted", model=None)
    was = {g.index: g for g in old.gpus}
    for g in new.gpus:
        before = was.get(g.index)
        if before is not None and before.healthy and not g.healthy:
            why = g.reason or "no reason given"
            batch.event("node.gpu_unhealthy", "node", new.name, f"GPU {g.index}: {why}", model=None)
        elif before is not None and not before.healthy and g.healthy:
            batch.event("node.gpu_healthy", "node", new.name, f"GPU {g.index} healthy", model=None)


def _exiting_shard(shard: Shard, st: ShardStatus | None) -> Shard:
    """A stopped or failed replica's shard: whether its engine still runs (holds its cards).

    Only the state follows the report; the replica itself is never revived.
    """
    if st is None:
        if shard.state in SHARD_RUNNING:
            return dataclasses.replace(shard, state="stopped", pid=None)
        return shard
    if st.state == shard.state and st.pid == shard.pid:
        return shard
    return dataclasses.replace(shard, state=st.state, pid=st.pid, exit_code=st.exit_code)


def _absorb_shard(shard: Shard, st: ShardStatus | None) -> Shard:
    if st is None:
        # The agent does not run it (it restarted without re-adopting, or never
        # started it yet): a shard we believed up is back to pending.
        if shard.state in ("starting", "ready"):
            return dataclasses.replace(shard, state="pending", pid=None)
        return shard
    return dataclasses.replace(
        shard,
        state=st.state,
        port=st.port if st.port is not None else shard.port,
        pid=st.pid,
        exit_code=st.exit_code,
        log_tail=tuple(_no_nul(line) for line in st.log_tail[-20:]),
        api_key=st.api_key,
        kv_events_port=st.kv_events_port,
        kv_events_replay_port=st.kv_events_replay_port,
        kv_events_topic=st.kv_events_topic,
        adapters=tuple(st.adapters),
        priority_scheduling=st.priority_scheduling,
        note=_no_nul(st.note),
    )


def _settle(batch: Batch, r: Replica, shards: tuple[Shard, ...], *, backoff: Backoff) -> None:
    """The replica's state from its shards' (all nodes'), after one node's report."""
    if r.state == "draining":
        if all(s.state in ("stopped", "failed") for s in shards):
            batch.stop(dataclasses.replace(r, shards=shards), "engine exited while draining")
        else:
            batch.update(r, shards=shards)
        return
    dead = next((s for s in shards if s.state in ("failed", "stopped")), None)
    if r.state == "sleeping":
        # Nothing serves from it: an engine that died asleep is simply gone.
        if dead is not None:
            why = f"rank {dead.rank} on {dead.node} exited while sleeping"
            batch.stop(dataclasses.replace(r, shards=shards), why)
        else:
            batch.update(r, shards=shards)
        return
    if dead is not None:
        verb = "exited" if dead.state == "failed" else "stopped unexpectedly"
        code = f" with code {dead.exit_code}" if dead.exit_code is not None else ""
        tail = log_tail_text(dead.log_tail)
        reason = f"rank {dead.rank} on {dead.node} {verb}{code}" + (f": {tail}" if tail else "")
        batch.fail(
            dataclasses.replace(r, shards=shards), reason, retry_in_s=backoff.after(r.restarts)
        )
        return
    rank0 = shards[0]
    if all(s.state == "ready" for s in shards) and rank0.port is not None:
        node = batch.node(rank0.node)
        address = node.address if node is not None else rank0.node
        url = f"http://{address}:{rank0.port}"
        if r.state == "waking":
            # The agent serves a woken engine whose warm-up kept failing (agent/waking.py).
            why = f"awake, not warmed up: {rank0.note}" if rank0.note else "awake and warmed up"
            batch.move(r, "ready", why, shards=shards, endpoint_url=url)
        elif r.state != "ready":
            batch.move(r, "ready", "all shards ready", shards=shards, endpoint_url=url)
        else:
            batch.update(r, shards=shards, endpoint_url=url)
        return
    if r.state == "ready":
        lagging = next(s for s in shards if s.state != "ready")
        reason = f"rank {lagging.rank} on {lagging.node} is {lagging.state} again"
        batch.move(r, "starting", reason, shards=shards, endpoint_url=None)
    elif r.state == "waking":
        batch.update(r, shards=shards)
    elif r.state == "pending" and any(s.state in ("starting", "ready") for s in shards):
        batch.move(r, "starting", "agent started the engine", shards=shards)
    else:
        batch.update(r, shards=shards)


# While an engine on the node falls asleep or wakes, its agent is asked to heartbeat
# this often: each step of a swap (the victim asleep, the sleeper woken and warmed
# up) is seen a heartbeat sooner, and a held request waits that much less.
FAST_HEARTBEAT_S = 0.25


def heartbeat_interval_s(
    state: FleetState, index: FleetIndex, node: str, *, base_s: float
) -> float:
    """How soon the controller wants `node`'s next heartbeat: `base_s`, or
    FAST_HEARTBEAT_S while one of its replicas wakes or has not yet fallen asleep."""
    for rid in index.on_node(node):
        r = state.replicas.get(rid)
        if r is None:
            continue
        if r.state == "waking" or (
            r.state == "sleeping" and any(s.state in SHARD_RUNNING for s in r.shards)
        ):
            return min(base_s, FAST_HEARTBEAT_S)
    return base_s


def desired_shards(
    state: FleetState,
    index: FleetIndex,
    node: str,
    *,
    retired: Mapping[str, ModelSpec] | None = None,
) -> tuple[ShardSpec, ...]:
    """Every shard `node` should run now, sorted by (replica_id, rank).

    `retired` (default: `state.retired`) holds the specs of models deleted while
    their replicas drain, so those shards keep running until they are stopped
    instead of vanishing.
    """
    if retired is None:
        retired = state.retired
    out: list[ShardSpec] = []
    for rid in index.on_node(node):
        r = state.replicas[rid]
        if r.state not in RUNS:
            continue
        model = state.models.get(r.model)
        spec = model.spec if model is not None else retired.get(r.model)
        if spec is None:
            continue
        # Every rank gets them: vLLM builds its model with LoRA on every rank; rank 0,
        # the one with the API server, loads them.
        adapters = {a.name: a.spec.source for a in state.adapters_of(r.model)}
        master_addr: str | None = None
        if len(r.shards) > 1:
            head = state.nodes.get(r.shards[0].node)
            master_addr = head.address if head is not None else r.shards[0].node
        for s in r.shards:
            if s.node != node:
                continue
            out.append(
                ShardSpec(
                    replica_id=r.id,
                    rank=s.rank,
                    world_size=len(r.shards),
                    model=spec.source or spec.name,
                    served_names=spec.served_names,
                    engine=spec.engine,
                    gpu_indices=s.gpus,
                    args=spec.args,
                    env=dict(spec.env),
                    env_from=dict(spec.env_from),
                    master_addr=master_addr,
                    master_port=r.master_port if master_addr is not None else None,
                    # The scheduler runs on rank 0: only its engine publishes.
                    kv_events=spec.routing.kv_events and s.rank == 0,
                    sleep_mode=spec.sleep_mode,
                    sleep_level=r.sleep_level if r.state == "sleeping" else None,
                    adapters=adapters,
                )
            )
    out.sort(key=lambda s: (s.replica_id, s.rank))
    return tuple(out)
