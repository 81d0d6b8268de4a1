"""What the registry shows of a replica: a `Snapshot`.

A value: built by the registry (registry.py) from its live state for every
endpoint of the model on every request, read by the scheduler, the proxy and
/admin/endpoints without a lock, never changed.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.stats import Stats
from llmgw.wire.endpoints import EndpointInfo


class Snapshot:
    """Everything the scheduler knows of one endpoint, as a value read without a lock.

    Built by keyword only; immutable (`Final`: nothing assigns its attributes after
    construction). It also carries the few figures of `info` and `stats` the
    scheduler reads per request (`id`, `weight`, `priority`, `engine_requests`), as
    the registry keeps them: reading them off `info` (a Struct) and `stats` for
    every endpoint of every request cost more than passing them. `Snapshot.of`
    derives them.

    A class of this compiled module (compiled.py), not a msgspec Struct or a frozen
    dataclass: one is built for every endpoint of the model on every request and
    the compiled scheduler reads a dozen of its fields. Compiled, this class is built
    and read natively; a Struct's keyword construction and its attributes, read
    through CPython's generic lookup, cost the default policy more instructions a
    request, and a frozen dataclass's generated `__init__` more again (the figures:
    bench/RESULTS.md, "Snapshot's shape"). So its equality, hash and repr are
    written here, off the request path (`_key`).
    """

    __slots__ = (
        "age_s",
        "breaker",
        "decode_rate",
        "drain_rate",
        "engine_requests",
        "id",
        "inflight",
        "inflight_at_scrape",
        "info",
        "opened_total",
        "owed_count",
        "owed_full",
        "owed_tokens",
        "pending",
        "prefill_s_per_token",
        "priority",
        "probe_in_s",
        "restarts",
        "running_capacity",
        "stale",
        "stats",
        "weight",
    )

    # Keyword-only, the required ones first: mypyc cannot write the text signature of a
    # method with a required parameter after one with a default.
    def __init__(
        self,
        *,
        info: EndpointInfo,
        stats: Stats | None,
        drain_rate: float,
        inflight: int,
        running_capacity: int,
        stale: bool,
        age_s: float | None,
        breaker: BreakerState,
        restarts: int,
        id: str,
        weight: float,
        priority: int,
        engine_requests: int | None,
        inflight_at_scrape: int = 0,
        pending: int = 0,
        probe_in_s: float | None = None,
        opened_total: int = 0,
        owed_tokens: int = 0,
        owed_full: int = 0,
        prefill_s_per_token: float | None = None,
        owed_count: int = 0,
        decode_rate: float = 0.0,
    ) -> None:
        self.info: Final = info
        # The last successful scrape; None: never scraped since the endpoint appeared.
        self.stats: Final = stats
        # Finished requests per second, exponentially smoothed (α 0.3). This is
        # AIBrix's load signal: running alone cannot tell that a replica is slow.
        # 0.0 until two scrapes with a finished-request counter have been seen, and
        # always for engines without one (llama.cpp); it only breaks ties.
        self.drain_rate: Final = drain_rate
        # Requests this router dispatched here that have not finished (all its
        # workers together: shared.py). It compensates for scrape lag: without it,
        # herding is unavoidable within an interval.
        self.inflight: Final = inflight
        # The highest `running` ever observed: the engine's batch capacity, learned
        # rather than configured. Kept across engine restarts (the seed's "max ever"):
        # a restarted engine has the same batch limit. 0 until the first scrape.
        self.running_capacity: Final = running_capacity
        # No successful scrape within `stale_after_s`, or never scraped. Stale
        # endpoints are scored down, not dropped.
        self.stale: Final = stale
        # Seconds since the last successful scrape; None if never scraped.
        self.age_s: Final = age_s
        # Read without side effects: an open breaker past its cooldown reads half_open.
        self.breaker: Final = breaker
        # Engine restarts observed (a counter went backwards).
        self.restarts: Final = restarts
        # `inflight` when the last scrape was recorded: the engine's figures already
        # contain (roughly) these, so the requests it has not yet reported are
        # inflight − inflight_at_scrape (the scheduler's load estimate, `load_of`).
        self.inflight_at_scrape: Final = inflight_at_scrape
        # Of `inflight`, the streamed requests whose first token has not come yet (all
        # workers together): queued at the engine or in prefill. Live, where the
        # engine's own `waiting` is a scrape old; the scheduler counts it as queue
        # (`load_of`). Requests that do not stream never count: their answer comes whole.
        self.pending: Final = pending
        # Seconds until an open breaker admits its probe; None unless open.
        self.probe_in_s: Final = probe_in_s
        # Times the breaker has opened: a rise means a probe failed (holding.hold_until).
        self.opened_total: Final = opened_total
        # From `info` and `stats` (they must agree with them): info.id, info.weight,
        # info.priority, and the engine's running + waiting as of the last scrape
        # (None: never scraped).
        self.id: Final = id
        self.weight: Final = weight
        self.priority: Final = priority
        self.engine_requests: Final = engine_requests
        # Of `inflight` (this worker's), the `owed_count` that gave max_tokens: the tokens
        # they may still generate (less the events streamed), and max_tokens summed.
        self.owed_tokens: Final = owed_tokens
        self.owed_full: Final = owed_full
        self.owed_count: Final = owed_count
        # pace.py: tokens a second per running sequence (0.0: not learned), seconds of
        # prefill per computed prompt token (None: not learned, or not exported).
        self.decode_rate: Final = decode_rate
        self.prefill_s_per_token: Final = prefill_s_per_token

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
        out = {name: getattr(self, name) for name in _SHOWN}
        out["info"] = msgspec.to_builtins(self.info)
        out["stats"] = None if self.stats is None else msgspec.to_builtins(self.stats)
        out["breaker"] = self.breaker.value
        return out

    def _key(self) -> tuple[object, ...]:
        # Off the request path (equality, hash, repr, /admin/endpoints): by name.
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Snapshot):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in zip(_FIELDS, self._key(), strict=True))
        return f"Snapshot({fields})"


# What /admin/endpoints shows, in order: what `of` takes.
_SHOWN: Final = (
    "info",
    "stats",
    "drain_rate",
    "inflight",
    "running_capacity",
    "stale",
    "age_s",
    "breaker",
    "restarts",
    "inflight_at_scrape",
    "pending",
    "probe_in_s",
    "opened_total",
    "owed_tokens",
    "owed_full",
    "prefill_s_per_token",
    "owed_count",
    "decode_rate",
)
# Every field (equality, hash, repr): those shown, and those derived from them.
_FIELDS: Final = (*_SHOWN, "id", "weight", "priority", "engine_requests")
