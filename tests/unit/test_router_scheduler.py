"""Scheduler rules, one test each, and its invariants."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot, Stats
from llmgw.router.routing.prefix import PrefixIndex
from llmgw.router.routing.rendezvous import rendezvous_order
from llmgw.router.routing.scheduler import (
    DEFAULT_CONFIG,
    Decision,
    SchedulerConfig,
    choose,
    load_of,
)
from llmgw.wire.endpoints import EndpointInfo


def snap(
    id: str,
    *,
    running: int = 0,
    waiting: int = 0,
    kv: float | None = 0.0,
    scraped: bool = True,
    inflight: int = 0,
    at_scrape: int | None = None,
    capacity: int = 8,
    stale: bool = False,
    breaker: BreakerState = BreakerState.CLOSED,
    weight: float = 1.0,
    priority: int = 0,
    drain: float = 0.0,
    pending: int = 0,
) -> Snapshot:
    """A plain Snapshot; by default inflight is what the last scrape already saw."""
    stats = Stats(running=running, waiting=waiting, kv_usage=kv) if scraped else None
    return Snapshot.of(
        info=EndpointInfo(
            id=id, url=f"http://{id}", models=("m",), weight=weight, priority=priority
        ),
        stats=stats,
        drain_rate=drain,
        inflight=inflight,
        running_capacity=capacity,
        stale=stale or not scraped,
        age_s=1.0 if scraped else None,
        breaker=breaker,
        restarts=0,
        inflight_at_scrape=inflight if at_scrape is None else at_scrape,
        pending=pending,
    )


def scores(d: Decision) -> dict[str, float]:
    return {s.id: round(s.total, 6) for s in d.scores}


class TestCandidates:
    """Which endpoints the scheduler may choose."""

    def test_open_breaker_is_never_chosen(self) -> None:
        """An endpoint whose breaker is open is out, however idle."""
        d = choose([snap("a", breaker=BreakerState.OPEN), snap("b", running=7)])
        assert d.endpoint_id == "b"
        assert next(s.note for s in d.scores if s.id == "a") == "open"

    def test_half_open_is_a_candidate(self) -> None:
        """Half-open endpoints may be chosen; acquire() admits only the probe."""
        d = choose([snap("a", breaker=BreakerState.HALF_OPEN), snap("b", running=7)])
        assert d.endpoint_id == "a"

    def test_excluded_is_never_chosen(self) -> None:
        """Endpoints already tried for this request are skipped."""
        d = choose([snap("a"), snap("b", running=7)], exclude={"a"})
        assert d.endpoint_id == "b"

    def test_no_candidate_gives_none(self) -> None:
        """With every endpoint excluded or open, the decision is None with its reason."""
        d = choose([snap("a", breaker=BreakerState.OPEN), snap("b")], exclude={"b"})
        assert (d.endpoint_id, d.reason, len(d.scores)) == (None, "no-candidate", 2)
        assert choose([]).endpoint_id is None


class TestLoad:
    """The scheduler's load estimate and its tie breaks."""

    def test_least_load_wins_without_prefix_or_home(self) -> None:
        """With nothing cached and no home order, the lowest total wins."""
        d = choose([snap("a", running=6), snap("b", running=2), snap("c", running=4)])
        assert (d.endpoint_id, d.reason) == ("b", "least-load")

    def test_requests_since_the_scrape_count(self) -> None:
        """Requests dispatched after the last scrape are added to the engine's figures."""
        s = snap("a", running=4, inflight=6, at_scrape=2)
        assert load_of(s) == pytest.approx((4 + 4) / 8)

    def test_reported_inflight_is_not_counted_twice(self) -> None:
        """Requests the engine already reported are not added again."""
        assert load_of(snap("a", running=4, inflight=4, at_scrape=4)) == pytest.approx(4 / 8)

    def test_requests_finished_since_the_scrape_lower_the_estimate(self) -> None:
        """Our requests that finished after the scrape leave the engine's old figure."""
        assert load_of(snap("a", running=6, inflight=1, at_scrape=5)) == pytest.approx(2 / 8)

    def test_estimate_is_never_below_our_inflight(self) -> None:
        """What the router has in flight there is surely there."""
        assert load_of(snap("a", running=0, inflight=3, at_scrape=5)) == pytest.approx(3 / 8)

    def test_never_scraped_load_is_the_router_inflight(self) -> None:
        """With no figures at all, the router's own inflight is the estimate."""
        assert load_of(snap("a", scraped=False, inflight=2)) == pytest.approx(2 / 8)

    def test_learned_capacity_divides_load(self) -> None:
        """An engine seen running 32 at once carries 16 requests at half load."""
        assert load_of(snap("a", running=16, capacity=32)) == pytest.approx(0.5)

    def test_small_learned_capacity_uses_the_default(self) -> None:
        """A capacity below default_capacity has not been learned yet."""
        assert load_of(snap("a", running=2, capacity=2)) == pytest.approx(2 / 8)

    def test_weight_divides_load(self) -> None:
        """A replica measured twice as capable carries the same queue at half the load."""
        assert load_of(snap("a", running=8, weight=2.0)) == pytest.approx(0.5)

    def test_requests_awaiting_their_first_token_count_as_queue(self) -> None:
        """Streamed requests still without a first token are queued or in prefill ahead
        of a new one: counted again (pending_weight), live between scrapes."""
        assert load_of(snap("a", running=4, inflight=4, pending=3)) == pytest.approx(7 / 8)
        cfg = SchedulerConfig(pending_weight=0.5)
        assert load_of(snap("a", running=4, inflight=4, pending=2), cfg) == pytest.approx(5 / 8)
        # Equal counts, and the scrape says neither queues: the one whose requests
        # are getting their first tokens wins, and so does a holder of the prefix
        # whose requests are served, over one whose requests wait.
        d = choose([snap("a", running=6, inflight=6, pending=5), snap("b", running=6, inflight=6)])
        assert d.endpoint_id == "b"
        d = choose(
            [snap("a", running=6, inflight=6, pending=6), snap("b", running=5, inflight=5)],
            prefix_matches={"a": 20, "b": 20},
        )
        assert (d.endpoint_id, d.reason) == ("b", "prefix")

    def test_kv_usage_is_not_load(self) -> None:
        """A scraped KV usage sample does not move the total: an engine whose batch
        finished after the scrape is not full, and one short of KV shows it as waiting."""
        d = choose([snap("a", running=2, kv=0.99), snap("b", running=3, kv=0.5)])
        assert d.endpoint_id == "a"
        assert scores(d) == {"a": round(2 / 8, 6), "b": round(3 / 8, 6)}
        d = choose([snap("a", running=2, waiting=2, kv=0.99), snap("b", running=3, kv=None)])
        assert d.endpoint_id == "b"

    def test_stale_is_scored_down_not_dropped(self) -> None:
        """A stale endpoint loses to an equally loaded fresh one, but is still a candidate."""
        assert choose([snap("a", stale=True), snap("b", running=1)]).endpoint_id == "b"
        assert choose([snap("a", stale=True)]).endpoint_id == "a"

    def test_drain_rate_breaks_ties(self) -> None:
        """Among equal totals the faster-draining endpoint wins."""
        d = choose([snap("a", running=3, drain=1.0), snap("b", running=3, drain=4.0)])
        assert d.endpoint_id == "b"

    def test_id_breaks_remaining_ties(self) -> None:
        """With nothing else to tell them apart, the lower id wins."""
        assert choose([snap("b"), snap("a")]).endpoint_id == "a"


class TestPriority:
    """Priority classes and their spill when saturated."""

    def test_higher_priority_preferred_while_unsaturated(self) -> None:
        """A busier endpoint in the preferred pool wins over an idle lower one."""
        d = choose([snap("hi", running=6, priority=1), snap("lo", priority=0)])
        assert d.endpoint_id == "hi"
        assert next(s.note for s in d.scores if s.id == "lo") == "priority"

    def test_saturated_priority_spills_to_lower(self) -> None:
        """When every endpoint of the preferred pool is saturated, the next pool serves."""
        d = choose([snap("hi", running=8, waiting=2, priority=1), snap("lo", priority=0)])
        assert d.endpoint_id == "lo"

    def test_all_saturated_chooses_among_all(self) -> None:
        """With every pool saturated the least loaded anywhere wins."""
        d = choose([snap("hi", running=8, waiting=9, priority=1), snap("lo", running=8, waiting=1)])
        assert d.endpoint_id == "lo"


class TestAffinity:
    """Prefix and session affinity within the load bound."""

    def test_longest_prefix_wins_within_the_bound(self) -> None:
        """The endpoint holding most of the request wins though somewhat busier."""
        snaps = [snap("a", running=3), snap("b", running=1), snap("c")]
        d = choose(snaps, prefix_matches={"a": 12, "b": 3})
        assert (d.endpoint_id, d.reason) == ("a", "prefix")

    def test_prefix_holder_over_the_bound_loses(self) -> None:
        """A holder loaded beyond the bound over the least loaded is passed over."""
        snaps = [snap("a", running=9), snap("b", running=1), snap("c")]
        d = choose(snaps, prefix_matches={"a": 12, "b": 3})
        assert (d.endpoint_id, d.reason) == ("b", "prefix")
        assert next(s.note for s in d.scores if s.id == "a") == "over bound"

    def test_holder_under_a_full_batch_ahead_wins(self) -> None:
        """Below a full batch over an idle replica, the holder keeps its prefix."""
        d = choose([snap("a", running=7), snap("b")], prefix_matches={"a": 12})
        assert (d.endpoint_id, d.reason) == ("a", "prefix")

    def test_holder_a_full_batch_ahead_loses(self) -> None:
        """At exactly the bound (a full batch over an idle replica) the request would
        queue, so the holder is passed over."""
        d = choose([snap("a", running=8), snap("b")], prefix_matches={"a": 12})
        assert d.endpoint_id == "b"
        assert next(s.note for s in d.scores if s.id == "a") == "over bound"

    def test_session_breaks_a_tie_of_prefix_and_load(self) -> None:
        """Of two equally long, equally loaded holders, the session's last one takes the
        request (without the hint the id would decide: a)."""
        snaps = [snap("a", running=1), snap("b", running=1)]
        d = choose(snaps, prefix_matches={"a": 5, "b": 5}, session_endpoint="b")
        assert (d.endpoint_id, d.reason) == ("b", "prefix+session")

    def test_session_does_not_pull_to_a_busier_holder(self) -> None:
        """One request busier, the content's choice stands, though the session holder is
        within the affinity bound: the hint could save at most a block's worth of cache."""
        snaps = [snap("a"), snap("b", running=1)]
        d = choose(snaps, prefix_matches={"a": 5, "b": 5}, session_endpoint="b")
        assert (d.endpoint_id, d.reason) == ("a", "prefix")

    def test_a_session_bound_lets_the_hint_pull_that_far(self) -> None:
        """`session_load_bound` is how far it may pull: a quarter batch admits two more
        requests at a batch of 8, not three."""
        cfg = SchedulerConfig(session_load_bound=0.25)
        for running, want in ((2, "b"), (3, "a")):
            snaps = [snap("a"), snap("b", running=running)]
            d = choose(snaps, prefix_matches={"a": 5, "b": 5}, session_endpoint="b", cfg=cfg)
            assert d.endpoint_id == want

    def test_zero_bound_still_admits_the_least_loaded_holder(self) -> None:
        """With no slack at all, a holder that is itself the least loaded still wins."""
        cfg = SchedulerConfig(affinity_load_bound=0.0)
        d = choose([snap("a"), snap("b", running=1)], prefix_matches={"a": 5}, cfg=cfg)
        assert (d.endpoint_id, d.reason) == ("a", "prefix")

    def test_equal_prefixes_go_to_the_lower_load(self) -> None:
        """Among holders of the same run, the less loaded one wins."""
        d = choose([snap("a", running=2), snap("b", running=1)], prefix_matches={"a": 4, "b": 4})
        assert d.endpoint_id == "b"

    def test_short_matches_below_min_prefix_blocks_do_not_count(self) -> None:
        """Matches under min_prefix_blocks are treated as no match."""
        cfg = SchedulerConfig(min_prefix_blocks=3)
        d = choose([snap("a", running=1), snap("b")], prefix_matches={"a": 2}, cfg=cfg)
        assert (d.endpoint_id, d.reason) == ("b", "least-load")

    def test_unseen_prefix_goes_home(self) -> None:
        """With no holder, the first endpoint of the rendezvous order wins if within bound."""
        snaps = [snap("a"), snap("b", running=1), snap("c")]
        d = choose(snaps, home_order=["b", "c", "a"])
        assert (d.endpoint_id, d.reason) == ("b", "home")

    def test_home_walk_skips_an_overloaded_home(self) -> None:
        """A home beyond the bound is skipped for the next in the order (bounded load)."""
        snaps = [snap("a"), snap("b", running=4), snap("c", running=1)]
        d = choose(snaps, home_order=["b", "c", "a"])
        assert (d.endpoint_id, d.reason) == ("c", "home")

    def test_home_walk_ignores_non_candidates(self) -> None:
        """An excluded or open home is skipped."""
        snaps = [snap("a"), snap("b"), snap("c", breaker=BreakerState.OPEN)]
        d = choose(snaps, home_order=["c", "b", "a"], exclude={"a"})
        assert (d.endpoint_id, d.reason) == ("b", "home")

    def test_small_gain_shrinks_the_bound(self) -> None:
        """A holder whose extra prefix is a small share of the prompt gets a proportionally
        smaller bound: 4 requests ahead (half a batch) wins at full gain, loses at 10 %
        (a bound of 0.4 batch)."""
        snaps = [snap("a", running=4), snap("b")]
        assert choose(snaps, prefix_matches={"a": 12, "b": 10}).endpoint_id == "a"
        d = choose(snaps, prefix_matches={"a": 12, "b": 10}, prefix_gain={"a": 0.1, "b": 0.0})
        assert d.endpoint_id == "b"
        assert next(s.note for s in d.scores if s.id == "a") == "over bound"
        # A quarter of the prompt or more is worth the full bound.
        d = choose(snaps, prefix_matches={"a": 12, "b": 10}, prefix_gain={"a": 0.25, "b": 0.0})
        assert d.endpoint_id == "a"
        d = choose(snaps, prefix_matches={"a": 12, "b": 10}, prefix_gain={"a": 0.12, "b": 0.0})
        assert d.endpoint_id == "b"

    def test_prefix_beats_home(self) -> None:
        """A holder within the bound wins over the home of the first block."""
        d = choose([snap("a"), snap("b")], prefix_matches={"b": 2}, home_order=["a", "b"])
        assert (d.endpoint_id, d.reason) == ("b", "prefix")


class TestExplanation:
    """The scores and header that explain a choice."""

    def test_scores_cover_every_snapshot_sorted_by_id(self) -> None:
        """Every snapshot has a score, sorted by id, whatever the input order."""
        d = choose([snap("c"), snap("a"), snap("b", breaker=BreakerState.OPEN)])
        assert [s.id for s in d.scores] == ["a", "b", "c"]

    def test_header_is_one_printable_line_naming_the_scores(self) -> None:
        """The debug header names the choice, the reason and every endpoint's total."""
        d = choose(
            [snap("a", running=2), snap("b", stale=True), snap("c", breaker=BreakerState.OPEN)],
            prefix_matches={"a": 3},
            home_order=["b", "a", "c"],
        )
        assert d.header() == "a prefix; a* 0.25 p3 h1, b 1.00 h0 stale, c 0.00 h2 open"

    def test_header_of_no_candidate(self) -> None:
        """No choice renders as a dash."""
        assert choose([]).header() == "- no-candidate; "


def snapshot_strategy(id: str) -> st.SearchStrategy[Snapshot]:
    return st.builds(
        snap,
        st.just(id),
        running=st.integers(0, 20),
        waiting=st.integers(0, 10),
        kv=st.one_of(st.none(), st.floats(0, 1)),
        scraped=st.booleans(),
        inflight=st.integers(0, 10),
        at_scrape=st.integers(0, 10),
        capacity=st.integers(0, 32),
        stale=st.booleans(),
        breaker=st.sampled_from(list(BreakerState)),
        weight=st.sampled_from([0.5, 1.0, 2.0]),
        priority=st.integers(0, 2),
        drain=st.floats(0, 10),
    )


fleet = st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8).flatmap(
    lambda ids: st.tuples(*(snapshot_strategy(i) for i in ids))
)


class TestInvariants:
    """Invariants of every choice."""

    @settings(max_examples=300)
    @given(
        fleet,
        st.sets(st.sampled_from("abcdefgh")),
        st.dictionaries(st.sampled_from("abcdefgh"), st.integers(1, 50)),
        st.permutations("abcdefgh"),
        st.randoms(use_true_random=False),
    )
    def test_choice_is_a_candidate_deterministic_and_bounded(
        self,
        snaps: tuple[Snapshot, ...],
        exclude: set[str],
        matches: dict[str, int],
        home: list[str],
        rnd: random.Random,
    ) -> None:
        """Never an excluded or open endpoint; None only when no candidate; the same
        decision for any input order; never beyond the larger bound over the least
        loaded candidate of its pool."""
        cfg = SchedulerConfig()
        d = choose(snaps, prefix_matches=matches, home_order=home, exclude=exclude, cfg=cfg)
        cands = [s for s in snaps if s.id not in exclude and s.breaker is not BreakerState.OPEN]
        if not cands:
            assert d.endpoint_id is None
            return
        assert d.endpoint_id in {s.id for s in cands}
        shuffled = list(snaps)
        rnd.shuffle(shuffled)
        again = choose(shuffled, prefix_matches=matches, home_order=home, exclude=exclude)
        assert again == d
        total = {s.id: s.total for s in d.scores}
        chosen = next(s for s in cands if s.id == d.endpoint_id)
        pool = [s for s in cands if s.info.priority == chosen.info.priority]
        least = min(total[s.id] for s in pool)
        bound = max(cfg.affinity_load_bound, cfg.home_load_bound)
        assert total[chosen.id] <= least + bound + 1e-9

    def test_one_hot_prefix_spreads_instead_of_piling_up(self) -> None:
        """Past 100 % load, a burst of requests sharing one prefix keeps every replica
        within the affinity bound of the least loaded (no hot-spot collapse)."""
        ids = [f"e{i}" for i in range(8)]
        inflight = Counter[str]()
        idx = PrefixIndex()
        hashes = [11, 22, 33]
        for _ in range(400):  # 400 requests on 8 × 8 slots: 6× over capacity
            snaps = [snap(i, inflight=inflight[i], at_scrape=0) for i in ids]
            d = choose(
                snaps,
                prefix_matches=idx.match(hashes, ids),
                home_order=rendezvous_order(hashes[0], ids),
            )
            assert d.endpoint_id is not None
            inflight[d.endpoint_id] += 1
            idx.record(d.endpoint_id, hashes, capacity_units=None)
            spread = max(inflight[i] for i in ids) - min(inflight[i] for i in ids)
            assert spread <= DEFAULT_CONFIG.affinity_load_bound * 8 + 1
        assert min(inflight[i] for i in ids) >= 45


def _reference(
    snaps: list[Snapshot],
    matches: dict[str, int],
    home: list[str],
    exclude: tuple[str, ...],
    session: str | None,
    gains: dict[str, float] | None,
    cfg: SchedulerConfig = DEFAULT_CONFIG,
) -> tuple[str | None, str, dict[str, str]]:
    """The module docstring's rules written plainly (a sort by load order), to hold the
    one-pass `choose()` to: chosen id, reason and every endpoint's note."""
    notes: dict[str, str] = {}
    totals: dict[str, float] = {}
    by_id = {}
    for s in snaps:
        by_id[s.info.id] = s
        totals[s.info.id] = load_of(s, cfg) + (cfg.stale_penalty if s.stale else 0.0)
        notes[s.info.id] = (
            "excluded" if s.info.id in exclude else "open" if s.breaker is BreakerState.OPEN else ""
        )
    cands = [e for e in by_id if not notes[e]]
    if not cands:
        return None, "no-candidate", notes
    pool = cands
    prios = sorted({by_id[e].info.priority for e in cands}, reverse=True)
    if len(prios) > 1:
        for p in prios:
            tier = [e for e in cands if by_id[e].info.priority == p]
            if any(totals[e] < cfg.saturated_load for e in tier):
                pool = tier
                break
    for e in cands:
        if e not in pool:
            notes[e] = "priority"
    least = min(totals[e] for e in pool)
    order = sorted(pool, key=lambda e: (round(totals[e], 9), -by_id[e].drain_rate, e))
    full = max(cfg.full_gain_at, 1e-9)
    within = []
    for e in order:
        if matches.get(e, 0) < max(1, cfg.min_prefix_blocks):
            continue
        bound = cfg.affinity_load_bound * min(1.0, (gains or {}).get(e, 1.0) / full)
        if totals[e] <= least or totals[e] < least + bound:
            within.append(e)
        else:
            notes[e] = "over bound"
    chosen, reason = order[0], "least-load"
    if within:
        chosen, reason = max(within, key=lambda e: matches[e]), "prefix"
        if (
            session is not None
            and session != chosen
            and session in within
            and matches[session] == matches[chosen]
            and totals[session] <= totals[chosen] + cfg.session_load_bound
        ):
            chosen, reason = session, "prefix+session"
    else:
        for e in home:
            if e in pool and totals[e] <= least + cfg.home_load_bound:
                chosen, reason = e, "home"
                break
    notes[chosen] = "chosen"
    return chosen, reason, notes


class TestAgainstTheReference:
    """The scheduler agrees with a plain reference of its rules."""

    @settings(max_examples=400, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.integers(0, 2),  # running
                st.integers(0, 1),  # waiting
                st.integers(0, 3),  # inflight
                st.sampled_from([8, 8, 8, 16]),  # learned capacity
                st.sampled_from([0.0, 0.0, 1.0, 2.5]),  # drain
                st.sampled_from([0, 0, 1]),  # priority
                st.sampled_from([1.0, 1.0, 0.5, 2.0]),  # weight
                st.sampled_from(list(BreakerState) + [BreakerState.CLOSED] * 4),
                st.integers(0, 6),  # prefix blocks held
                st.booleans(),  # stale
            ),
            min_size=1,
            max_size=6,
        ),
        st.randoms(use_true_random=False),
    )
    def test_choose_agrees_with_the_plain_rules(
        self, rows: list[tuple[Any, ...]], rnd: random.Random
    ) -> None:
        """Same choice, reason and notes as the rules done by sorting, ties included
        (small integers make equal totals common)."""
        snaps = [
            snap(
                f"e{i}",
                running=r,
                waiting=w,
                inflight=f,
                at_scrape=rnd.randint(0, f),
                capacity=c,
                drain=d,
                priority=p,
                weight=wt,
                breaker=b,
                stale=stale,
                pending=rnd.randint(0, f),
            )
            for i, (r, w, f, c, d, p, wt, b, _, stale) in enumerate(rows)
        ]
        ids = [s.info.id for s in snaps]
        matches = {f"e{i}": row[8] for i, row in enumerate(rows) if row[8]}
        gains = (
            {e: rnd.choice([0.0, 0.1, 0.3, 1.0]) for e in matches} if rnd.random() < 0.7 else None
        )
        home = rnd.sample(ids, len(ids)) if rnd.random() < 0.7 else []
        exclude = tuple(e for e in ids if rnd.random() < 0.15)
        session = rnd.choice([*ids, None])
        d = choose(
            snaps,
            prefix_matches=matches,
            home_order=home,
            exclude=exclude,
            session_endpoint=session,
            prefix_gain=gains,
        )
        want = _reference(snaps, matches, home, exclude, session, gains)
        assert (d.endpoint_id, d.reason, {s.id: s.note for s in d.scores}) == want
