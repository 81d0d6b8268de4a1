"""The upstream replicas the router can send to, with their live state.

A port of the seed `router_endpoint_registry.go`. The endpoint list comes from a
static file today and from the controller's EndpointSink later; the
scheduler and proxy must not notice the difference, which is why the API is
wholesale `replace()` of the list from the start.

Concurrency: the router uses one registry from one asyncio thread and nothing
here awaits, so every method runs to completion without interleaving and no
lock is needed (the seed's mutex guarded Go's goroutines). Calling it from
another thread is a bug.

Clocks: staleness, ages and drain rates use the monotonic reading; `last_used`
is wall-clock unix seconds because it leaves the process (the usage report).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final, Protocol

from llmgw.router.replicas.breaker import (
    DEFAULT_BREAKER_CONFIG,
    Breaker,
    BreakerConfig,
    BreakerState,
    Outcome,
)
from llmgw.router.replicas.pace import decode_rate, drain_rate, prefill_cost, went_backwards
from llmgw.router.replicas.snapshot import Snapshot
from llmgw.router.replicas.stats import Stats
from llmgw.router.workers.shared import SharedInflight
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.wire.endpoints import EndpointInfo

__all__ = ["MAX_OWED", "Registry", "Release", "Snapshot", "Stats"]

# The most tokens one request is counted as owing (a usage count's bound, 2**53). JSON's
# integers have none, and the scheduler averages what is owed as a float: one request
# with a `max_tokens` of 10**400 made every choice at its replica raise OverflowError
# (the other clients' requests answered 500) until the engine refused it.
MAX_OWED: Final = 2**53


class Release(Protocol):
    """Reports how a dispatched request ended. Runs once; later calls do nothing."""

    def __call__(self, outcome: Outcome) -> None: ...

    def started(self) -> None:
        """The engine has answered or sent its first token: no longer `pending`."""

    def streamed(self, events: int) -> None:
        """`events` more events of the answer went out: that many fewer tokens owed."""


class _Live:
    """One endpoint's mutable state; never leaves this module."""

    __slots__ = (
        "breaker",
        "cslot",
        "decode_rate",
        "drain_rate",
        "engine_requests",
        "id",
        "inflight",
        "inflight_at_scrape",
        "info",
        "last_used",
        "max_running",
        "owed",
        "owed_count",
        "owed_full",
        "pending",
        "prefill_cost",
        "priority",
        "pslot",
        "queued_seen",
        "restarts",
        "row",
        "rslot",
        "scraped_at",
        "slot",
        "stats",
        "weight",
    )

    def __init__(self, info: EndpointInfo, breaker: Breaker) -> None:
        self.info = info
        # info's and stats' figures a Snapshot carries, read from them once (set_info,
        # Registry.observe) rather than once per request.
        self.id = info.id
        self.weight = info.weight
        self.priority = info.priority
        self.breaker = breaker
        self.stats: Stats | None = None
        self.engine_requests: int | None = None  # stats' running + waiting
        self.scraped_at: float | None = None  # monotonic
        self.drain_rate = 0.0
        self.max_running = 0
        # Whether a scrape ever found requests waiting at the engine: then it was full,
        # and max_running is its limit rather than the most it was asked to run.
        self.queued_seen = False
        self.restarts = 0
        self.inflight = 0
        self.inflight_at_scrape = 0
        self.pending = 0
        self.owed = self.owed_full = self.owed_count = 0  # Snapshot.owed_*
        self.decode_rate = 0.0  # pace.py, as is prefill_cost
        self.prefill_cost: float | None = None
        # Wall-clock time of the last dispatch; None: not since this router started.
        # Recorded in acquire, the one place a request meets an endpoint, so the
        # idle report costs one pass over replicas per tick, nothing per request.
        self.last_used: float | None = None
        # With workers: this worker's row of the shared table and the endpoint's
        # column in it; each acquire, first token and release writes `inflight`
        # (cell `slot`) and `pending` (cell `pslot`) there.
        self.row: memoryview | None = None
        self.slot = 0
        self.pslot = 0  # its pending count's cell: the row's second quarter
        self.cslot = 0  # its flow-control claim's cell: the row's third quarter
        self.rslot = 0  # its critical reserve's cell: the row's last quarter

    def set_info(self, info: EndpointInfo) -> None:
        self.info = info
        self.id = info.id
        self.weight = info.weight
        self.priority = info.priority


class _Release:
    """The hot-path release: three slots and a flag, no closure, no lock."""

    __slots__ = ("_done", "_full", "_live", "_owed", "_pending", "_probe")

    def __init__(self, live: _Live, probe: bool, pending: bool, max_tokens: int = 0) -> None:
        self._live = live
        self._probe = probe
        self._pending = pending
        self._done = False
        self._owed = self._full = max_tokens

    def streamed(self, events: int) -> None:
        n = events if events < self._owed else self._owed
        if n > 0:
            self._owed -= n
            self._live.owed -= n

    def started(self) -> None:
        if self._pending:
            self._pending = False
            live = self._live
            live.pending -= 1
            if live.row is not None:
                live.row[live.pslot] = live.pending

    def __call__(self, outcome: Outcome) -> None:
        if self._done:
            return
        self._done = True
        self.started()
        live = self._live
        # An endpoint removed by replace() while this request ran is updated in its
        # orphaned state, which nothing reads any more: harmless by construction.
        live.inflight -= 1
        if self._full:
            live.owed, live.owed_full = live.owed - self._owed, live.owed_full - self._full
            live.owed_count, self._owed = live.owed_count - 1, 0  # streamed() no more
        if live.row is not None:
            live.row[live.slot] = live.inflight
        live.breaker.record(outcome, probe=self._probe)


class Registry:
    """The live state of all endpoints; outside it only frozen Snapshots are seen."""

    def __init__(
        self,
        *,
        stale_after_s: float = 10.0,
        breaker: BreakerConfig = DEFAULT_BREAKER_CONFIG,
        clock: Clock = SYSTEM_CLOCK,
        shared: SharedInflight | None = None,
    ) -> None:
        self._stale_after_s = stale_after_s if stale_after_s > 0 else 10.0
        self._breaker_cfg = breaker
        self._clock = clock
        self._live: dict[str, _Live] = {}
        # Sorted views rebuilt on replace(), so per-request reads never sort.
        self._sorted: tuple[_Live, ...] = ()
        self._by_model: dict[str, tuple[_Live, ...]] = {}
        self._version = 0
        # Endpoints replace() removed, kept until their last request is done (and a
        # while after), so usage reports can say "0 in flight" for a draining
        # replica. Without it the controller sees a replica that left the list as
        # unknown and must wait out the whole drain grace.
        self._departed: dict[str, tuple[_Live, float]] = {}
        # One of several workers: in-flight counts are shared (shared.py).
        self._shared = shared

    @property
    def version(self) -> int:
        """Bumped by every replace(), for caches keyed on the endpoint list."""
        return self._version

    def replace(self, infos: Iterable[EndpointInfo]) -> list[str]:
        """Reconcile with a new endpoint list; return the removed ids, sorted.

        Survivors keep their live state (stats, drain rate, inflight, breaker)
        with the new Info; new endpoints get a fresh breaker; removed ones are
        dropped, and the caller purges whatever else it keeps per endpoint.
        """
        old = self._live
        new: dict[str, _Live] = {}
        for info in infos:
            live = old.get(info.id) or new.get(info.id)
            if live is None:
                live = _Live(info, Breaker(self._breaker_cfg, clock=self._clock))
            live.set_info(info)
            new[info.id] = live
        removed = sorted(old.keys() - new.keys())
        now = self._clock.monotonic()
        for rid in removed:
            self._departed[rid] = (old[rid], now)
            self._unshare(old[rid])
        if self._shared is not None:
            for live in new.values():
                self._share(live, self._shared)
        for rid in new.keys() & self._departed.keys():
            del self._departed[rid]
        self._live = new
        self._sorted = tuple(new[k] for k in sorted(new))
        by_model: dict[str, list[_Live]] = {}
        for live in self._sorted:
            for model in dict.fromkeys(live.info.models):
                by_model.setdefault(model, []).append(live)
        self._by_model = {m: tuple(ls) for m, ls in by_model.items()}
        self._version += 1
        return removed

    @staticmethod
    def _unshare(live: _Live) -> None:
        """A departed endpoint's slot may go to another: stop writing it, leave it 0."""
        if live.row is not None:
            row = live.row
            row[live.slot] = row[live.pslot] = row[live.cslot] = row[live.rslot] = 0
            live.row = None

    @staticmethod
    def _share(live: _Live, shared: SharedInflight) -> None:
        slot = shared.slots.get(live.id)
        if slot is None:
            # No slot (the table is full): counted by this worker alone.
            Registry._unshare(live)
            return
        if live.row is None or live.slot != slot:
            Registry._unshare(live)
            live.row, live.slot, live.pslot = shared.row, slot, shared.capacity + slot
            live.cslot = 2 * shared.capacity + slot
            live.rslot = 3 * shared.capacity + slot
            shared.row[slot] = live.inflight
            shared.row[live.pslot] = live.pending

    def _inflight(self, live: _Live) -> int:
        """In flight to `live` from every worker of this router."""
        if live.row is None or self._shared is None:
            return live.inflight
        return self._shared.total(live.slot)

    def _counts(self, live: _Live) -> tuple[int, int]:
        """In flight to `live`, and of those awaiting their first token, from every
        worker of this router."""
        shared = self._shared
        if live.row is None or shared is None:
            return live.inflight, live.pending
        return shared.total(live.slot), shared.pending_total(live.slot)

    def claim(self, model: str, claims: Mapping[str, int]) -> None:
        """Publish this worker's flow-control claims (`claims`: model → the strongest
        request it holds for it, flowgate.py) on `model`'s endpoints, for the other
        workers: each endpoint's cell gets the strongest over the models it serves."""
        for live in self._by_model.get(model, ()):
            row = live.row
            if row is not None:
                best = 0
                for m in live.info.models:
                    c = claims.get(m, 0)
                    if c > best:
                        best = c
                row[live.cslot] = best

    def claimed_elsewhere(self, model: str) -> int:
        """The strongest claim the other workers hold on `model`'s endpoints (0: none,
        or a single worker)."""
        shared = self._shared
        return 0 if shared is None else self._most_elsewhere(model, shared.claim_elsewhere)

    def reserve(self, model: str, stamp: int) -> None:
        """Publish on `model`'s endpoints, for the other workers, when a critical request
        here last needed its critical reserve (`stamp`, flowgate.py)."""
        for live in self._by_model.get(model, ()):
            if live.row is not None:
                live.row[live.rslot] = stamp

    def reserved_elsewhere(self, model: str) -> int:
        """The latest stamp of another worker's critical reserve on `model`'s endpoints
        (0: none, or a single worker)."""
        shared = self._shared
        return 0 if shared is None else self._most_elsewhere(model, shared.reserved_elsewhere)

    def _most_elsewhere(self, model: str, read: Callable[[int], int]) -> int:
        """The largest of `read(slot)` over `model`'s shared endpoints (0: none)."""
        best = 0
        for live in self._by_model.get(model, ()):
            if live.row is not None:
                value = read(live.slot)
                if value > best:
                    best = value
        return best

    def count_queued(self, bucket: int, n: int) -> None:
        """Publish this worker's flow-control requests queued in tenant cell `bucket`."""
        if self._shared is not None:
            self._shared.count_queued(bucket, n)

    def queued_total(self, bucket: int) -> int:
        """Requests queued in tenant cell `bucket` over every worker (0: one worker)."""
        return 0 if self._shared is None else self._shared.queued_total(bucket)

    def observe(self, id: str, stats: Stats) -> bool:
        """Record a successful scrape; True iff a counter reset (engine restart) was seen."""
        live = self._live.get(id)
        if live is None:
            return False
        now = self._clock.monotonic()
        restarted = went_backwards(live.stats, stats)
        if restarted:
            # The engine restarted: its counters start over, so the difference
            # means nothing; reset the rate and skip the derivative.
            live.drain_rate = 0.0
            live.restarts += 1
        elif live.scraped_at is not None and live.stats is not None:
            dt = now - live.scraped_at
            live.drain_rate = drain_rate(live.drain_rate, live.stats, stats, dt)
            live.decode_rate = decode_rate(live.decode_rate, live.stats, stats, dt)
            live.prefill_cost = prefill_cost(live.prefill_cost, live.stats, stats)
        live.stats = stats
        live.engine_requests = stats.running + stats.waiting
        live.scraped_at = now
        live.max_running = max(live.max_running, stats.running)
        if stats.waiting > 0:
            live.queued_seen = True
        live.inflight_at_scrape = self._inflight(live)
        return restarted

    def capacity_shown(self, id: str) -> bool:
        """Whether `id`'s engine was ever seen with requests waiting (flow control:
        its learned capacity is a limit, not only the most it was asked to run)."""
        live = self._live.get(id)
        return live is not None and live.queued_seen

    def scrape_failed(self, id: str) -> None:
        """Note a failed metrics scrape: deliberately nothing.

        A scrape failure is not a request failure, so it does not touch the
        breaker: the endpoint may be serving fine while only its metrics are
        down. It goes stale on its own and scores lower.
        """

    def snapshots(self, model: str | None = None) -> list[Snapshot]:
        """Every endpoint (serving `model`, if given), sorted by id. Breakers are read,
        never consumed."""
        lives = self._sorted if model is None else self._by_model.get(model, ())
        now = self._clock.monotonic()
        return [self._snap(live, now) for live in lives]

    def admits(self, id: str) -> bool:
        """Whether `acquire(id)` would take a request now (its breaker's `admits`); False
        for an unknown endpoint. Reads only: the half-open probe stays untaken."""
        live = self._live.get(id)
        return live is not None and live.breaker.admits()

    def snapshot(self, id: str) -> Snapshot | None:
        live = self._live.get(id)
        return None if live is None else self._snap(live, self._clock.monotonic())

    def _snap(self, live: _Live, now: float) -> Snapshot:
        # Built for every endpoint of the model on every request: a closed breaker
        # (the common case) takes no probe_in_s() call.
        age = None if live.scraped_at is None else now - live.scraped_at
        breaker = live.breaker
        state = breaker.state()
        inflight, pending = self._counts(live)
        return Snapshot(
            info=live.info,
            stats=live.stats,
            drain_rate=live.drain_rate,
            inflight=inflight,
            running_capacity=live.max_running,
            stale=age is None or age > self._stale_after_s,
            age_s=age,
            breaker=state,
            restarts=live.restarts,
            inflight_at_scrape=live.inflight_at_scrape,
            pending=pending,
            # None unless open (a closed or half-open breaker has no probe).
            probe_in_s=None if state is BreakerState.CLOSED else breaker.probe_in_s(),
            opened_total=breaker.opened_total,
            id=live.id,
            weight=live.weight,
            priority=live.priority,
            engine_requests=live.engine_requests,
            owed_tokens=live.owed,
            owed_full=live.owed_full,
            prefill_s_per_token=live.prefill_cost,
            owed_count=live.owed_count,
            decode_rate=live.decode_rate,
        )

    def acquire(
        self, id: str, *, pending: bool = False, max_tokens: int | None = None
    ) -> Release | None:
        """Ask to send one request to `id`.

        None if the endpoint is unknown or its breaker refuses. Otherwise inflight
        is incremented, last_used set, and the caller must call the release with
        the outcome exactly once; later calls are no-ops. Take it with no await
        between acquire and the `try` whose `finally` releases. `pending`: the
        request streams, and counts as pending until `started()` or the release.
        `max_tokens` (None: not given) is owed until streamed or released.
        """
        live = self._live.get(id)
        if live is None:
            return None
        probe = live.breaker.state() is BreakerState.HALF_OPEN
        if not live.breaker.allow():
            return None
        live.inflight += 1
        if pending:
            live.pending += 1
        if live.row is not None:
            live.row[live.slot] = live.inflight
            live.row[live.pslot] = live.pending
        live.last_used = self._clock.wall()
        if max_tokens is None or max_tokens <= 0:
            return _Release(live, probe, pending)
        if max_tokens > MAX_OWED:
            max_tokens = MAX_OWED
        live.owed, live.owed_full = live.owed + max_tokens, live.owed_full + max_tokens
        live.owed_count += 1
        return _Release(live, probe, pending, max_tokens)

    def last_used(self) -> dict[str, float]:
        """Unix seconds of the last dispatch per endpoint.

        Endpoints never used since this router started are absent, not zero:
        "not since I started" and "not for an hour" are different facts, and a
        zero would make every replica the oldest idle one after a router restart
        — nominating the whole fleet for eviction at once.
        """
        return {live.id: live.last_used for live in self._sorted if live.last_used is not None}

    def departed_inflight(self, *, linger_s: float = 30.0) -> dict[str, int]:
        """Requests still in flight to endpoints replace() removed, by id.

        A removed endpoint is listed while requests to it run and for `linger_s`
        after it was removed, so a controller draining it learns the count
        reached zero instead of having to wait out its grace period.
        """
        now = self._clock.monotonic()
        out: dict[str, int] = {}
        for rid, (live, removed_at) in list(self._departed.items()):
            if live.inflight <= 0 and now - removed_at > linger_s:
                del self._departed[rid]
                continue
            out[rid] = max(0, live.inflight)
        return out

    def inflight(self, id: str) -> int:
        live = self._live.get(id)
        return 0 if live is None else self._inflight(live)

    def own_inflight(self) -> dict[str, int]:
        """Requests in flight per endpoint from this process alone (its usage report:
        the supervisor adds the workers' reports up)."""
        return {live.id: live.inflight for live in self._sorted}

    def ids(self) -> list[str]:
        return [live.id for live in self._sorted]

    def infos(self) -> list[EndpointInfo]:
        return [live.info for live in self._sorted]

    def models(self) -> frozenset[str]:
        return frozenset(self._by_model)
