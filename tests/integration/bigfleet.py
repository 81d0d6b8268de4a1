"""A large fleet written straight into a SQLite store, for a real controller to load.

    seed_fleet(db_url, nodes=500, gpus_per_node=8, models=2000, replicas=3000)

Posting 500 nodes' heartbeats and letting ticks place 3,000 replicas takes minutes;
writing the records the controller would have written takes seconds. The nodes
heartbeated just now (start the controller with a long --heartbeat-timeout-s so they
stay ready without agents), every replica is ready on one GPU, models have one or two
replicas. Names are zero-padded so sorted order is numeric order.
"""

from __future__ import annotations

import time

from llmgw.controller.fleet.records import Changes, Event, Model, Node, Replica, Shard
from llmgw.controller.store import open_store
from llmgw.wire.agent import GPU
from llmgw.wire.models import ModelSpec


def node_name(i: int) -> str:
    return f"node-{i:04d}"


def model_name(i: int) -> str:
    return f"model-{i:04d}"


def seed_fleet(
    db_url: str,
    *,
    nodes: int,
    gpus_per_node: int,
    models: int,
    replicas: int,
    unplaceable: int = 0,
    events: int = 200,
) -> None:
    """Write the fleet in one transaction; `replicas` must fit one per GPU. `unplaceable`
    of the models ask for a GPU class no node has (no replica: placement says why)."""
    if replicas > nodes * gpus_per_node or not models - unplaceable <= replicas:
        raise ValueError("need placed models <= replicas <= nodes * gpus_per_node")
    now = time.time()
    node_rows = [
        Node(
            name=node_name(i),
            address=f"10.{i // 250}.{i % 250}.1",
            fabrics=(f"ib{i % 4}",),
            gpus=tuple(
                GPU(index=g, uuid=f"GPU-{i}-{g}", name="H100", gpu_class="H100-80G",
                    memory_mib=81_559)
                for g in range(gpus_per_node)
            ),
            last_heartbeat_at=now,
            agent_started_at=1.0,
        )
        for i in range(nodes)
    ]  # fmt: skip
    placed = models - unplaceable
    per_model = [0 if i >= placed else 1 + (i < replicas - placed) for i in range(models)]
    model_rows = [
        Model(
            spec=ModelSpec(
                name=model_name(i), engine="sim",
                gpu_classes=("H100-80G",) if per_model[i] else ("B200-192G",),
                min_replicas=max(1, per_model[i]), max_replicas=max(1, per_model[i]),
            ),
            created_at=now, updated_at=now, desired_replicas=max(1, per_model[i]),
        )
        for i in range(models)
    ]  # fmt: skip
    replica_rows: list[Replica] = []
    for m, count in enumerate(per_model):
        for _ in range(count):
            slot = len(replica_rows)
            node, gpu = divmod(slot, gpus_per_node)
            shard = Shard(node=node_name(node), rank=0, gpus=(gpu,), port=21000 + gpu,
                          state="ready")  # fmt: skip
            replica_rows.append(
                Replica(
                    id=f"r-{slot:05d}", model=model_name(m), state="ready", shards=(shard,),
                    created_at=now, state_since=now, updated_at=now,
                    endpoint_url=f"http://10.0.0.1:{21000 + gpu}", reason="placed",
                )
            )  # fmt: skip
    event_rows = [
        Event(id=0, at=now, kind="replica.ready", subject="replica",
              subject_id=f"r-{i:05d}", model=model_name(0), message="seeded")
        for i in range(events)
    ]  # fmt: skip
    store = open_store(db_url)
    try:
        store.apply(
            Changes(nodes=node_rows, models=model_rows, replicas=replica_rows, events=event_rows)
        )
    finally:
        store.close()
