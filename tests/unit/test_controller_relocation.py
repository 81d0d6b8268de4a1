"""Relocation (placement/relocation.py): a sleeper whose wakes keep waiting on slow swaps is
started anew on cards where its wakes are fast, then the old one stops."""

from __future__ import annotations

import dataclasses

import msgspec

from llmgw.controller.placement.relocation import SLOW_SWAPS
from llmgw.controller.tick.carryover import WakeSeen
from llmgw.wire.models import ModelSpec
from tests.unit.controller_reconcile_world import World
from tests.unit.test_controller_sleep import HOST_MIB, put, sleepy


def model(name: str, weights_gb: float) -> ModelSpec:
    return sleepy(name, weights_gb=weights_gb, sleep_after_s=2.0)


def fleet() -> World:
    """Three cards: `mid` asleep under `big` (awake, its idleness unknown: never cleared
    or evicted); `small` asleep alone on card 1; `slow` (as large as big) alone on card 2."""
    w = World()
    w.node("a", 3)
    w.set_node("a", host_memory_mib=HOST_MIB)
    w.model(model("big", 60.0), desired=1)
    w.model(model("mid", 30.0), desired=0)
    w.model(model("small", 16.0), desired=0)
    w.model(model("slow", 60.0), desired=0)
    put(w, "b1", "big", 0, "ready")
    put(w, "m1", "mid", 0, "sleeping")
    put(w, "s1", "small", 1, "sleeping")
    put(w, "x1", "slow", 2, "sleeping")
    return w


def slow_twice(w: World, rid: str = "m1") -> None:
    w.memory.plain_wake_s = 3.0
    w.memory.slow_swaps[rid] = (w.now - 600.0, w.now - 60.0)


def woke(w: World, rid: str, took_s: float, *, swap: bool) -> None:
    """`rid` was told to wake `took_s` ago and is ready now."""
    r = w.state.replicas[rid]
    w.memory.waking[rid] = WakeSeen(model=r.model, at=w.now - took_s, swap=swap)
    r = dataclasses.replace(r, state="ready", state_since=w.now, sleep_level=None)
    w.index.put(w.state.replicas[rid], r)
    w.state.replicas[rid] = r


def relocation(w: World) -> str:
    (new,) = [r for r in w.replicas("mid") if r.id != "m1"]
    return new.id


class TestLearning:
    """Wakes are timed: plain ones set the bound, swaps over it count as slow."""

    def test_a_plain_wake_sets_the_bound(self) -> None:
        """A wake onto free cards that took 4 s: the bound is 4 s."""
        w = fleet()
        woke(w, "s1", 4.0, swap=False)
        w.tick()
        assert w.memory.plain_wake_s == 4.0
        assert w.memory.waking == {}

    def test_a_swap_over_the_bound_is_slow(self) -> None:
        """Bound 3 s: a swap that took 10 s is remembered as slow for its model."""
        w = fleet()
        w.memory.plain_wake_s = 3.0
        woke(w, "s1", 10.0, swap=True)
        w.tick()
        assert w.memory.slow_swaps == {"s1": (w.now,)}

    def test_a_swap_within_the_bound_and_margin_is_not(self) -> None:
        """Bound 3 s: a swap that took 3.5 s is within the second of margin."""
        w = fleet()
        w.memory.plain_wake_s = 3.0
        woke(w, "s1", 3.5, swap=True)
        w.tick()
        assert w.memory.slow_swaps == {}

    def test_nothing_is_slow_before_a_plain_wake_was_seen(self) -> None:
        """No bound yet: no swap counts as slow, however long."""
        w = fleet()
        woke(w, "s1", 30.0, swap=True)
        w.tick()
        assert w.memory.slow_swaps == {}

    def test_a_wake_behind_a_swap_is_timed_to_its_ready(self) -> None:
        """mid wakes by putting idle big to sleep; ready 10 s later, it is slow."""
        w = fleet()
        w.memory.plain_wake_s = 3.0
        w.report(last_used={"b1": w.now - 500}, inflight={"b1": 0}, demand={"mid": 1})
        w.tick()
        assert w.state.replicas["m1"].state == "waking"
        assert w.memory.waking["m1"].swap
        w.clock.advance(10.0)
        w.heartbeat("a", {"b1": "sleeping", "m1": "ready", "s1": "sleeping", "x1": "sleeping"})
        w.tick()
        assert w.memory.slow_swaps == {"m1": (w.now,)}


class TestRelocation:
    """A model slow twice is started anew on fast-swapping cards; nothing else is disturbed."""

    def test_slow_twice_it_starts_anew_where_its_neighbours_swap_fast(self) -> None:
        """mid goes to card 1 (small asleep there), not card 2 (slow asleep there)."""
        w = fleet()
        slow_twice(w)
        w.tick()
        new = w.state.replicas[relocation(w)]
        assert (new.state, new.replaces, new.shards[0].gpus) == ("pending", "m1", (1,))
        assert any(e.startswith(f"replica.placed {new.id}: relocating m1") for e in w.events)
        assert w.state.replicas["m1"].state == "sleeping"
        assert w.memory.slow_swaps == {}

    def test_slow_fewer_times_than_asked_it_stays(self) -> None:
        """Fewer slow wakes than SLOW_SWAPS within the window: nothing starts."""
        w = fleet()
        slow_twice(w)
        w.memory.slow_swaps["m1"] = (w.now - 4000.0,) * SLOW_SWAPS
        w.tick()
        assert w.replicas("mid") == [w.state.replicas["m1"]]

    def test_not_onto_cards_whose_sleepers_swap_slowly(self) -> None:
        """Only card 2 is left, under slow: no relocation."""
        w = fleet()
        put(w, "s2", "small", 1, "ready")
        w.report(last_used={"s2": w.now}, inflight={"s2": 1})
        slow_twice(w)
        w.tick()
        assert w.replicas("mid") == [w.state.replicas["m1"]]
        assert w.memory.relocation_tried_at == w.now

    def test_not_while_its_model_has_a_replica_awake(self) -> None:
        """mid also serves elsewhere: its sleeper is not moved meanwhile."""
        w = fleet()
        w.model(msgspec.structs.replace(model("mid", 30.0), max_replicas=2), desired=1)
        put(w, "m2", "mid", 1, "ready")
        w.report(last_used={"m2": w.now}, inflight={"m2": 1})
        slow_twice(w)
        w.tick()
        assert {r.id for r in w.replicas("mid")} == {"m1", "m2"}

    def test_once_ready_it_sleeps_there_and_the_old_sleeper_stops(self) -> None:
        """The new replica ready with nothing in flight: it sleeps, m1 stops."""
        w = fleet()
        slow_twice(w)
        w.tick()
        new = relocation(w)
        w.ready_all("mid")
        w.tick()
        r = w.state.replicas[new]
        assert (r.state, r.replaces, r.sleep_level) == ("sleeping", None, 1)
        assert w.state.replicas["m1"].state == "stopped"
        assert w.state.models["mid"].desired_replicas == 0

    def test_the_starting_replica_is_not_counted(self) -> None:
        """Asked for while it starts: the old sleeper wakes, and the new one goes on
        starting as its make-before-break replacement."""
        w = fleet()
        slow_twice(w)
        w.tick()
        new = relocation(w)
        w.report(last_used={"b1": w.now - 500}, inflight={"b1": 0}, demand={"mid": 1})
        w.tick()
        assert w.state.replicas["m1"].state == "waking"
        assert w.state.replicas[new].state == "pending"
        w.heartbeat("a", {"b1": "sleeping", "m1": "ready", "s1": "sleeping", "x1": "sleeping"})
        w.tick()
        assert w.state.replicas["m1"].state == "ready"
        w.ready_all("mid")
        w.tick()
        assert w.state.replicas[new].state == "ready"
        assert w.state.replicas["m1"].state == "draining"

    def test_another_sleeper_of_its_model_does_not_stop_it(self) -> None:
        """mid has a second sleeper elsewhere: the slow one still moves."""
        w = fleet()
        w.node("b", 1)
        w.set_node("b", host_memory_mib=HOST_MIB)
        put(w, "m2", "mid", 0, "sleeping")
        r = w.state.replicas["m2"]
        shard = dataclasses.replace(r.shards[0], node="b")
        w.state.replicas["m2"] = dataclasses.replace(r, shards=(shard,))
        slow_twice(w)
        w.tick()
        assert w.state.replicas[relocation_new(w)].replaces == "m1"

    def test_a_wake_that_wants_its_cards_stops_it(self) -> None:
        """small asked for while mid starts on its card: mid's start stops, small wakes."""
        w = fleet()
        slow_twice(w)
        w.tick()
        new = relocation(w)
        w.report(demand={"small": 1})
        w.tick()
        assert w.state.replicas[new].state == "stopped"
        assert w.state.replicas["s1"].state == "waking"
        assert w.replicas("small", "pending") == []

    def test_at_most_once_per_model_an_hour(self) -> None:
        """Slow twice again right after a relocation: nothing more starts."""
        w = fleet()
        slow_twice(w)
        w.tick()
        w.ready_all("mid")
        w.tick()
        moved = relocation_id(w)
        w.heartbeat("a", {"b1": "ready", moved: "sleeping"})
        slow_twice(w, moved)
        w.clock.advance(120.0)
        w.tick()
        assert w.replicas("mid", "pending") == []

    def test_a_failed_start_leaves_the_sleeper_where_it_is(self) -> None:
        """The new replica fails: it is stopped, not restarted; m1 still sleeps."""
        w = fleet()
        slow_twice(w)
        w.tick()
        new = relocation(w)
        w.heartbeat("a", {"b1": "ready", new: "failed"})
        w.tick()
        assert w.state.replicas[new].state == "stopped"
        assert w.state.replicas["m1"].state == "sleeping"
        assert [r.id for r in w.replicas("mid") if r.state != "stopped"] == ["m1"]


def relocation_new(w: World) -> str:
    (r,) = w.replicas("mid", "pending")
    return r.id


def relocation_id(w: World) -> str:
    (r,) = [r for r in w.replicas("mid", "sleeping") if r.id != "m1"]
    return r.id
