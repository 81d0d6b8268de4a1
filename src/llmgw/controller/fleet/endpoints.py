"""EndpointSink: the ready replicas as a versioned list routers long-poll.

The version goes up whenever the list's content may have changed; the list is
built lazily, once per version, by whoever asks first, so a burst of changes
between two polls costs one build, not one per change.

Versions start at the controller's start time in milliseconds rather than 1: a
router that long-polls with the version of the controller that ran before this
one would otherwise wait out its whole timeout for a "newer" version that this
process reaches only after as many changes. (Replies also go out at once when
`after` is ahead of us, for the same reason.) A standby that takes over jumps
to the current time in milliseconds as well, above anything its predecessor
handed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Collection, Mapping
from urllib.parse import urlsplit

import msgspec

from llmgw.controller.errors import Busy
from llmgw.controller.fleet.index import FleetIndex
from llmgw.controller.fleet.records import (
    SHARD_RUNNING,
    Adapter,
    FleetState,
    Model,
    Replica,
    Reservation,
)
from llmgw.controller.fleet.starts import StartHistory
from llmgw.wire.endpoints import EndpointInfo, EndpointList, ModelOutlook
from llmgw.wire.models import ModelSpec

# The router's metric dialect per engine: "" is vLLM's names, which
# the sim-engine speaks too.
METRICS_DIALECT: dict[str, str] = {
    "vllm": "",
    "sglang": "sglang",
    "llamacpp": "llamacpp",
    "sim": "",
}


def endpoint_info(
    r: Replica, model: Model, adapters: Mapping[str, Adapter] | None = None
) -> EndpointInfo | None:
    """The router's view of one replica; None when it is not serving.

    Its names are the model's, then the LoRA adapters (`adapters`: every adapter by
    name) its engine reported loaded that are still this model's: routers send an
    adapter's requests only to replicas that serve it, so one being loaded at run
    time elsewhere is never sent where the engine would answer 404.
    """
    if r.state != "ready" or r.endpoint_url is None:
        return None
    spec = model.spec
    names = spec.served_names
    if adapters and r.shards and r.shards[0].adapters:
        loaded = sorted(
            n for n in r.shards[0].adapters if (a := adapters.get(n)) and a.base == model.name
        )
        names = (*names, *loaded)
    info = EndpointInfo(
        id=r.id,
        url=r.endpoint_url,
        models=names,
        engine=METRICS_DIALECT.get(spec.engine, ""),
        pool=r.pool,
        weight=r.weight,
        priority=spec.priority,
        api_key=r.shards[0].api_key if r.shards else "",
        # llama.cpp selects an adapter by its position among those it started with.
        lora_ids=r.shards[0].adapters if spec.engine == "llamacpp" and r.shards else (),
        priority_scheduling=bool(r.shards) and r.shards[0].priority_scheduling,
    )
    kv = kv_events_fields(r, model)
    return msgspec.structs.replace(info, **kv) if kv else info


def kv_events_fields(r: Replica, model: Model) -> dict[str, str]:
    """EndpointInfo's precise-mode fields for a ready replica; {} to leave them out.

    Filled only when the model asks for precise mode AND rank 0's agent reported the
    publisher it started: a replica started before the spec turned kv_events on (or
    by an agent that does not know the field) publishes nothing, and routers guess.
    The publisher listens on the node's address, the host of the endpoint's URL.
    """
    head = r.shards[0] if r.shards else None
    tokenizer = model.spec.kv_tokenizer
    if (
        not model.spec.routing.kv_events
        or head is None
        or head.kv_events_port is None
        or not tokenizer
        or r.endpoint_url is None
    ):
        return {}
    host = urlsplit(r.endpoint_url).netloc.rpartition(":")[0]
    if not host:
        return {}
    out = {
        "kv_events": f"tcp://{host}:{head.kv_events_port}",
        "kv_events_topic": head.kv_events_topic,
        "tokenizer": tokenizer,
    }
    if head.kv_events_replay_port is not None:
        out["kv_events_replay"] = f"tcp://{host}:{head.kv_events_replay_port}"
    return out


# A model that cannot be placed, when nothing says when that may change: routers
# tell clients to come back after this long (a tick may free room sooner).
CANNOT_PLACE_RETRY_S = 30.0


def coarse_s(seconds: float) -> float:
    """Seconds rounded up: to 10 s under a minute, to whole minutes above.

    What the outlook says about the future is rounded so that it does not change
    with every tick (each change is a new endpoint-list version every router fetches).
    """
    if seconds <= 60:
        return max(10.0, math.ceil(seconds / 10) * 10.0)
    return math.ceil(seconds / 60) * 60.0


def say_s(seconds: float) -> str:
    """'40 s', '7 min', '2 h 5 min' (as coarse_s rounds them)."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    m = s // 60
    if m < 60:
        return f"{m} min"
    return f"{m // 60} h" + (f" {m % 60} min" if m % 60 else "")


def outlook(
    state: FleetState,
    index: FleetIndex,
    *,
    unplaceable: Mapping[str, str],
    evicting: Mapping[str, Reservation],
    lasting: Collection[str] = (),
    now: float = 0.0,
    idle_enough_at: Mapping[str, float] | None = None,
    starts: StartHistory | None = None,
) -> tuple[ModelOutlook, ...]:
    """What the controller does for each model with no ready replica (wire.endpoints).

    `unplaceable` is model → why its last placement failed; `evicting` the room
    being made by eviction (TickMemory). A model whose placement failed but for
    which eviction is under way is making room, not unplaceable; one with a
    replica placed and starting is starting; a wanted one whose replica is still
    falling asleep is waking (it wakes in place once asleep). A model with none
    of these (idle at zero) is left out: the router holds its requests, which is
    the demand that makes the controller try.

    A starting model says how long its starts usually take (`starts`: the median
    of its recent starts, else of its engine kind; nothing when neither is
    known). A model that cannot be placed says when waiting would let an
    eviction make room (`idle_enough_at`: model → wall time, TickMemory), and
    its retry_after_s is that wait; otherwise CANNOT_PLACE_RETRY_S. A model in
    `lasting` cannot fit the fleet as it is (its class, its width), which its reason
    says. A model whose max_replicas is 0 cannot be placed either (SCALED_TO_ZERO).
    """
    ready_models = {state.replicas[rid].model for rid in index.in_state("ready")}
    starting: set[str] = set()
    for st in ("pending", "starting"):
        starting.update(state.replicas[rid].model for rid in index.in_state(st))
    waking = {state.replicas[rid].model for rid in index.in_state("waking")}
    asleep: dict[str, int] = {}
    # Models with a replica told to sleep whose engine is not asleep yet: one wanted
    # again wakes in place once it is (placement/wakes.py, "Falling asleep").
    settling: set[str] = set()
    for rid in index.in_state("sleeping"):
        r = state.replicas[rid]
        asleep[r.model] = r.sleep_level or 2
        if any(s.state in SHARD_RUNNING for s in r.shards):
            settling.add(r.model)
    eta = idle_enough_at or {}
    by_base: dict[str, list[str]] = {}
    for a in sorted(state.adapters.values(), key=lambda a: a.name):
        by_base.setdefault(a.base, []).append(a.name)
    out: list[ModelOutlook] = []
    # Replicas with a replacement: room made by moving them (compaction), not by
    # evicting; worked out only when some model is making room.
    moved: set[str | None] | None = None
    for name in sorted(state.models):
        if name in ready_models:
            continue
        model = state.models[name]
        # Its adapters wait (or are refused) with it.
        names = (*model.spec.served_names, *by_base.get(name, ()))
        res = evicting.get(name)
        if model.spec.max_replicas == 0:
            # Nothing is ever placed for it: a router holding its requests would hold
            # each one its whole hold timeout for a replica that never comes.
            out.append(
                ModelOutlook(
                    models=names,
                    state="cannot_place",
                    reason=SCALED_TO_ZERO,
                    retry_after_s=CANNOT_PLACE_RETRY_S,
                )
            )
        elif name in waking:
            out.append(
                _waking(names, model.spec, asleep.get(name, 1), "a sleeping replica is waking")
            )
        elif res is not None and name in asleep:
            out.append(_waking(names, model.spec, asleep[name], _SWAPPING))
        elif name in settling and model.desired_replicas > 0 and name not in starting:
            out.append(_waking(names, model.spec, asleep[name], _SETTLING))
        elif res is not None:
            n = len(res.victims)
            if moved is None:
                moved = {r.replaces for r in state.replicas.values() if r.replaces}
            if res.victims & moved:
                reason = f"moving {n} replica{'s' if n != 1 else ''} of other models to make room"
            else:
                reason = f"evicting {n} idle replica{'s' if n != 1 else ''} of other models for it"
            out.append(ModelOutlook(models=names, state="making_room", reason=reason))
        elif name in starting:
            out.append(_starting(names, name, model.spec.engine, starts))
        elif name in unplaceable:
            at = eta.get(name)
            if name in lasting:
                reason = f"{unplaceable[name]}; no eviction or wait makes room for it on this fleet"
                retry = CANNOT_PLACE_RETRY_S
            elif at is None:
                reason = f"{unplaceable[name]}; nothing can be evicted for it now"
                retry = CANNOT_PLACE_RETRY_S
            else:
                retry = coarse_s(max(0.0, at - now))
                reason = (
                    f"{unplaceable[name]}; nothing idle long enough to evict; the first "
                    f"candidate is idle enough in {say_s(retry)} (if unused until then)"
                )
            out.append(
                ModelOutlook(models=names, state="cannot_place", reason=reason, retry_after_s=retry)
            )
    return tuple(out)


# What a wake costs, after vLLM's published sleep-mode figures (docs/sleep-and-adapters.md):
# a fixed part and a part per GB of weights on each GPU (copied back from host memory at
# level 1, read again at level 2).
WAKE_L1_BASE_S, WAKE_L1_S_PER_GB = 0.05, 0.046
WAKE_L2_BASE_S, WAKE_L2_S_PER_GB = 0.85, 0.10


def wake_estimate_s(spec: ModelSpec, level: int) -> float | None:
    """Seconds a wake of `spec` from `level` takes; None when its weights' size is unknown."""
    if spec.weights_gb is None:
        return None
    per_gpu = spec.weights_gb / spec.gpus_per_replica
    if level == 1:
        return WAKE_L1_BASE_S + WAKE_L1_S_PER_GB * per_gpu
    return WAKE_L2_BASE_S + WAKE_L2_S_PER_GB * per_gpu


SCALED_TO_ZERO = "its max_replicas is 0: no replica is ever started for it"
_SWAPPING = "idle replicas on its sleeping replica's cards are making way; then it wakes"
_SETTLING = "its replica is still falling asleep; it wakes as soon as it is asleep"


def _waking(names: tuple[str, ...], spec: ModelSpec, level: int, reason: str) -> ModelOutlook:
    est = wake_estimate_s(spec, level)
    if est is None:
        return ModelOutlook(models=names, state="waking", reason=reason)
    # Whole seconds, not coarse_s's tens: a wake is seconds, and the figure comes
    # from the spec, so it does not change from tick to tick.
    took = float(max(1, math.ceil(est)))
    reason += f"; a wake takes about {took:g} s"
    return ModelOutlook(models=names, state="waking", reason=reason, retry_after_s=took)


def _starting(
    names: tuple[str, ...], name: str, engine: str, starts: StartHistory | None
) -> ModelOutlook:
    est = starts.estimate(name, engine) if starts is not None else None
    if est is None:
        return ModelOutlook(models=names, state="starting", reason="a replica is starting")
    took = coarse_s(est.seconds)
    plural = "s" if est.starts != 1 else ""
    reason = (
        f"a replica is starting; starts take about {say_s(took)} "
        f"(median of the last {est.starts} start{plural} of {est.of})"
    )
    return ModelOutlook(models=names, state="starting", reason=reason, retry_after_s=took)


def endpoint_list(
    state: FleetState,
    index: FleetIndex,
    *,
    version: int,
    looks: tuple[ModelOutlook, ...] = (),
) -> EndpointList:
    out: list[EndpointInfo] = []
    for rid in index.in_state("ready"):
        r = state.replicas[rid]
        model = state.models.get(r.model)
        info = endpoint_info(r, model, state.adapters) if model is not None else None
        if info is not None:
            out.append(info)
    out.sort(key=lambda e: e.id)
    names = sorted(
        {n for m in state.models.values() for n in m.spec.served_names} | state.adapters.keys()
    )
    keys = tuple(state.keys[n].key for n in sorted(state.keys) if state.keys[n].live)
    return EndpointList(
        version=version,
        endpoints=tuple(out),
        models=tuple(names),
        outlook=looks,
        keys=keys,
        keys_required=bool(state.keys),
    )


class EndpointSink:
    """Version counter, lazily built list, and the long-poll waiters."""

    def __init__(self, *, start_version: int, max_waiters: int) -> None:
        self._version = start_version
        self._cached: EndpointList | None = None
        self._changed = asyncio.Event()
        self._waiters = 0
        self._max_waiters = max_waiters

    @property
    def version(self) -> int:
        return self._version

    def bump(self, *, at_least: int = 0) -> None:
        """The list may have changed: new version (≥ `at_least`), wake every waiter."""
        self._version = max(self._version + 1, at_least)
        self._cached = None
        # Swap the event: waiters hold the old one, which is set exactly once.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def release_waiters(self) -> None:
        """Answer every held long-poll now with the current list (shutdown)."""
        self._changed.set()

    def current(self, build: Callable[[int], EndpointList]) -> EndpointList:
        if self._cached is None or self._cached.version != self._version:
            self._cached = build(self._version)
        return self._cached

    async def wait_changed(self, after: int | None, *, timeout_s: float) -> None:
        """Return once the version differs from `after`, or after `timeout_s`."""
        if after is None or after != self._version:
            return
        if self._waiters >= self._max_waiters:
            raise Busy(f"too many long-polls held ({self._max_waiters}); retry shortly")
        self._waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout_s)
        finally:
            self._waiters -= 1

    @property
    def waiters(self) -> int:
        return self._waiters
