"""Clearing ahead (placement/clearing.py): idle replicas sleep before the sleeper under them
is asked for, so its wake needs no swap."""

from __future__ import annotations

import dataclasses

from llmgw.wire.models import ModelSpec
from tests.unit.controller_reconcile_world import World
from tests.unit.test_controller_sleep import HOST_MIB, put, sleepy


def model(name: str, weights_gb: float, **kw: object) -> ModelSpec:
    return sleepy(name, weights_gb=weights_gb, sleep_after_s=2.0, **kw)


def big_under_small(**small: object) -> World:
    """One card: `big` (a slow wake) asleep under `small`, awake and unused for 5 s."""
    w = World()
    w.node("a", 1)
    w.set_node("a", host_memory_mib=HOST_MIB)
    w.model(model("big", 60.0), desired=0)
    w.model(model("small", 16.0, **small), desired=1)
    put(w, "b1", "big", 0, "sleeping")
    put(w, "s1", "small", 0, "ready")
    return w


def idle_for(w: World, seconds: float, rid: str = "s1", inflight: int = 0) -> None:
    w.report(last_used={rid: w.now - seconds}, inflight={rid: inflight} if inflight else {})


class TestClearingAhead:
    """An idle replica sleeps ahead for the slower-waking sleeper under it; else it stays."""

    def test_idle_past_sleep_after_it_sleeps_for_the_sleeper_under_it(self) -> None:
        """small, idle 5 s past its 2 s, sleeps; big stays asleep; small wants one fewer."""
        w = big_under_small()
        idle_for(w, 5.0)
        w.tick()
        s1 = w.state.replicas["s1"]
        assert (s1.state, s1.sleep_level) == ("sleeping", 1)
        assert "cleared ahead for big" in (s1.reason or "")
        assert w.state.replicas["b1"].state == "sleeping"
        assert w.state.models["small"].desired_replicas == 0

    def test_then_the_sleeper_wakes_without_a_swap(self) -> None:
        """Once small is asleep, big asked for wakes with nothing to make way."""
        w = big_under_small()
        idle_for(w, 5.0)
        w.tick()
        w.heartbeat("a", {"s1": "sleeping", "b1": "sleeping"})
        w.report(demand={"big": 1})
        w.tick()
        assert w.state.replicas["b1"].state == "waking"
        assert w.state.replicas["s1"].state == "sleeping"
        assert not any("make way" in e for e in w.events)

    def test_asked_for_again_it_wakes_in_place(self) -> None:
        """small cleared, then asked for: its own replica wakes, nothing starts cold."""
        w = big_under_small()
        idle_for(w, 5.0)
        w.tick()
        w.heartbeat("a", {"s1": "sleeping", "b1": "sleeping"})
        w.report(demand={"small": 1})
        w.tick()
        assert w.state.replicas["s1"].state == "waking"
        assert w.replicas("small", "pending") == []

    def test_not_idle_long_enough(self) -> None:
        """Used 1 s ago, under its 2 s sleep_after_s: it stays awake."""
        w = big_under_small()
        idle_for(w, 1.0)
        w.tick()
        assert w.state.replicas["s1"].state == "ready"

    def test_requests_in_flight(self) -> None:
        """A request still in flight keeps it awake however long ago it started."""
        w = big_under_small()
        idle_for(w, 5.0, inflight=1)
        w.tick()
        assert w.state.replicas["s1"].state == "ready"

    def test_unknown_idleness(self) -> None:
        """No router has reported it: unknown is never idle."""
        w = big_under_small()
        w.tick()
        assert w.state.replicas["s1"].state == "ready"

    def test_never_below_min_replicas(self) -> None:
        """small's only replica is its minimum: it stays awake."""
        w = big_under_small(min_replicas=1)
        idle_for(w, 5.0)
        w.tick()
        assert w.state.replicas["s1"].state == "ready"

    def test_never_for_a_sleeper_of_lower_priority(self) -> None:
        """small outranks big: it is not put to sleep for big."""
        w = big_under_small(priority=5)
        idle_for(w, 5.0)
        w.tick()
        assert w.state.replicas["s1"].state == "ready"

    def test_nothing_asleep_under_it(self) -> None:
        """No sleeper waits on its cards: an idle replica stays awake."""
        w = big_under_small()
        del w.state.replicas["b1"]
        w.index.put(w.state.replicas.get("b1"), None)
        idle_for(w, 5.0)
        w.tick()
        assert w.state.replicas["s1"].state == "ready"

    def test_not_for_a_sleeper_that_wakes_faster(self) -> None:
        """big awake over small asleep: big would wait longer for its own wake than small
        for big's sleep, so big stays awake."""
        w = World()
        w.node("a", 1)
        w.set_node("a", host_memory_mib=HOST_MIB)
        w.model(model("big", 60.0), desired=1)
        w.model(model("small", 16.0), desired=0)
        put(w, "s1", "small", 0, "sleeping")
        put(w, "b1", "big", 0, "ready")
        idle_for(w, 5.0, rid="b1")
        w.tick()
        assert w.state.replicas["b1"].state == "ready"

    def test_not_while_another_shares_the_sleepers_cards_in_use(self) -> None:
        """big spans two cards, one held by a replica in use: clearing the other would not
        spare big's wake a swap, so neither sleeps."""
        w = World()
        w.node("a", 2)
        w.set_node("a", host_memory_mib=HOST_MIB)
        w.model(model("big", 60.0, gpus_per_node=2), desired=0)
        w.model(model("small", 16.0), desired=1)
        w.model(model("busy", 16.0), desired=1)
        put(w, "s1", "small", 0, "ready")
        put(w, "u1", "busy", 1, "ready")
        b1 = w.state.replicas["s1"]
        shard = dataclasses.replace(b1.shards[0], gpus=(0, 1), state="sleeping")
        big = dataclasses.replace(b1, id="b1", model="big", state="sleeping", shards=(shard,))
        big = dataclasses.replace(big, sleep_level=1)
        w.state.replicas["b1"] = big
        w.index.put(None, big)
        w.report(last_used={"s1": w.now - 5.0, "u1": w.now}, inflight={"u1": 1})
        w.tick()
        assert w.state.replicas["s1"].state == "ready"
