"""Which replica serves a request: pure, and explainable.

`choose()` takes the registry's snapshots and the prefix index's matches and
returns a `Decision`: the choice, every endpoint's score and why. No I/O, no
clock, no randomness: the same inputs give the same decision in any process.

The rules, in order:
1. Candidates: not excluded (already tried for this request) and breaker not
   open. Half-open ones are candidates; `acquire()` admits only the one probe.
2. Pool preference: the highest `priority` with an unsaturated candidate
   (total < `saturated_load`); if every candidate is saturated, all of them.
3. Prefix affinity: among those whose total is less than `affinity_load_bound`
   above the least loaded, the one holding the longest leading run of the
   request's blocks (ties: the endpoint that served the request's session last,
   see affinity.py, then lower total). The bound is what prevents hot-spot
   collapse: however popular a prefix, its holder never runs a full bound (a
   full batch, by default) ahead of the least loaded replica, so past 100 %
   load the queue spreads instead of piling onto the engines that happen to
   hold the popular prompts.
   A session hint never outweighs content: it only picks among endpoints
   holding equally long prefixes, all within the bound, and by default only
   one no busier than the content's choice (`session_load_bound`). The bound shrinks
   with what holding the prefix saves (`prefix_gain`): when every replica
   already holds most of the prompt (a long shared preamble), a holder of a
   little more is not worth a queue; it keeps the whole bound while it has room
   to start the request now.
   Within the bound, a holder that would queue the request loses when that queue
   costs more time than recomputing what it saves elsewhere (`wait_s`): with
   answers of a thousand tokens a queue of a few requests costs seconds, which a
   bound counted in requests cannot see. An engine whose KV cache is full counts
   at what it runs, and one without room for what the request must compute makes
   it wait for a request to leave. Used only where what it takes is known
   (max_tokens, decode rate, prefill cost); otherwise the count alone, as before.
4. Home: a prefix nobody within the bound holds goes to the first endpoint of
   its rendezvous order within `home_load_bound` of the least loaded (bounded-
   load consistent hashing): routers that never talk send it to the same place,
   unless it would queue the request longer than the least loaded (`wait_s`).
5. Otherwise the least total; drain rate, then id, break ties.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot

# Re-exported: the scheduler's settings are imported from here.
from llmgw.router.routing.schedconfig import DEFAULT_CONFIG as DEFAULT_CONFIG
from llmgw.router.routing.schedconfig import SchedulerConfig as SchedulerConfig

# The rendezvous order of a request's first block, or a function computing it: most
# requests are decided by a prefix holder or the least loaded and never need it.
HomeOrder = Sequence[str] | Callable[[], Sequence[str]]


def _ranks(home: HomeOrder) -> dict[str, int]:
    """Each endpoint's position in the rendezvous order (its first, if listed twice)."""
    rank: dict[str, int] = {}
    for i, eid in enumerate(home() if callable(home) else home):
        rank.setdefault(eid, i)
    return rank


@dataclass(frozen=True, slots=True, kw_only=True)
class Score:
    id: str
    # Expected queueing a new request meets, in batches (see `load_of`).
    load: float
    stale: bool
    # Leading blocks of the request this endpoint holds (prefix index).
    prefix_blocks: int
    # Position in the request's rendezvous order; None when no order was given.
    home_rank: int | None
    # Where the request's session was served last (affinity.py).
    session: bool
    # load + stale penalty: lower is better.
    total: float
    # Why it was or was not chosen: "chosen", "excluded", "open", "priority",
    # "over bound", or "".
    note: str


class Decision:
    """The choice and why; every endpoint's `Score` is built only when asked.

    Most requests never look at the scores (only the x-llmgw-debug header, the
    DEBUG route log, /admin and the feedback check do), so `choose()` hands over
    its working rows and `scores` turns them into `Score`s on first use: building
    them for every request was about a tenth of the default policy's CPU
    (bench/router_overhead.py --chat).
    """

    __slots__ = ("_rank", "_rows", "_scores", "_session", "endpoint_id", "least", "reason")

    def __init__(
        self,
        *,
        endpoint_id: str | None,
        scores: tuple[Score, ...] = (),
        reason: str,
        rows: Mapping[str, _Row] | None = None,
        rank: HomeOrder = (),
        session_endpoint: str | None = None,
        least: float | None = None,
    ) -> None:
        # None: no candidate (every endpoint excluded or open, or none serves the model).
        self.endpoint_id = endpoint_id
        # The lowest total among the candidates the choice was made from (1.0: a full
        # batch; flow control's saturation test); None: not computed (a baseline policy).
        self.least = least
        # "prefix", "prefix+session", "home", "least-load" or "no-candidate".
        self.reason = reason
        self._scores: tuple[Score, ...] | None = None if rows is not None else scores
        self._rows = rows
        self._rank = rank
        self._session = session_endpoint

    def __repr__(self) -> str:
        return f"Decision({self.endpoint_id!r}, {self.reason!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return (self.endpoint_id, self.reason, self.scores) == (
            other.endpoint_id,
            other.reason,
            other.scores,
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def scores(self) -> tuple[Score, ...]:
        """Every snapshot's score, sorted by id."""
        if self._scores is None:
            rows, rank = self._rows or {}, _ranks(self._rank)
            self._scores = tuple(
                Score(
                    id=eid,
                    load=r.load,
                    stale=r.snap.stale,
                    prefix_blocks=r.blocks,
                    home_rank=rank.get(eid),
                    session=eid == self._session,
                    total=r.total,
                    note=r.note,
                )
                for eid, r in sorted(rows.items())
            )
            self._rows, self._rank = None, ()
        return self._scores

    def header(self) -> str:
        """One line for the x-llmgw-debug header and the route log line:
        `b prefix; a 0.62 p3 h1, b* 0.20 p12 h0, c open`."""
        items = []
        for s in self.scores:
            mark = "*" if s.id == self.endpoint_id else ""
            item = f"{s.id}{mark} {s.total:.2f}"
            if s.prefix_blocks:
                item += f" p{s.prefix_blocks}"
            if s.home_rank is not None:
                item += f" h{s.home_rank}"
            if s.session:
                item += " s"
            if s.stale:
                item += " stale"
            if s.note and s.note != "chosen":
                item += f" {s.note}"
            items.append(item)
        line = f"{self.endpoint_id or '-'} {self.reason}; " + ", ".join(items)
        return "".join(c if " " <= c <= "~" else "?" for c in line)

    def blocks_of(self, endpoint_id: str) -> int:
        """The leading blocks the index said `endpoint_id` held when this was decided."""
        if self._rows is not None:
            row = self._rows.get(endpoint_id)
            return 0 if row is None else row.blocks
        for s in self.scores:
            if s.id == endpoint_id:
                return s.prefix_blocks
        return 0


def load_of(s: Snapshot, cfg: SchedulerConfig = DEFAULT_CONFIG) -> float:
    """Expected queueing for a new request, in batches: estimated requests at the
    engine / capacity / weight.

    The engine's running + waiting is as of the last scrape and already holds
    the router's requests that were in flight then; requests dispatched or
    finished since have changed it by exactly inflight − inflight_at_scrape. So
    the estimate is running + waiting + (inflight − inflight_at_scrape): adding
    all of inflight would count most of it twice and make a busy, healthy engine
    look overloaded (the seed's "what the router has in flight and the engine
    has not yet reported"). Never below inflight: those are surely there.
    Never scraped: inflight alone. The streamed requests still awaiting their
    first token (`Snapshot.pending`) are added again, `pending_weight` times:
    they are the queue a new request joins, seen live.
    """
    # Plain comparisons, each field read once: this runs for every endpoint of every
    # request, and max() over mixed arguments cost more than the arithmetic.
    inflight = s.inflight
    queued = s.engine_requests  # the scrape's running + waiting
    est = float(inflight)
    if queued is not None:
        seen = float(queued + inflight - s.inflight_at_scrape)
        if seen > est:
            est = seen
    capacity = s.running_capacity
    if capacity < cfg.default_capacity:
        capacity = cfg.default_capacity
    if capacity < 1:
        capacity = 1
    weight = s.weight
    if weight <= 0:
        weight = 1.0
    return (est + cfg.pending_weight * s.pending) / capacity / weight


def choose(
    snapshots: Sequence[Snapshot],
    *,
    prefix_matches: Mapping[str, int] | None = None,
    home_order: HomeOrder = (),
    exclude: Collection[str] = (),
    session_endpoint: str | None = None,
    prefix_gain: Mapping[str, float] | None = None,
    prefix_common: float = 0.0,
    prompt_tokens: float | None = None,
    cfg: SchedulerConfig = DEFAULT_CONFIG,
) -> Decision:
    """Pick the endpoint for one request; see the module docstring for the rules.

    `session_endpoint`: the endpoint that served the request's session last, if any.
    `prefix_gain`: per holder, the share of the prompt it holds beyond what every
    candidate holds (scales its load bound); 1.0 for those not listed.
    `prefix_common`: the share of the prompt every candidate holds (a preamble cached
    everywhere), which no replica must compute or find KV room for.
    `prompt_tokens`: the prompt's size, what a holder's gain is a share of; None:
    holders are bounded by counts alone (`wait_s` is not weighed).
    """
    rows = _rows(snapshots, prefix_matches, exclude, cfg)
    cands = [r for r in rows.values() if not r.note]
    if not cands:
        return _decision(None, "no-candidate", rows, home_order, session_endpoint)
    pool = _preferred_pool(cands, cfg)
    least, first = _least_and_first(pool)
    reason = "least-load"
    chosen, within = _longest_holder(
        pool,
        first,
        least,
        prefix_gain=prefix_gain,
        common=prefix_common,
        prompt_tokens=prompt_tokens,
        cfg=cfg,
    )
    if chosen is not None:
        reason = "prefix"
        session = None if session_endpoint is None else rows.get(session_endpoint)
        sticky = _sticky(session, chosen, within, cfg)
        if sticky is not None:
            chosen, reason = sticky, "prefix+session"
    elif home_order:
        if callable(home_order):
            home_order = home_order()
        rest = None if prompt_tokens is None else (1.0 - prefix_common) * prompt_tokens
        chosen = _home(home_order, rows, pool, first=first, least=least, tokens=rest, cfg=cfg)
        if chosen is not None:
            reason = "home"
    if chosen is None:
        chosen = first
    chosen.note = "chosen"
    out = _decision(chosen.id, reason, rows, home_order, session_endpoint)
    out.least = least
    return out


def _sticky(
    session: _Row | None, chosen: _Row, within: list[_Row], cfg: SchedulerConfig
) -> _Row | None:
    """The session's endpoint instead of the content's choice: one holding an equally
    long prefix, within its bound, no busier than `session_load_bound` above it."""
    if (
        session is not None
        and session is not chosen
        and session in within
        and session.blocks == chosen.blocks
        and session.total <= chosen.total + cfg.session_load_bound
    ):
        return session
    return None


def _least_and_first(pool: list[_Row]) -> tuple[float, _Row]:
    """The least total in the pool, and its first row in load order: one pass, no sort."""
    first = pool[0]
    least = first.total
    for r in pool:
        if r.total < least:
            least = r.total
        if _precedes(r, first):
            first = r
    return least, first


def _rows(
    snapshots: Sequence[Snapshot],
    prefix_matches: Mapping[str, int] | None,
    exclude: Collection[str],
    cfg: SchedulerConfig,
) -> dict[str, _Row]:
    """Every snapshot's working row, noted "excluded" or "open" where it is no candidate."""
    # Plain dicts inside (compiled, a Mapping's get is a generic method call).
    matches = prefix_matches if isinstance(prefix_matches, dict) else dict(prefix_matches or {})
    rows: dict[str, _Row] = {}
    is_open = BreakerState.OPEN
    for s in snapshots:
        eid = s.id
        load = load_of(s, cfg)
        total = load + cfg.stale_penalty if s.stale else load
        cur = rows[eid] = _Row(s, eid, load, total, matches.get(eid, 0))
        if eid in exclude:
            cur.note = "excluded"
        elif s.breaker is is_open:
            cur.note = "open"
    return rows


def _longest_holder(
    pool: list[_Row],
    first: _Row,
    least: float,
    *,
    prefix_gain: Mapping[str, float] | None,
    common: float,
    prompt_tokens: float | None,
    cfg: SchedulerConfig,
) -> tuple[_Row | None, list[_Row]]:
    """The holder of the longest run within its load bound (None if none), and every
    holder within its bound; those over it are noted "over bound" or "over wait"."""
    chosen: _Row | None = None
    min_blocks = max(1, cfg.min_prefix_blocks)
    # Strictly below least + bound: a holder a full batch ahead of an idle replica
    # would make the request queue. The least loaded itself always qualifies.
    gains = prefix_gain if isinstance(prefix_gain, dict) else dict(prefix_gain or {})
    full = max(cfg.full_gain_at, 1e-9)
    within: list[_Row] = []
    # The least loaded's wait and prefill cost: computed once, when a holder would queue.
    tokens = 0.0 if prompt_tokens is None else prompt_tokens
    # What no candidate must compute or hold anew (a preamble cached everywhere).
    rest = (1.0 - common) * tokens
    timed = cfg.weigh_queue_time and tokens > 0.0
    alt: tuple[float | None, float] | None = None
    for r in pool:
        if r.blocks < min_blocks:
            continue
        gain = gains.get(r.id, 1.0)
        bound = cfg.affinity_load_bound * min(1.0, gain / full)
        if timed and r is not first and r.total > least:
            if alt is None:
                held = _held_share(first, gains, min_blocks)
                alt = (wait_s(first.snap, cfg, need_tokens=rest - held * tokens), held)
            saving = _saving_s(first.snap, r.snap, gain - alt[1], tokens, cfg)
            # Both uses of the holder's wait need the saving: no saving, no wait.
            wait = None if saving is None else wait_s(r.snap, cfg, need_tokens=rest - gain * tokens)
            if _longer(wait, alt[0], saving):
                r.note = "over wait"
                continue
            # Room now and a known saving: the bound's cut for a small gain is for
            # holders that would queue (see SchedulerConfig.full_gain_at).
            if wait == 0.0 and saving is not None and saving > 0.0:
                bound = cfg.affinity_load_bound
        if r.total <= least or r.total < least + bound:
            within.append(r)
            # The longest run wins; of equal runs, the first in load order.
            if (
                chosen is None
                or r.blocks > chosen.blocks
                or (r.blocks == chosen.blocks and _precedes(r, chosen))
            ):
                chosen = r
        else:
            r.note = "over bound"
    return chosen, within


def _home(
    order: Sequence[str],
    rows: dict[str, _Row],
    pool: list[_Row],
    *,
    first: _Row,
    least: float,
    tokens: float | None,
    cfg: SchedulerConfig,
) -> _Row | None:
    """The first endpoint of the rendezvous order in the pool within `home_load_bound`
    of the least loaded, unless it would queue longer than the least loaded (then
    none: noted "over wait"); `tokens`, the prompt's, all of which it must compute."""
    need = 0.0 if tokens is None else tokens
    for eid in order:
        row = rows.get(eid)
        if row is not None and row in pool and row.total <= least + cfg.home_load_bound:
            if (
                cfg.weigh_queue_time
                and row is not first
                and row.total > least
                and _longer(
                    wait_s(row.snap, cfg, need_tokens=need),
                    wait_s(first.snap, cfg, need_tokens=need),
                    0.0,
                )
            ):
                row.note = "over wait"
                return None
            return row
    return None


def wait_s(
    s: Snapshot, cfg: SchedulerConfig = DEFAULT_CONFIG, *, need_tokens: float = 0.0
) -> float | None:
    """Seconds a new request would wait at `s` for a slot in its batch; None: unknown.

    The requests beyond its capacity C, plus the one new, must first leave: k of
    them; at least one when the request's `need_tokens` (the prompt tokens `s` does
    not hold) are more than its KV cache had free at the last scrape. Within the
    first batch how soon they leave is what the running ones still owe: with their
    remaining decode spread evenly, the k-th of C leaves once k/C of twice the mean
    owed (at most a whole answer) is decoded, at the engine's learned tokens per
    second per sequence; each request past the first batch adds a C-th of a whole
    answer. 0.0 without a queue (or room); None when one is
    there but the decode rate is not learned yet, or no request in flight gave
    max_tokens: then the scheduler compares counts alone, as it always did.
    """
    k = _ahead(s, cfg)
    if k <= 0.0:
        if need_tokens <= 0.0 or not _short_of(s, need_tokens):
            return 0.0
        k = 1.0
    rate = s.decode_rate
    n = s.owed_count
    if rate <= 0.0 or n <= 0 or s.owed_full <= 0:
        return None
    capacity = float(_capacity(s, cfg))
    whole = s.owed_full / n  # tokens a request asks for, on average
    lead = 2.0 * s.owed_tokens / n
    if lead > whole:
        lead = whole
    first = k if k < capacity else capacity
    return (first * lead + (k - first) * whole) / capacity / rate


def _capacity(s: Snapshot, cfg: SchedulerConfig) -> int:
    """The requests `s` runs at once: its learned batch capacity, unless its last scrape
    found requests waiting beside fewer running, and too little KV free for one more of
    the size of those running (what each pins on average); then what ran.

    An engine fills its KV cache short of its batch size when prompts with distinct
    prefixes or long answers pin their blocks for seconds: two or three may fill it.
    Counted at the batch size it looked half empty, and a holder there took requests
    that waited seconds behind the queue for blocks while other replicas idled
    (bench/RESULTS.md, issue 35). Its `waiting` alone does not say so: a request that
    arrives during a long prefill step waits for the next step, with blocks to spare.
    """
    capacity = s.running_capacity
    if capacity < cfg.default_capacity:
        capacity = cfg.default_capacity
    stats = s.stats
    if stats is not None and stats.waiting > 0 and 0 < stats.running < capacity:
        used = stats.kv_usage
        # free < used / running, multiplied out: no division.
        if used is not None and (1.0 - used) * stats.running < used:
            return stats.running
    return capacity if capacity >= 1 else 1


def _short_of(s: Snapshot, tokens: float) -> bool:
    """Whether `s`'s KV cache had fewer than `tokens` free at its last scrape (False
    when its size or usage is not exported): a prompt that does not fit waits for
    running requests to leave, however few run."""
    stats = s.stats
    if stats is None or s.stale:
        return False
    size, used = stats.kv_capacity_tokens, stats.kv_usage
    return size is not None and used is not None and (1.0 - used) * size < tokens


def _requests(s: Snapshot) -> float:
    """Requests at the engine: its last scrape's, corrected as `load_of` does."""
    est = float(s.inflight)
    queued = s.engine_requests
    if queued is not None:
        seen = float(queued + s.inflight - s.inflight_at_scrape)
        if seen > est:
            est = seen
    return est


def _ahead(s: Snapshot, cfg: SchedulerConfig) -> float:
    """Requests that must leave `s`'s batch before a new one gets in (≤ 0: none)."""
    return _requests(s) + cfg.pending_weight * s.pending - _capacity(s, cfg) + 1.0


def _held_share(r: _Row, gains: Mapping[str, float], min_blocks: int) -> float:
    """The share of the prompt beyond the common part that `r` holds already."""
    return gains.get(r.id, 1.0) if r.blocks >= min_blocks else 0.0


def _saving_s(
    alt: Snapshot, holder: Snapshot, share: float, tokens: float, cfg: SchedulerConfig
) -> float | None:
    """Seconds the holder saves over `alt`: `share` of `tokens` prefilled at `alt`'s
    learned cost (the holder's, if `alt` has none), once for the request and once for
    each request at `alt` still awaiting its first token, whose queue or prefill that
    prefill lengthens; None when neither endpoint's cost is known.
    """
    cost = alt.prefill_s_per_token
    if cost is None:
        cost = holder.prefill_s_per_token
    if cost is None or share <= 0.0:
        return None if cost is None else 0.0
    return share * tokens * cost * (1.0 + cfg.pending_weight * alt.pending)


def _longer(wait: float | None, alt_wait: float | None, saving: float | None) -> bool:
    """Whether `wait` (seconds at a replica) is more than `saving` seconds longer than
    `alt_wait` (at the alternative); False whenever a figure is unknown (counts decide,
    as before)."""
    if wait is None or alt_wait is None or saving is None:
        return False
    return wait > alt_wait + saving


class _Row:
    """One endpoint's working figures while a decision is made."""

    __slots__ = ("blocks", "drain", "id", "load", "note", "prio", "snap", "tie", "total")

    def __init__(self, snap: Snapshot, eid: str, load: float, total: float, blocks: int) -> None:
        self.snap, self.id, self.load, self.total = snap, eid, load, total
        self.blocks, self.note, self.drain, self.prio = blocks, "", snap.drain_rate, snap.priority
        # Equal totals to 1e-9 are a tie (float error from differently computed loads):
        # the total in units of 1e-9. round(total, 9) says the same through a decimal
        # string conversion, which cost more than the rest of the row.
        tie = total * 1e9
        self.tie = float(math.floor(tie + 0.5)) if -1e300 < tie < 1e300 else tie


def _precedes(a: _Row, b: _Row) -> bool:
    """Load order: the lower total (ties to 1e-9), then the faster-draining, then the
    lower id."""
    if a.tie != b.tie:
        return a.tie < b.tie
    if a.drain != b.drain:
        return a.drain > b.drain
    return a.id < b.id


def _preferred_pool(cands: list[_Row], cfg: SchedulerConfig) -> list[_Row]:
    """The highest-priority candidates with one unsaturated among them, else all; the
    others noted "priority"."""
    first = cands[0].prio
    for r in cands:
        if r.prio != first:
            break
    else:
        return cands  # one priority: the common case
    for prio in sorted({r.prio for r in cands}, reverse=True):
        pool = [r for r in cands if r.prio == prio]
        if any(r.total < cfg.saturated_load for r in pool):
            for r in cands:
                if r.prio != prio:
                    r.note = "priority"
            return pool
    return cands


def _decision(
    chosen: str | None,
    reason: str,
    rows: Mapping[str, _Row],
    rank: HomeOrder,
    session_endpoint: str | None,
) -> Decision:
    return Decision(
        endpoint_id=chosen, reason=reason, rows=rows, rank=rank, session_endpoint=session_endpoint
    )
