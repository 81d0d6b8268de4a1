"""Routing policies: ours (scheduler + prefix affinity) and two baselines to measure it by.

`policy: ours | round_robin | least_inflight` in the config picks one. The
baselines are real features (a fleet without a prefix workload may want plain
round-robin) and the yardsticks of `bench/routing.py`. Every policy returns a
`scheduler.Decision`, so the proxy, headers and logs do not care which ran.

Baselines skip endpoints whose breaker reads open, like the scheduler; the
registry's `acquire()` still has the last word.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot, Stats
from llmgw.router.routing.affinity import RouteKey, SessionAffinity
from llmgw.router.routing.blockhash import block_end, blocks_covering
from llmgw.router.routing.feedback import CHARS_PER_TOKEN, PredictionCheck
from llmgw.router.routing.kvevents import KVEventIndex
from llmgw.router.routing.prefix import PrefixIndex, capacity_units_for
from llmgw.router.routing.rendezvous import Homes
from llmgw.router.routing.scheduler import Decision, SchedulerConfig, choose


class Policy(Protocol):
    name: str
    # Whether requests need their prefix hashes computed (baselines do not).
    uses_prefix: bool

    def choose(
        self,
        snaps: Sequence[Snapshot],
        key: RouteKey,
        exclude: Collection[str],
        *,
        record: bool = True,
    ) -> Decision:
        """The replica for the request. `record=False` asks without dispatching: the
        caller may hold the request instead, and calls `dispatched` if it sends it."""
        ...

    def dispatched(self, decision: Decision, snaps: Sequence[Snapshot], key: RouteKey) -> None:
        """The request is sent where `decision` (from `choose(record=False)`) says."""
        ...

    def served(
        self,
        endpoint_id: str,
        key: RouteKey,
        stats: Stats | None,
        *,
        decision: Decision | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        """A request completed on the endpoint. `decision`: the one that sent it
        there; `cached_tokens`: the engine's usage.prompt_tokens_details, when
        the response carried it (feedback.py)."""
        ...


class Ours:
    """The scheduler with prefix affinity and session hints (docs/routing.md)."""

    name = "ours"
    uses_prefix = True

    def __init__(
        self,
        prefix: PrefixIndex,
        cfg: SchedulerConfig | None = None,
        *,
        sessions: SessionAffinity | None = None,
        check: PredictionCheck | None = None,
        exact: KVEventIndex | None = None,
    ) -> None:
        self.prefix = prefix
        self.cfg = cfg or SchedulerConfig()
        self.sessions = sessions if sessions is not None else SessionAffinity()
        self.check = check if check is not None else PredictionCheck(prefix)
        # Endpoints in precise mode answer from their KV events (kvevents.py).
        self.exact = exact
        # Each request's home order, when the scheduler needs one (rendezvous.py).
        self.homes = Homes()

    def choose(
        self,
        snaps: Sequence[Snapshot],
        key: RouteKey,
        exclude: Collection[str],
        *,
        record: bool = True,
    ) -> Decision:
        hashes = key.hashes
        if not hashes:
            return choose(snaps, exclude=exclude, cfg=self.cfg)
        ids = [s.id for s in snaps]
        matches = self.prefix.match(hashes, ids)
        exact = self.exact
        # `follows` first: no endpoint in precise mode (the common case) costs no call.
        if exact is not None and exact.follows and key.body is not None:
            precise = exact.precise_among(ids)
            if precise:
                self._exact_matches(matches, key.body, precise, len(hashes))
        gains, common = _shares(matches, ids, len(hashes))
        d = choose(
            snaps,
            prefix_matches=matches,
            prefix_gain=gains,
            prefix_common=common,
            # What a holder's gain is a share of, in tokens (4 bytes a token, feedback.py).
            prompt_tokens=block_end(len(hashes) - 1) / CHARS_PER_TOKEN,
            # A prefix nobody has seen goes to its home replica: routers that never
            # talk still agree on it (rendezvous.py).
            home_order=self.homes.lazy(hashes[0], ids),
            exclude=exclude,
            session_endpoint=self.sessions.last(key),
            cfg=self.cfg,
        )
        if record:
            self.dispatched(d, snaps, key)
        return d

    def dispatched(self, decision: Decision, snaps: Sequence[Snapshot], key: RouteKey) -> None:
        # Remembered at dispatch, not only on completion: an engine takes (and evicts
        # for) a request's blocks when it schedules it, and a later request with the
        # same prefix hits them while the first still runs. Recording only completions
        # left the index believing in prefixes the engine had already evicted for the
        # requests in flight (bench/routing.py, cache-starved: a sixth of requests went
        # to such a "holder"), and sent the same prefix elsewhere until its first
        # request finished. A request that then fails leaves an entry the LRU ages out.
        # Never at a choice that was not sent: a request flow control holds would leave
        # a holder where nothing ran, and push real ones out of the LRU.
        eid = decision.endpoint_id
        if eid is None or not key.hashes:
            return
        stats = None
        for s in snaps:
            if s.id == eid:
                stats = s.stats
                break
        self._record(eid, key.hashes, stats)
        self.sessions.served(key, eid)

    def _exact_matches(
        self, matches: dict[str, int], body: Mapping[str, Any], precise: list[str], n: int
    ) -> None:
        """Replace the guesses for endpoints in precise mode by what their events say.

        The scheduler compares holders in the guessing index's blocks, so an exact
        match of m of the prompt's T tokens counts as the blocks covering the same
        share of the routed bytes. An endpoint whose tokenizer cannot read the
        request keeps its guess.
        """
        assert self.exact is not None
        total = block_end(n - 1)
        for eid, (held, tokens) in self.exact.match(body, precise).items():
            blocks = min(n, blocks_covering(held * total // tokens)) if held and tokens else 0
            if blocks:
                matches[eid] = blocks
            else:
                matches.pop(eid, None)

    def _record(self, endpoint_id: str, hashes: Sequence[int], stats: Stats | None) -> None:
        capacity = None if stats is None else stats.kv_capacity_tokens
        self.prefix.record(endpoint_id, hashes, capacity_units=capacity_units_for(capacity))

    def served(
        self,
        endpoint_id: str,
        key: RouteKey,
        stats: Stats | None,
        *,
        decision: Decision | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        # Called on completion (choose() recorded the chain at dispatch): the engine
        # frees a finished request's blocks as its most recently used, so recording
        # them again keeps the index's LRU order close to the engine's, where that
        # order can matter (PrefixIndex.completed).
        if not key.hashes:
            return
        units = capacity_units_for(None if stats is None else stats.kv_capacity_tokens)
        if decision is not None and cached_tokens is not None:
            self.check.check(
                endpoint_id, key.hashes, decision.blocks_of(endpoint_id), cached_tokens, units
            )
        self.prefix.completed(endpoint_id, key.hashes, capacity_units=units)


def _shares(matches: dict[str, int], ids: Sequence[str], n: int) -> tuple[dict[str, float], float]:
    """Per holder, the share of the prompt's routed bytes it holds beyond what every
    endpoint holds (a preamble cached everywhere saves nothing by going anywhere); and
    that common share."""
    if not matches:
        return {}, 0.0
    common = -1
    for e in ids:
        held = matches.get(e, 0)
        if common < 0 or held < common:
            common = held
    base = block_end(common - 1) if common > 0 else 0
    total = block_end(n - 1)
    out: dict[str, float] = {}
    for e, held in matches.items():
        out[e] = (block_end(held - 1) - base) / total
    return out, base / total


def _candidates(snaps: Sequence[Snapshot], exclude: Collection[str]) -> list[Snapshot]:
    is_open = BreakerState.OPEN
    return [s for s in snaps if s.id not in exclude and s.breaker is not is_open]


def _none(snaps: Sequence[Snapshot]) -> Decision:
    why = "no endpoint serves the model" if not snaps else "every endpoint excluded or open"
    return Decision(endpoint_id=None, scores=(), reason=why)


class _Baseline:
    uses_prefix = False

    def dispatched(self, decision: Decision, snaps: Sequence[Snapshot], key: RouteKey) -> None:
        pass

    def served(
        self,
        endpoint_id: str,
        key: RouteKey,
        stats: Stats | None,
        *,
        decision: Decision | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        pass


class RoundRobin(_Baseline):
    """Each request to the next candidate in id order, load ignored."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(
        self,
        snaps: Sequence[Snapshot],
        key: RouteKey,
        exclude: Collection[str],
        *,
        record: bool = True,
    ) -> Decision:
        cands = _candidates(snaps, exclude)
        if not cands:
            return _none(snaps)
        pick = cands[self._next % len(cands)]
        self._next += 1
        return Decision(endpoint_id=pick.id, scores=(), reason="round_robin")


class LeastInflight(_Baseline):
    """The candidate with the fewest requests this router has in flight there."""

    name = "least_inflight"

    def __init__(self) -> None:
        self._tie = 0

    def choose(
        self,
        snaps: Sequence[Snapshot],
        key: RouteKey,
        exclude: Collection[str],
        *,
        record: bool = True,
    ) -> Decision:
        cands = _candidates(snaps, exclude)
        if not cands:
            return _none(snaps)
        low = min(s.inflight for s in cands)
        tied = [s for s in cands if s.inflight == low]
        # Rotate among ties, or an idle fleet would send everything to the first id.
        pick = tied[self._tie % len(tied)]
        self._tie += 1
        return Decision(endpoint_id=pick.id, scores=(), reason=f"least_inflight {low}")


def make_policy(
    name: str,
    prefix: PrefixIndex,
    *,
    sessions: SessionAffinity | None = None,
    check: PredictionCheck | None = None,
    exact: KVEventIndex | None = None,
) -> Policy:
    if name == "round_robin":
        return RoundRobin()
    if name == "least_inflight":
        return LeastInflight()
    return Ours(prefix, sessions=sessions, check=check, exact=exact)
