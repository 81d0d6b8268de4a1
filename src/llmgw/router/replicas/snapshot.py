"""What the registry shows of a replica: a `Snapshot`.

A value: built by the registry (registry.py) from its live state for every
endpoint of the model on every request, read by the scheduler, the proxy and
/admin/endpoints without a lock, never changed.

Never compiled (compiled.py): msgspec reads a Struct's field annotations at run
time, which a mypyc-compiled module does not keep.
"""

from __future__ import annotations

from typing import Any

import msgspec

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.stats import Stats
from llmgw.wire.endpoints import EndpointInfo


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the scheduler knows of one endpoint, as a value read without a lock.

    It also carries the few figures of `info` and `stats` the scheduler reads per
    request (`id`, `weight`, `priority`, `engine_requests`), as the registry keeps
    them: reading them off `info` (a Struct) and `stats` for every endpoint of
    every request cost more than passing them. `Snapshot.of` derives them.

    A msgspec Struct, not a frozen dataclass: one is built for every endpoint of
    the model on every request, and a frozen dataclass's `__init__` (a generated
    Python function assigning each field through `object.__setattr__`) costs many
    times a Struct's, compiled or not (bench/RESULTS.md, "Snapshot's shape").
    """

    info: EndpointInfo
    # The last successful scrape; None: never scraped since the endpoint appeared.
    stats: Stats | None
    # Finished requests per second, exponentially smoothed (α 0.3). This is
    # AIBrix's load signal: running alone cannot tell that a replica is slow.
    # 0.0 until two scrapes with a finished-request counter have been seen, and
    # always for engines without one (llama.cpp); it only breaks ties.
    drain_rate: float
    # Requests this router dispatched here that have not finished (all its
    # workers together: shared.py). It compensates for scrape lag: without it,
    # herding is unavoidable within an interval.
    inflight: int
    # The highest `running` ever observed: the engine's batch capacity, learned
    # rather than configured. Kept across engine restarts (the seed's "max ever"):
    # a restarted engine has the same batch limit. 0 until the first scrape.
    running_capacity: int
    # No successful scrape within `stale_after_s`, or never scraped. Stale
    # endpoints are scored down, not dropped.
    stale: bool
    # Seconds since the last successful scrape; None if never scraped.
    age_s: float | None
    # Read without side effects: an open breaker past its cooldown reads half_open.
    breaker: BreakerState
    # Engine restarts observed (a counter went backwards).
    restarts: int
    # `inflight` when the last scrape was recorded: the engine's figures already
    # contain (roughly) these, so the requests it has not yet reported are
    # inflight − inflight_at_scrape (the scheduler's load estimate, `load_of`).
    inflight_at_scrape: int = 0
    # Of `inflight`, the streamed requests whose first token has not come yet (all
    # workers together): queued at the engine or in prefill. Live, where the
    # engine's own `waiting` is a scrape old; the scheduler counts it as queue
    # (`load_of`). Requests that do not stream never count: their answer comes whole.
    pending: int = 0
    # Seconds until an open breaker admits its probe; None unless open.
    probe_in_s: float | None = None
    # Times the breaker has opened: a rise means a probe failed (holding.hold_until).
    opened_total: int = 0
    # From `info` and `stats` (they must agree with them): info.id, info.weight,
    # info.priority, and the engine's running + waiting as of the last scrape
    # (None: never scraped).
    id: str
    weight: float
    priority: int
    engine_requests: int | None

    @classmethod
    def of(cls, *, info: EndpointInfo, stats: Stats | None, **rest: Any) -> Snapshot:
        """A snapshot whose `id`, `weight`, `priority` and `engine_requests` are read
        off `info` and `stats` (tests, and wherever a snapshot is rebuilt)."""
        return cls(
            info=info,
            stats=stats,
            id=info.id,
            weight=info.weight,
            priority=info.priority,
            engine_requests=None if stats is None else stats.running + stats.waiting,
            **rest,
        )

    def as_builtins(self) -> dict[str, Any]:
        """What /admin/endpoints shows: the fields `of` takes, in their order, as JSON-ready
        builtins (the ones derived from `info` and `stats` left out)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        for derived in _DERIVED:
            del out[derived]
        return out


_DERIVED = ("id", "weight", "priority", "engine_requests")
