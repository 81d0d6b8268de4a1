"""Idle eviction: who is drained so an unplaceable model fits."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.controller.fleet.records import FleetState
from llmgw.controller.idle import IdleTracker
from llmgw.controller.placement.eviction import EvictionPlan, idle_enough_in, plan_eviction
from llmgw.controller.placement.rules import Placement, free_map, place
from llmgw.testing import ManualClock
from llmgw.wire.models import ModelSpec
from llmgw.wire.usage import UsageReport
from tests.unit.controller_fleet import HB_TIMEOUT_S, NOW, fleet, node, replica, spec
from tests.unit.controller_reconcile_world import World


def plan(want: ModelSpec, state: FleetState, idle: Mapping[str, float]) -> EvictionPlan | None:
    free = free_map(state, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)
    return plan_eviction(want, state, idle.get, free, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)


def one_node_full(*victims: tuple[str, str], count: int = 2) -> list:  # type: ignore[type-arg]
    """Replicas (id, model) each holding one card of node a, in order."""
    return [replica(rid, m, [("a", (i,))]) for i, (rid, m) in enumerate(victims[:count])]


WANT = spec("want", gpus_per_node=2, priority=5)


class TestCandidates:
    """Which replicas may be evicted to make room for an unplaceable model."""

    def test_evicts_known_idle_replicas_to_make_room(self) -> None:
        """Two idle one-card replicas make room for a two-card model."""
        state = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=0, max_replicas=2)],
            replicas=one_node_full(("r1", "x"), ("r2", "x")),
        )
        p = plan(WANT, state, {"r1": 700.0, "r2": 900.0})
        assert p is not None
        assert (set(p.evict), p.placement.shards[0].gpus) == ({"r1", "r2"}, (0, 1))

    def test_unknown_idle_is_never_evicted(self) -> None:
        """A replica no router has reported is not a candidate, however long it has run."""
        state = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=0, max_replicas=2)],
            replicas=one_node_full(("r1", "x"), ("r2", "x")),
        )
        assert plan(WANT, state, {"r1": 9_999.0}) is None

    def test_a_restarted_router_nominates_nothing(self) -> None:
        """Through the IdleTracker: a new router with an empty map makes no replica evictable."""
        state = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=0, max_replicas=2)],
            replicas=one_node_full(("r1", "x"), ("r2", "x")),
        )
        tracker = IdleTracker(clock=ManualClock())
        tracker.ingest(UsageReport(router_id="fresh", sent_at=NOW))
        free = free_map(state, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)
        assert (
            plan_eviction(WANT, state, tracker, free, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)
            is None
        )

    def test_idle_is_measured_against_the_victims_own_timeout(self) -> None:
        """A replica idle 700 s is kept when its model's timeout is an hour."""
        state = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=0, max_replicas=2, idle_timeout_s=3_600)],
            replicas=one_node_full(("r1", "x"), ("r2", "x")),
        )
        assert plan(WANT, state, {"r1": 700.0, "r2": 700.0}) is None

    def test_never_below_min_replicas(self) -> None:
        """A model with two ready replicas and min 2 loses none of them."""
        state = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=2, max_replicas=2)],
            replicas=one_node_full(("r1", "x"), ("r2", "x")),
        )
        assert plan(WANT, state, {"r1": 9_999.0, "r2": 9_999.0}) is None

    def test_higher_priority_is_never_evicted_but_equal_may_be(self) -> None:
        """A priority-6 replica stays; a priority-5 one may go for a priority-5 model."""
        high = spec("high", min_replicas=0, priority=6)
        equal = spec("equal", min_replicas=0, priority=5)
        for victim, expected in ((high, None), (equal, ("r1",))):
            state = fleet(
                [node("a", 2)],
                models=[WANT, victim],
                replicas=[replica("r1", victim.name, [("a", (0, 1))])],
            )
            p = plan(WANT, state, {"r1": 9_999.0})
            assert (p.evict if p else None) == expected

    def test_only_ready_replicas_are_candidates(self) -> None:
        """Starting and draining replicas are not evicted."""
        state = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=0, max_replicas=2)],
            replicas=[
                replica("r1", "x", [("a", (0,))], state="starting"),
                replica("r2", "x", [("a", (1,))], state="draining"),
            ],
        )
        assert plan(WANT, state, {"r1": 9_999.0, "r2": 9_999.0}) is None

    def test_the_requesting_models_own_replicas_are_not_evicted(self) -> None:
        """Evicting your own replica to place yourself gains nothing."""
        state = fleet(
            [node("a", 2)],
            models=[spec("want", gpus_per_node=2, min_replicas=0, max_replicas=3)],
            replicas=one_node_full(("r1", "want"), ("r2", "want")),
        )
        assert plan(spec("want", gpus_per_node=2), state, {"r1": 9_999.0, "r2": 9_999.0}) is None

    def test_cards_on_a_cordoned_node_free_nothing(self) -> None:
        """An idle replica on a node that is not ready is not worth evicting."""
        state = fleet(
            [node("a", 2, operator_state="cordoned")],
            models=[WANT, spec("x", min_replicas=0, max_replicas=2)],
            replicas=[replica("r1", "x", [("a", (0, 1))])],
        )
        assert plan(WANT, state, {"r1": 9_999.0}) is None


class TestChoice:
    """Which set of candidates is chosen, and how the choice is explained."""

    def test_lower_priority_first_then_longest_idle(self) -> None:
        """Of three idle whole-node replicas, the low-priority one goes, then the longest idle."""
        state = fleet(
            [node("a", 2), node("b", 2), node("c", 2)],
            models=[
                WANT,
                spec("lo", min_replicas=0, priority=1),
                spec("mid", min_replicas=0, max_replicas=2, priority=3),
            ],
            replicas=[
                replica("r-lo", "lo", [("c", (0, 1))]),
                replica("r-mid-old", "mid", [("a", (0, 1))]),
                replica("r-mid-new", "mid", [("b", (0, 1))]),
            ],
        )
        idle = {"r-lo": 700.0, "r-mid-old": 9_000.0, "r-mid-new": 800.0}
        p = plan(WANT, state, idle)
        assert p is not None
        assert p.evict == ("r-lo",)
        # r-lo now draining: it still holds node c, and is no longer a candidate.
        state.replicas["r-lo"] = dataclasses.replace(state.replicas["r-lo"], state="draining")
        p = plan(WANT, state, idle)
        assert p is not None
        assert p.evict == ("r-mid-old",)

    def test_members_that_do_not_make_room_are_dropped(self) -> None:
        """Greedy frees a low-priority card that does not help; the plan keeps only what does."""
        state = fleet(
            [node("a", 2), node("b", 2)],
            models=[
                WANT,
                spec("lo", min_replicas=0, priority=0),
                spec("x", min_replicas=0, max_replicas=3, priority=1),
            ],
            replicas=[
                replica("r-lo", "lo", [("a", (0,))]),
                replica("r-busy", "x", [("a", (1,))]),
                replica("r-big", "x", [("b", (0, 1))]),
            ],
        )
        p = plan(WANT, state, {"r-lo": 9_000.0, "r-big": 700.0})
        assert p is not None
        assert (p.evict, p.placement.shards[0].node) == (("r-big",), "b")

    def test_multi_node_keeps_every_victim_on_a_needed_whole_node(self) -> None:
        """A 4-card shard needs its 8-card node entirely free, so victims on cards 4-7 stay in."""
        state = fleet(
            [node("a"), node("b")],
            models=[
                spec("want", gpus_per_node=4, nodes=2),
                spec("x", min_replicas=0, max_replicas=4),
            ],
            replicas=[
                replica("r-a", "x", [("a", (4, 5, 6, 7))]),
                replica("r-b", "x", [("b", (6,))]),
            ],
        )
        p = plan(spec("want", gpus_per_node=4, nodes=2), state, {"r-a": 700.0, "r-b": 700.0})
        assert p is not None
        assert set(p.evict) == {"r-a", "r-b"}

    def test_none_when_no_set_makes_room(self) -> None:
        """Idle replicas that cannot free enough on one node give no plan at all."""
        state = fleet(
            [node("a", 2), node("b", 2)],
            models=[spec("want", gpus_per_node=4), spec("x", min_replicas=0, max_replicas=2)],
            replicas=[replica("r1", "x", [("a", (0,))]), replica("r2", "x", [("b", (0,))])],
        )
        assert plan(spec("want", gpus_per_node=4), state, {"r1": 9e3, "r2": 9e3}) is None

    def test_a_model_that_fits_evicts_nothing(self) -> None:
        """When the model already fits, the plan is its placement and an empty eviction list."""
        state = fleet([node("a", 2)], models=[WANT], replicas=[])
        p = plan(WANT, state, {})
        assert p is not None
        assert (p.evict, p.placement.shards[0].node) == ((), "a")

    def test_why_names_each_replica_with_its_idle_time(self) -> None:
        """The event text lists every evicted replica, its model, priority and idle seconds."""
        state = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=0, max_replicas=2, priority=2)],
            replicas=one_node_full(("r1", "x"), ("r2", "x")),
        )
        p = plan(WANT, state, {"r1": 700.4, "r2": 3_600.0})
        assert p is not None
        assert p.why == (
            "to place want (priority 5): evicting r2 (x, priority 2, idle 3600 s), "
            "r1 (x, priority 2, idle 700 s)"
        )

    def test_exclude_skips_replicas_already_being_evicted(self) -> None:
        """A replica already chosen this tick is not counted again."""
        state = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=0)],
            replicas=[replica("r1", "x", [("a", (0, 1))])],
        )
        free = free_map(state, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)
        got = plan_eviction(
            WANT,
            state,
            {"r1": 9e3}.get,
            free,
            now=NOW,
            heartbeat_timeout_s=HB_TIMEOUT_S,
            exclude={"r1"},
        )
        assert got is None

    def test_replicas_already_leaving_use_up_the_models_spare(self) -> None:
        """One of x's two ready replicas already leaving this tick: min 1 keeps the other."""
        state = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=1, max_replicas=2)],
            replicas=one_node_full(("r1", "x"), ("r2", "x")),
        )
        free = free_map(state, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)
        got = plan_eviction(
            spec("want1", gpus_per_node=1, priority=5),
            state,
            {"r1": 9e3, "r2": 9e3}.get,
            free,
            now=NOW,
            heartbeat_timeout_s=HB_TIMEOUT_S,
            exclude={"r1"},
        )
        assert got is None


class TestEvictionProperties:
    """Any eviction plan is valid, and none is given only when no set works."""

    @settings(max_examples=200, deadline=None)
    @given(
        sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
        holders=st.lists(
            st.tuples(st.integers(0, 3), st.integers(1, 2), st.integers(0, 3), st.booleans()),
            max_size=6,
        ),
        need=st.integers(1, 4),
        width=st.integers(1, 2),
    )
    def test_a_plan_is_valid_and_none_means_no_set_works(
        self,
        sizes: list[int],
        holders: list[tuple[int, int, int, bool]],
        need: int,
        width: int,
    ) -> None:
        """Victims are eligible and free the plan's cards; None means all eligible fail."""
        nodes = [node(f"n{i}", s, fabrics=("f",)) for i, s in enumerate(sizes)]
        replicas, idle, used = [], {}, {n.name: set() for n in nodes}
        for j, (ni, cards, prio, known) in enumerate(holders):
            n = nodes[ni % len(nodes)]
            gpus = tuple(g for g in range(len(n.gpus)) if g not in used[n.name])[:cards]
            if not gpus:
                continue
            used[n.name].update(gpus)
            replicas.append(replica(f"r{j}", f"m{prio}", [(n.name, gpus)]))
            if known:
                idle[f"r{j}"] = 1_000.0 + j
        victims = [spec(f"m{p}", min_replicas=0, max_replicas=10, priority=p) for p in range(4)]
        want = spec("want", gpus_per_node=need, nodes=width, priority=2)
        state = fleet(nodes, models=[want, *victims], replicas=replicas)
        free = free_map(state, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)
        p = plan_eviction(want, state, idle.get, free, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)
        eligible = [
            r for r in replicas if r.id in idle and state.models[r.model].spec.priority <= 2
        ]
        if p is None:
            sim = free.copy()
            for r in eligible:
                for sh in r.shards:
                    sim.release(sh.node, sh.gpus)
            assert not isinstance(place(want, state.nodes, sim), Placement)
            return
        assert set(p.evict) <= {r.id for r in eligible}
        sim = free.copy()
        for rid in p.evict:
            for sh in state.replicas[rid].shards:
                sim.release(sh.node, sh.gpus)
        sim.take(p.placement)  # raises if any card is still held


class TestIdleEnoughIn:
    """When waiting would let an eviction make room (the outlook's cannot_place time)."""

    def eta(self, state: FleetState, idle: Mapping[str, float]) -> float | None:
        free = free_map(state, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)
        return idle_enough_in(
            WANT, state, idle.get, free, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S
        )

    def test_the_earliest_moment_enough_replicas_are_idle(self) -> None:
        """Two cards needed: the moment the second of the two is idle enough, not the first."""
        state = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=0, max_replicas=2)],
            replicas=one_node_full(("r1", "x"), ("r2", "x")),
        )
        assert self.eta(state, {"r1": 500.0, "r2": 300.0}) == 300.0

    def test_unknown_idleness_never_becomes_a_candidate(self) -> None:
        """r2 unknown: r1 alone never makes room, however long one waits."""
        state = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=0, max_replicas=2)],
            replicas=one_node_full(("r1", "x"), ("r2", "x")),
        )
        assert self.eta(state, {"r1": 500.0}) is None

    def test_min_replicas_and_priority_still_hold(self) -> None:
        """Waiting does not lift the rules: a model at its min, or a higher priority, stays."""
        at_min = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=2, max_replicas=2)],
            replicas=one_node_full(("r1", "x"), ("r2", "x")),
        )
        assert self.eta(at_min, {"r1": 500.0, "r2": 500.0}) is None
        higher = fleet(
            [node("a", 2)],
            models=[WANT, spec("x", min_replicas=0, max_replicas=2, priority=9)],
            replicas=one_node_full(("r1", "x"), ("r2", "x")),
        )
        assert self.eta(higher, {"r1": 500.0, "r2": 500.0}) is None


class TestBusyReplicas:
    """A replica with requests in flight is not idle, however long ago its last dispatch."""

    def world(self) -> tuple[World, str]:
        """Node a is full with x, last sent a request 700 s ago (timeout 600); big is asked for."""
        w = World()
        w.node("a")
        w.model(spec("x", gpus_per_node=8, min_replicas=0), desired=1)
        w.tick()
        w.ready_all()
        w.model(spec("big", gpus_per_node=8, min_replicas=0))
        return w, w.only("x").id

    def test_a_replica_still_serving_is_not_evicted(self) -> None:
        """x's long request is still streaming: draining x would cut it off after the grace."""
        w, x = self.world()
        w.report(last_used={x: w.now - 700}, inflight={x: 1}, demand={"big": 1})
        w.tick()
        assert w.state.replicas[x].state == "ready"
        assert not any(e.startswith("replica.evicted") for e in w.events)

    def test_it_is_evicted_once_its_requests_are_done(self) -> None:
        """The same replica with nothing in flight is taken."""
        w, x = self.world()
        w.report(last_used={x: w.now - 700}, inflight={x: 0}, demand={"big": 1})
        w.tick()
        assert w.state.replicas[x].state == "draining"
