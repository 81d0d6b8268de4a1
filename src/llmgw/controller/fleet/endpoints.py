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
from collections.abc import Callable, Mapping

from llmgw.controller.errors import Busy
from llmgw.controller.fleet.index import FleetIndex
from llmgw.controller.fleet.records import FleetState, Model, Replica, Reservation
from llmgw.wire.endpoints import EndpointInfo, EndpointList, ModelOutlook

# The router's metric dialect per engine: "" is vLLM's names, which
# the sim-engine speaks too.
METRICS_DIALECT: dict[str, str] = {
    "vllm": "",
    "sglang": "sglang",
    "llamacpp": "llamacpp",
    "sim": "",
}


def endpoint_info(r: Replica, model: Model) -> EndpointInfo | None:
    """The router's view of one replica; None when it is not serving."""
    if r.state != "ready" or r.endpoint_url is None:
        return None
    spec = model.spec
    return EndpointInfo(
        id=r.id,
        url=r.endpoint_url,
        models=spec.served_names,
        engine=METRICS_DIALECT.get(spec.engine, ""),
        pool=r.pool,
        weight=r.weight,
        priority=spec.priority,
        api_key=r.shards[0].api_key if r.shards else "",
    )


# A model that cannot be placed: routers tell clients to come back after this long
# (a tick may free room sooner; nothing waits on it).
CANNOT_PLACE_RETRY_S = 30.0


def outlook(
    state: FleetState,
    index: FleetIndex,
    *,
    unplaceable: Mapping[str, str],
    evicting: Mapping[str, Reservation],
) -> tuple[ModelOutlook, ...]:
    """What the controller does for each model with no ready replica (wire.endpoints).

    `unplaceable` is model → why its last placement failed; `evicting` the room
    being made by eviction (TickMemory). A model whose placement failed but for
    which eviction is under way is making room, not unplaceable; one with a
    replica placed and starting is starting. A model with none of these (idle at
    zero) is left out: the router holds its requests, which is the demand that
    makes the controller try.
    """
    ready_models = {state.replicas[rid].model for rid in index.in_state("ready")}
    starting: set[str] = set()
    for st in ("pending", "starting"):
        starting.update(state.replicas[rid].model for rid in index.in_state(st))
    out: list[ModelOutlook] = []
    for name in sorted(state.models):
        if name in ready_models:
            continue
        names = state.models[name].spec.served_names
        res = evicting.get(name)
        if res is not None:
            n = len(res.victims)
            reason = f"evicting {n} idle replica{'s' if n != 1 else ''} of other models for it"
            out.append(ModelOutlook(models=names, state="making_room", reason=reason))
        elif name in starting:
            out.append(ModelOutlook(models=names, state="starting", reason="a replica is starting"))
        elif name in unplaceable:
            reason = f"{unplaceable[name]}; nothing can be evicted for it now"
            out.append(
                ModelOutlook(
                    models=names,
                    state="cannot_place",
                    reason=reason,
                    retry_after_s=CANNOT_PLACE_RETRY_S,
                )
            )
    return tuple(out)


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
        info = endpoint_info(r, model) if model is not None else None
        if info is not None:
            out.append(info)
    out.sort(key=lambda e: e.id)
    names = sorted({n for m in state.models.values() for n in m.spec.served_names})
    return EndpointList(version=version, endpoints=tuple(out), models=tuple(names), outlook=looks)


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
