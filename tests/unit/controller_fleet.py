"""Small builders of controller state for unit tests (placement, summary, idle, eviction)."""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.controller.fleet.records import FleetState, Model, Node, OperatorState, Replica, Shard
from llmgw.wire.admin import ReplicaState
from llmgw.wire.agent import GPU, EngineKind
from llmgw.wire.models import ModelSpec

NOW = 1.8e9
HB_TIMEOUT_S = 10.0


def gpus(
    count: int, gpu_class: str = "H100-80G", *, unhealthy: Iterable[int] = ()
) -> tuple[GPU, ...]:
    bad = set(unhealthy)
    return tuple(
        GPU(
            index=i,
            uuid=f"GPU-{gpu_class}-{i}",
            name=gpu_class,
            gpu_class=gpu_class,
            memory_mib=81_559,
            healthy=i not in bad,
            reason="xid 79" if i in bad else None,
        )
        for i in range(count)
    )


def node(
    name: str,
    count: int = 8,
    gpu_class: str = "H100-80G",
    *,
    fabrics: tuple[str, ...] = ("ib0",),
    unhealthy: Iterable[int] = (),
    operator_state: OperatorState = "active",
    reachable: bool = True,
    gpu_list: tuple[GPU, ...] | None = None,
) -> Node:
    return Node(
        name=name,
        address=f"10.0.0.{abs(hash(name)) % 250}",
        fabrics=fabrics,
        gpus=gpu_list if gpu_list is not None else gpus(count, gpu_class, unhealthy=unhealthy),
        operator_state=operator_state,
        last_heartbeat_at=NOW - 1 if reachable else NOW - 3_600,
    )


def spec(
    name: str = "m",
    *,
    gpu_classes: tuple[str, ...] = ("H100-80G",),
    gpus_per_node: int = 1,
    nodes: int = 1,
    min_replicas: int = 1,
    max_replicas: int | None = None,
    idle_timeout_s: float = 600.0,
    priority: int = 0,
    engine: EngineKind = "sim",
) -> ModelSpec:
    return ModelSpec(
        name=name,
        engine=engine,
        gpu_classes=gpu_classes,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        min_replicas=min_replicas,
        max_replicas=max(min_replicas, 1) if max_replicas is None else max_replicas,
        idle_timeout_s=idle_timeout_s,
        priority=priority,
    )


def model(s: ModelSpec) -> Model:
    return Model(
        spec=s, created_at=NOW - 7_200, updated_at=NOW - 7_200, desired_replicas=s.min_replicas
    )


def replica(
    rid: str,
    model_name: str,
    shards: Iterable[tuple[str, tuple[int, ...]]],
    *,
    state: ReplicaState = "ready",
) -> Replica:
    return Replica(
        id=rid,
        model=model_name,
        state=state,
        shards=tuple(Shard(node=n, rank=r, gpus=g) for r, (n, g) in enumerate(shards)),
        created_at=NOW - 3_600,
        state_since=NOW - 3_600,
        updated_at=NOW - 3_600,
    )


def fleet(
    nodes: Iterable[Node] = (),
    models: Iterable[ModelSpec] = (),
    replicas: Iterable[Replica] = (),
) -> FleetState:
    return FleetState(
        nodes={n.name: n for n in nodes},
        models={s.name: model(s) for s in models},
        replicas={r.id: r for r in replicas},
    )
