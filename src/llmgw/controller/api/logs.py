"""`GET /admin/replicas/{id}/logs`: the tail of a replica's engine log (admin token only).

Asked of the replica's node through its heartbeats (controller/logasks.py): the answer
takes up to one heartbeat interval, then one more exchange. Errors leave through
routes._errors like every other route's:

    404  no such replica, no such rank, or the node holds no log of it (removed)
    400  `tail` or `rank` not an integer in range
    409  the shard has no node yet (pending)
    503  a standby (ask the leader); the node unreachable; too many asks waiting
    504  the agent did not answer in time (down, or older than this controller)
"""

from __future__ import annotations

from aiohttp import web

from llmgw.controller.api.decode import query_int
from llmgw.controller.api.routes import SERVICES, json_response
from llmgw.controller.errors import AgentSilent, Busy, Conflict, DoesNotExist
from llmgw.controller.fleet.commands import require_replica
from llmgw.controller.logasks import NoAnswer, TooManyAsks
from llmgw.wire.logs import DEFAULT_TAIL_LINES, MAX_RANK, MAX_TAIL_LINES, ReplicaLogs

# Seconds a request waits for the agent at most: a heartbeat interval for the ask to
# go out, one exchange for the answer to come back; under ctl's 10 s wait for a byte.
MAX_WAIT_S = 8.0


async def replica_logs(request: web.Request) -> web.Response:
    s = request.app[SERVICES]
    tail = query_int(request, "tail", DEFAULT_TAIL_LINES, 1, MAX_TAIL_LINES) or DEFAULT_TAIL_LINES
    rank = query_int(request, "rank", 0, 0, MAX_RANK) or 0
    s.fleet.require_leader()
    r = require_replica(s.fleet.state, request.match_info["id"])
    shard = next((sh for sh in r.shards if sh.rank == rank), None)
    if shard is None:
        raise DoesNotExist(
            f"replica {r.id} has no rank {rank} (its ranks: 0..{len(r.shards) - 1})",
            param="rank",
        )
    if not shard.node:
        raise Conflict(f"replica {r.id} rank {rank} is on no node yet (state {r.state})")
    node = s.fleet.state.nodes.get(shard.node)
    now = s.clock.wall()
    cfg = s.config
    if node is None or node.last_heartbeat_at is None:
        raise Busy(f"node {shard.node} has never heartbeated: its agent cannot send logs")
    if node.shown_state(now=now, heartbeat_timeout_s=cfg.heartbeat_timeout_s) == "unreachable":
        silent_s = now - node.last_heartbeat_at
        raise Busy(
            f"node {shard.node} is unreachable (no heartbeat for {silent_s:.0f}s): its agent "
            "cannot send logs"
        )
    wait_s = min(MAX_WAIT_S, 2 * cfg.heartbeat_interval_s + 3.0)
    try:
        answer = await s.log_asks.ask(
            shard.node, replica_id=r.id, rank=rank, tail=tail, timeout_s=wait_s
        )
    except TooManyAsks as exc:
        raise Busy(f"{exc}; retry shortly") from None
    except NoAnswer as exc:
        raise AgentSilent(
            f"{exc} (an agent older than this controller sends no logs)", param="node"
        ) from None
    if answer.outcome == "missing":
        raise DoesNotExist(
            f"node {shard.node} holds no log of replica {r.id} rank {rank} (removed: an agent "
            "keeps the logs of its newest ended shards only, --ended-logs-keep)"
        )
    if answer.outcome == "unreadable":
        raise AgentSilent(f"node {shard.node} cannot read the log: {answer.error}")
    view = ReplicaLogs(
        replica=r.id,
        rank=rank,
        node=shard.node,
        lines=answer.lines,
        cut=answer.cut,
        last_open=answer.last_open,
    )
    return json_response(view)


def routes() -> list[web.RouteDef]:
    return [web.get("/admin/replicas/{id}/logs", replica_logs)]
