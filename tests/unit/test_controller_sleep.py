"""Sleeping instead of stopping: swaps in the reconcile tick and the memory rules (wakes.py)."""

from __future__ import annotations

import dataclasses

import msgspec

from llmgw.controller.fleet.endpoints import outlook
from llmgw.controller.fleet.records import Replica, Shard
from llmgw.controller.placement.wakes import sleep_room, sleepers_per_card
from llmgw.wire.models import ModelSpec
from llmgw.wire.usage import ModelLoad
from tests.unit.controller_reconcile_world import World, spec

HOST_MIB = 2_000_000
IDLE = ModelLoad(inflight=0, held=0, requests=0, interval_s=1.0)


def sleepy(name: str, **kw: object) -> ModelSpec:
    base = spec(name, min_replicas=0, max_replicas=1, idle_timeout_s=60)
    fields: dict[str, object] = {"sleep_mode": True, "weights_gb": 16.0, **kw}
    return msgspec.structs.replace(base, **fields)


def one_card(*models: ModelSpec) -> World:
    w = World()
    w.node("a", 1)
    w.set_node("a", host_memory_mib=HOST_MIB)
    for m in models:
        w.model(m, desired=0)
    return w


def idle(w: World, *rids: str, demand: dict[str, int] | None = None) -> None:
    """Let time pass: `rids` idle past their 60 s timeout since they became ready."""
    w.clock.advance(121)
    w.touch("a")
    w.report(
        last_used=dict.fromkeys(rids, w.now - 121), inflight=dict.fromkeys(rids, 0), demand=demand
    )


def serve(w: World, name: str) -> str:
    """Give `name` demand until its replica is ready; its id."""
    w.report(demand={name: 1})
    w.tick()
    w.ready_all(name)
    w.report()
    return w.only(name, "ready").id


def b_took_the_card(w: World) -> tuple[str, str]:
    """`a` served, then idle while `b` is wanted: `a` asleep, `b` ready on its card."""
    a = serve(w, "a")
    idle(w, a, demand={"b": 1})
    w.tick()
    w.heartbeat("a", {a: "sleeping"})
    w.tick()
    w.ready_all("b")
    return a, w.only("b", "ready").id


class TestSwap:
    """The reconcile tick sleeps and wakes replicas instead of stopping and starting them."""

    def test_an_idle_replica_sleeps_instead_of_draining(self) -> None:
        """Evicted for another model, a sleep-mode replica sleeps (level 1: its weights fit)."""
        w = one_card(sleepy("a"), sleepy("b"))
        a = serve(w, "a")
        idle(w, a, demand={"b": 1})
        w.tick()
        r = w.state.replicas[a]
        assert (r.state, r.sleep_level) == ("sleeping", 1)
        assert "evicted for b" in (r.reason or "")
        assert w.replicas("b") == []  # the card is not free until the engine is asleep
        w.heartbeat("a", {a: "sleeping"})
        w.tick()
        assert w.only("b").state == "pending"

    def test_a_sleeping_replica_is_woken_not_started(self) -> None:
        """Demand for a model whose replica sleeps on a free card wakes it: no new replica."""
        w = one_card(sleepy("a"), sleepy("b"))
        a, b = b_took_the_card(w)
        # Now b idles and a is wanted again: b sleeps, a wakes on the same card.
        idle(w, b, demand={"a": 1})
        w.tick()
        # One tick: b sleeps and a wakes (its agent wakes it once b is asleep).
        assert w.state.replicas[b].state == "sleeping"
        assert w.state.replicas[a].state == "waking"
        assert len(w.replicas("a")) == 1
        assert any("waking" in e for e in w.events)
        look = outlook(w.state, w.index, unplaceable={}, evicting=w.memory.evicting)
        assert [(o.models, o.state, o.retry_after_s) for o in look] == [(("a",), "waking", 1.0)]
        w.heartbeat("a", {a: "ready", b: "sleeping"})
        assert w.state.replicas[a].state == "ready"
        assert len(w.replicas("a")) == 1

    def test_woken_but_not_warmed_up_says_so(self) -> None:
        """Awake and warming up (its shard starting) it stays waking; served without its
        warm-up, it is ready with the agent's reason in its own."""
        w = one_card(sleepy("a"), sleepy("b"))
        a, b = b_took_the_card(w)
        idle(w, b, demand={"a": 1})
        w.tick()
        w.heartbeat("a", {a: "starting", b: "sleeping"})
        assert w.state.replicas[a].state == "waking"
        note = "warm-up failed 3 times, last: HTTP 500: boom"
        w.heartbeat("a", {a: "ready", b: "sleeping"}, notes={a: note})
        r = w.state.replicas[a]
        assert (r.state, r.reason) == ("ready", f"awake, not warmed up: {note}")

    def test_a_replica_just_woken_is_not_swapped_out_at_once(self) -> None:
        """Its last use from before it slept does not make a woken replica idle."""
        w = one_card(sleepy("a"), sleepy("b"))
        a, b = b_took_the_card(w)
        idle(w, b, demand={"a": 1})
        w.tick()
        w.heartbeat("a", {a: "ready", b: "sleeping"})
        # b is wanted again at once: a has been ready for no time, b waits.
        w.report(last_used={a: w.now - 500}, inflight={a: 0}, demand={"b": 1})
        w.tick()
        assert (w.state.replicas[a].state, w.state.replicas[b].state) == ("ready", "sleeping")

    def test_busy_replica_is_not_swapped_out(self) -> None:
        """Eviction's rules stand: a replica used recently stays awake and the sleeper waits."""
        w = one_card(sleepy("a"), sleepy("b"))
        a, b = b_took_the_card(w)
        w.report(last_used={b: w.now - 5}, inflight={b: 1}, demand={"a": 1})
        w.tick()
        assert (w.state.replicas[a].state, w.state.replicas[b].state) == ("sleeping", "ready")

    def test_without_sleep_mode_the_replica_drains(self) -> None:
        """A spec without sleep_mode is evicted as before."""
        w = one_card(spec("a", min_replicas=0, max_replicas=1, idle_timeout_s=60), sleepy("b"))
        a = serve(w, "a")
        idle(w, a, demand={"b": 1})
        w.tick()
        assert w.state.replicas[a].state == "draining"

    def test_surplus_sleeps_too(self) -> None:
        """A replica scaled away for lack of load sleeps rather than stopping."""
        w = one_card(sleepy("a"))
        a = serve(w, "a")
        w.clock.advance(200)
        w.report(last_used={a: w.now - 500}, inflight={a: 0}, load={"a": IDLE})
        w.touch("a")
        w.tick()
        assert w.state.replicas[a].state == "sleeping"

    def test_a_sleeper_stops_when_its_spec_changes(self) -> None:
        """Waking an engine started for an older spec would serve the old spec: it stops."""
        w = one_card(sleepy("a"))
        a = serve(w, "a")
        w.clock.advance(200)
        w.report(last_used={a: w.now - 500}, inflight={a: 0}, load={"a": IDLE})
        w.touch("a")
        w.tick()
        w.clock.advance(1)
        m = w.state.models["a"]
        w.state.models["a"] = dataclasses.replace(m, updated_at=w.now)
        w.tick()
        assert w.state.replicas[a].state == "stopped"


def replica(
    rid: str, model: str, gpu: int, *, state: str = "sleeping", level: int = 1, since: float = 0.0
) -> Replica:
    return Replica(
        id=rid,
        model=model,
        state=state,  # type: ignore[arg-type]
        shards=(Shard(node="a", rank=0, gpus=(gpu,), state="sleeping"),),
        created_at=0.0,
        state_since=since,
        updated_at=0.0,
        sleep_level=level if state == "sleeping" else None,
    )


class TestSleepRoom:
    """How many sleepers a card and a host can keep, and which one stops first."""

    def _world(self, host_mib: int | None = HOST_MIB) -> World:
        w = World()
        w.node("a", 1)
        w.set_node("a", host_memory_mib=host_mib)
        return w

    def test_an_h100_keeps_five_sleepers(self) -> None:
        """80 GiB: 10 % beside an awake engine holds five engines asleep at 1.4 GiB."""
        assert sleepers_per_card(81_559) == 5

    def test_the_least_valuable_sleeper_stops_for_a_new_one(self) -> None:
        """A sixth sleeper on a card stops the one asleep the longest."""
        w = self._world()
        specs = {f"s{i}": sleepy(f"s{i}") for i in range(6)}
        sleepers = {f"z{i}": replica(f"z{i}", f"s{i}", 0, since=float(i)) for i in range(5)}
        new = replica("n", "s5", 0, state="ready")
        room = sleep_room(new, specs["s5"], sleepers, w.state.nodes, specs)
        assert room is not None
        assert room.stop == ("z0",)

    def test_level_two_when_the_weights_do_not_fit_the_host(self) -> None:
        """Without host memory for the weights the level falls to 2; unknown weights too."""
        w = self._world(host_mib=1000)
        s = sleepy("m")
        r = replica("r", "m", 0, state="ready")
        assert sleep_room(r, s, {}, w.state.nodes, {"m": s}) is not None
        assert sleep_room(r, s, {}, w.state.nodes, {"m": s}).level == 2  # type: ignore[union-attr]
        unknown = msgspec.structs.replace(s, weights_gb=None)
        w2 = self._world()
        got = sleep_room(r, unknown, {}, w2.state.nodes, {"m": unknown})
        assert got is not None
        assert got.level == 2

    def test_level_one_demanded_stops_level_one_sleepers_for_host_memory(self) -> None:
        """sleep_level 1 with a full host stops older level-1 sleepers rather than refusing."""
        w = self._world(host_mib=30_000)  # 80 % of it holds one 16 GB model's weights
        specs = {"old": sleepy("old"), "m": sleepy("m", sleep_level=1)}
        sleepers = {"z": replica("z", "old", 0)}
        r = replica("r", "m", 0, state="ready")
        room = sleep_room(r, specs["m"], sleepers, w.state.nodes, specs)
        assert room is not None
        assert (room.level, room.stop) == (1, ("z",))

    def test_no_sleep_mode_no_room(self) -> None:
        """A spec without sleep_mode never sleeps."""
        w = self._world()
        s = spec("m")
        assert sleep_room(replica("r", "m", 0, state="ready"), s, {}, w.state.nodes, {}) is None


def put(w: World, rid: str, model: str, gpu: int, state: str) -> None:
    shard_state = "ready" if state in ("ready", "waking") else state
    r = Replica(
        id=rid,
        model=model,
        state=state,  # type: ignore[arg-type]
        shards=(Shard(node="a", rank=0, gpus=(gpu,), state=shard_state, port=9000 + gpu),),  # type: ignore[arg-type]
        created_at=w.now,
        state_since=w.now - (500 if state in ("ready", "sleeping") else 0),
        updated_at=w.now,
        sleep_level=1 if state == "sleeping" else None,
    )
    w.state.replicas[rid] = r
    w.index.put(None, r)


def two_cards() -> World:
    w = World()
    w.node("a", 2)
    w.set_node("a", host_memory_mib=HOST_MIB)
    for name, desired in (("x", 0), ("h", 1), ("y", 1)):
        w.model(sleepy(name, sleep_after_s=2.0), desired=desired)
    return w


class TestMoves:
    """A replica in use moves to its own sleeper, one wake per card per tick."""

    def test_a_replica_in_use_moves_to_its_own_sleeper(self) -> None:
        """x sleeps under h, which is busy; h's own sleeper wakes on the free card, h sleeps."""
        w = two_cards()
        put(w, "x1", "x", 0, "sleeping")
        put(w, "h1", "h", 0, "ready")
        put(w, "h2", "h", 1, "sleeping")
        w.report(last_used={"h1": w.now}, inflight={"h1": 1}, demand={"x": 1})
        w.tick()
        states = {rid: w.state.replicas[rid].state for rid in ("x1", "h1", "h2")}
        assert states == {"x1": "waking", "h1": "sleeping", "h2": "waking"}
        assert any(e.startswith("replica.moved h1: moved for x") for e in w.events)
        assert w.replicas("x", "pending") == []

    def test_no_move_without_a_sleeper_elsewhere(self) -> None:
        """A busy replica with nowhere to go stays; x is started cold on the free card."""
        w = two_cards()
        put(w, "x1", "x", 0, "sleeping")
        put(w, "h1", "h", 0, "ready")
        w.report(last_used={"h1": w.now}, inflight={"h1": 1}, demand={"x": 1})
        w.tick()
        assert w.state.replicas["h1"].state == "ready"
        assert w.only("x", "pending").shards[0].gpus == (1,)

    def test_one_card_is_woken_for_one_model_per_tick(self) -> None:
        """Two models' sleepers on one card, both wanted: one wakes, the other holds."""
        w = two_cards()
        w.model(sleepy("z", sleep_after_s=2.0), desired=0)
        put(w, "x1", "x", 0, "sleeping")
        put(w, "z1", "z", 0, "sleeping")
        put(w, "h1", "h", 0, "ready")
        put(w, "busy", "y", 1, "ready")
        w.report(
            last_used={"h1": w.now - 500, "busy": w.now},
            inflight={"h1": 0, "busy": 1},
            demand={"x": 1, "z": 1},
        )
        w.tick()
        states = sorted(w.state.replicas[r].state for r in ("x1", "z1"))
        assert states == ["sleeping", "waking"]
        assert w.replicas("x", "pending") == w.replicas("z", "pending") == []

    def test_a_card_waking_for_another_model_is_waited_for(self) -> None:
        """x's card is being woken for y: x waits a tick rather than starting cold."""
        w = two_cards()
        put(w, "x1", "x", 0, "sleeping")
        put(w, "y1", "y", 0, "waking")
        w.report(demand={"x": 1})
        w.tick()
        assert w.state.replicas["x1"].state == "sleeping"
        assert w.replicas("x", "pending") == []


def two_card_node(*models: ModelSpec) -> World:
    w = World()
    w.node("a", 2)
    w.set_node("a", host_memory_mib=HOST_MIB)
    for m in models:
        w.model(m, desired=0)
    return w


def put_to_sleep(w: World, name: str) -> str:
    """`name` served, then scaled away for lack of load: told to sleep, not asleep yet."""
    rid = serve(w, name)
    w.clock.advance(200)
    w.report(last_used={rid: w.now - 500}, inflight={rid: 0}, load={name: IDLE})
    w.touch("a")
    w.tick()
    r = w.state.replicas[rid]
    assert (r.state, [s.state for s in r.shards]) == ("sleeping", ["ready"])
    return rid


class TestFallingAsleep:
    """A replica wanted again while it falls asleep wakes in place, never cold."""

    def test_wanted_while_falling_asleep_it_waits_then_wakes_in_place(self) -> None:
        """No cold start on the free card: the model waits, then the same replica wakes."""
        w = two_card_node(sleepy("a"))
        a = put_to_sleep(w, "a")
        w.report(demand={"a": 1})
        for _ in range(3):
            w.tick()
            assert w.replicas("a") == [w.state.replicas[a]]
            assert w.state.replicas[a].state == "sleeping"
        look = outlook(w.state, w.index, unplaceable={}, evicting=w.memory.evicting)
        assert [(o.models, o.state) for o in look] == [(("a",), "waking")]
        assert "falling asleep" in look[0].reason
        w.heartbeat("a", {a: "sleeping"})
        w.tick()
        assert w.replicas("a") == [w.state.replicas[a]]
        assert w.state.replicas[a].state == "waking"
        w.heartbeat("a", {a: "ready"})
        assert w.state.replicas[a].state == "ready"

    def test_its_shard_is_listed_asleep_until_it_is(self) -> None:
        """While it falls asleep its agent is still told to sleep it, not to wake it."""
        w = two_card_node(sleepy("a"))
        a = put_to_sleep(w, "a")
        w.report(demand={"a": 1})
        w.tick()
        listed = w.heartbeat("a", {a: "ready"})
        assert [(s.replica_id, s.sleep_level) for s in listed] == [(a, 1)]

    def test_not_wanted_it_is_left_asleep(self) -> None:
        """Without demand nothing wakes it, and no outlook is given for its model."""
        w = two_card_node(sleepy("a"))
        a = put_to_sleep(w, "a")
        w.tick()
        assert outlook(w.state, w.index, unplaceable={}, evicting=w.memory.evicting) == ()
        w.heartbeat("a", {a: "sleeping"})
        w.tick()
        assert w.state.replicas[a].state == "sleeping"

    def test_a_sleeper_swapped_onto_its_cards_makes_it_hold(self) -> None:
        """Swapped out for b, wanted again at once: it holds, b is not undone, nothing cold."""
        w = one_card(sleepy("a"), sleepy("b"))
        a, b = b_took_the_card(w)
        idle(w, b, demand={"a": 1})
        w.tick()
        assert (w.state.replicas[a].state, w.state.replicas[b].state) == ("waking", "sleeping")
        # b is wanted again while it is still falling asleep and a wakes on its card.
        w.report(demand={"b": 1})
        w.tick()
        assert w.state.replicas[b].state == "sleeping"
        assert w.replicas("b") == [w.state.replicas[b]]


class TestNeverAsleep:
    """A replica whose engine never falls asleep is stopped at a deadline, not held forever."""

    def test_stopped_after_the_drain_grace_and_the_start_deadline(self) -> None:
        """Still reported awake 90 s (grace 30 s + deadline 60 s) after it was told to
        sleep: stopped with the reason, its cards given back once its agent says so."""
        w = two_card_node(sleepy("a"))
        a = put_to_sleep(w, "a")
        w.clock.advance(89)
        w.heartbeat("a", {a: "ready"})
        w.tick()
        assert w.state.replicas[a].state == "sleeping"
        w.clock.advance(2)
        w.heartbeat("a", {a: "ready"})
        w.tick()
        r = w.state.replicas[a]
        assert r.state == "stopped"
        assert "still falling asleep after 90s" in (r.reason or "")
        assert [s.replica_id for s in w.heartbeat("a", {a: "ready"})] == []

    def test_asleep_in_time_it_stays_asleep(self) -> None:
        """Asleep before the deadline: the deadline does not apply to a sleeper."""
        w = two_card_node(sleepy("a"))
        a = put_to_sleep(w, "a")
        w.clock.advance(50)
        w.heartbeat("a", {a: "sleeping"})
        w.tick()
        w.clock.advance(500)
        w.heartbeat("a", {a: "sleeping"})
        w.tick()
        assert w.state.replicas[a].state == "sleeping"
