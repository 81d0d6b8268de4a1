"""How long replicas took to start: the estimate a "starting" outlook carries.

A start is the time from a replica's placement (`created_at`) to its becoming
ready (`state_since` of a ready replica): what a client held for a model at
zero actually waits, agent pickup, image pull and weight loading included.
The recent starts of the model itself estimate best; a model that never
started here borrows those of its engine kind (vllm, sglang, …); with neither
there is no estimate, rather than a made-up one.

Kept in memory: a new leader seeds it from the replicas ready at load, which
is every start it can still see.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from llmgw.controller.fleet.records import FleetState, Replica

# Recent starts kept per model and per engine kind: enough for a median that
# one slow start (a cold image cache) does not move, few enough to follow change.
PER_MODEL = 9
PER_ENGINE = 25


@dataclass(frozen=True, slots=True)
class StartEstimate:
    seconds: float
    # How many starts the median is over, and of what: the model or its engine kind.
    starts: int
    of: str


class StartHistory:
    def __init__(self) -> None:
        self._by_model: dict[str, deque[float]] = {}
        self._by_engine: dict[str, deque[float]] = {}

    def seed(self, state: FleetState) -> None:
        """Forget everything, then learn the starts of the replicas ready now."""
        self._by_model.clear()
        self._by_engine.clear()
        for r in sorted(state.replicas.values(), key=lambda r: r.state_since):
            if r.state == "ready":
                self.record(state, r)

    def changed(self, state: FleetState, old: Replica | None, new: Replica) -> None:
        """A replica changed: a start is recorded when it has just become ready."""
        if new.state == "ready" and (old is None or old.state != "ready"):
            self.record(state, new)

    def record(self, state: FleetState, r: Replica) -> None:
        took = r.state_since - r.created_at
        model = state.models.get(r.model)
        if took < 0 or model is None:
            return
        self._by_model.setdefault(r.model, deque(maxlen=PER_MODEL)).append(took)
        self._by_engine.setdefault(model.spec.engine, deque(maxlen=PER_ENGINE)).append(took)

    def forget_model(self, name: str) -> None:
        self._by_model.pop(name, None)

    def estimate(self, model: str, engine: str) -> StartEstimate | None:
        """The median recent start of `model`, else of its engine kind, else None."""
        own = self._by_model.get(model)
        if own:
            return StartEstimate(statistics.median(own), len(own), model)
        kind = self._by_engine.get(engine)
        if kind:
            return StartEstimate(statistics.median(kind), len(kind), f"{engine} models")
        return None
