"""Rendezvous ports for multi-node replicas: rank 0's node gets one port its peers dial.

Chosen at placement (placement/requests.py) and stored on the replica
(`master_port`), so every rank's agent is told the same port.
"""

from __future__ import annotations

from llmgw.controller.fleet.batch import RUNS, Batch
from llmgw.controller.fleet.index import FleetIndex


def pick_master_port(batch: Batch, index: FleetIndex, node: str, ports: dict[str, set[int]]) -> int:
    """A rendezvous port on rank 0's node, from the top of its agent's range.

    Agents hand out engine ports from the bottom of the range upwards and never
    one that a shard they run uses as its rendezvous port (agent/supervisor.py).
    Here, no port another replica headed on this node uses for its rendezvous,
    and none an engine there is known to hold, is given again. Replicas that
    left (stopped, failed) still count while a free port remains: their engines
    may still be shutting down, and rank 0 of a replica that failed on another
    rank still listens until its agent stops it.
    """
    taken = ports.setdefault(node, set())
    gone: set[int] = set()
    for rid in index.on_node(node):
        r = batch.replica(rid)
        if r is None:
            continue
        used = taken if r.state in RUNS else gone
        if r.master_port is not None and r.shards[0].node == node:
            used.add(r.master_port)
        used.update(s.port for s in r.shards if s.node == node and s.port is not None)
    n = batch.node(node)
    lo, hi = n.port_range if n is not None else (21000, 21999)
    candidates = range(hi, lo - 1, -1)
    port = next((p for p in candidates if p not in taken and p not in gone), None)
    if port is None:
        # Every port in use by something: the agent refuses a rendezvous port an
        # engine holds (the replica fails with that reason and is retried).
        port = next((p for p in candidates if p not in taken), hi)
    taken.add(port)
    return port
