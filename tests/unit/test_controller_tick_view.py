"""The tick's view (placement/tickview.py) changes how much a tick costs, never what it decides."""

from __future__ import annotations

import dataclasses
import functools
import random
from unittest import mock

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.controller.fleet.batch import Batch
from llmgw.controller.idle import IdleFor, idle_fn
from llmgw.controller.placement.eviction import (
    Candidate,
    _spare_per_model,
    eta_waits,
    idle_candidates,
)
from llmgw.controller.placement.tickview import TickView
from llmgw.controller.placement.wakes import card_holders
from llmgw.controller.tick import plan as plan_module
from llmgw.controller.tick.plan import Plan
from llmgw.wire.agent import ShardState
from tests.unit.controller_reconcile_world import World, spec


def _world(rng: random.Random) -> World:
    """A small fleet, short of cards, of models that sleep or not, at mixed priorities."""
    w = World()
    # Half the fleets all sleep: swaps, moves and clearing need sleepers everywhere.
    sleepy = 1.0 if rng.random() < 0.5 else 0.5
    for i in range(rng.randint(2, 6)):
        w.node(f"n{i}", rng.choice((2, 4, 8)), fabrics=(f"ib{rng.randint(0, 1)}",))
        w.set_node(f"n{i}", host_memory_mib=rng.choice((None, 60_000, 2_000_000)))
    for i in range(rng.randint(3, 9)):
        nodes = 2 if rng.random() < 0.15 else 1
        s = spec(
            f"m{i}",
            gpus_per_node=rng.choice((1, 1, 2, 4)) if nodes == 1 else 2,
            nodes=nodes,
            min_replicas=rng.choice((0, 0, 1)),
            max_replicas=rng.randint(1, 4),
            idle_timeout_s=rng.choice((30.0, 60.0, 300.0)),
            priority=rng.randint(0, 2),
        )
        if rng.random() < sleepy:
            s = msgspec.structs.replace(
                s,
                sleep_mode=True,
                weights_gb=rng.choice((None, 16.0, 40.0)),
                sleep_after_s=rng.choice((None, 20.0)),
            )
        w.model(s, desired=rng.randint(s.min_replicas, s.max_replicas))
    return w


def _agents(w: World, rng: random.Random) -> list[tuple[str, dict[str, ShardState]]]:
    """What each node's agent reports this step (some skip a beat)."""
    out = []
    for node in sorted(w.state.nodes):
        if rng.random() < 0.3:
            continue
        shards: dict[str, ShardState] = {}
        for rid in sorted(w.index.on_node(node)):
            r = w.state.replicas[rid]
            if r.state in ("pending", "starting", "waking"):
                shards[rid] = "ready" if rng.random() < 0.7 else "starting"
            elif r.state in ("ready", "draining"):
                shards[rid] = "ready"
            elif r.state == "sleeping":
                shards[rid] = "sleeping" if rng.random() < 0.8 else "ready"
        out.append((node, shards))
    return out


def _usage(w: World, rng: random.Random) -> dict[str, dict[str, float] | dict[str, int]]:
    ready = sorted(w.index.in_state("ready"))
    return {
        "last_used": {
            rid: w.now - rng.choice((1.0, 25.0, 50.0, 100.0, 400.0))
            for rid in ready
            if rng.random() < 0.85
        },
        "inflight": {rid: rng.choice((0, 0, 0, 1)) for rid in ready},
        "demand": {
            name: rng.randint(1, 3)
            for name, m in sorted(w.state.models.items())
            if rng.random() < (0.7 if m.spec.sleep_mode else 0.3)
        },
    }


def _step(w: World, rng: random.Random) -> None:
    """One step of the outside world; `rng` draws the same for both worlds."""
    w.clock.advance(rng.choice((1.0, 5.0, 16.0, 45.0, 90.0)))
    silent = rng.choice([None, *sorted(w.state.nodes)]) if rng.random() < 0.1 else None
    w.touch(*(n for n in sorted(w.state.nodes) if n != silent))
    for node, shards in _agents(w, rng):
        w.heartbeat(node, shards)
    if rng.random() < 0.1:
        node = rng.choice(sorted(w.state.nodes))
        op = rng.choice(("active", "cordoned", "draining"))
        w.set_node(node, operator_state=op, drain_evict_idle=rng.random() < 0.5)
    w.report(**_usage(w, rng))  # type: ignore[arg-type]


def _uncached_tick(w: World) -> Plan:
    view = functools.partial(TickView, cached=False)
    with mock.patch.object(plan_module, "TickView", view):
        return w.tick()


def _same(a: Plan, b: Plan) -> None:
    assert dataclasses.asdict(b.changes) == dataclasses.asdict(a.changes)
    assert b.memory == a.memory
    assert b.forgotten == a.forgotten


class TestSameDecisions:
    """A tick decides the same with its view as when it recomputes every fact each time."""

    @settings(max_examples=150, deadline=None)
    @given(seed=st.integers(0, 2**32 - 1), steps=st.integers(4, 14))
    def test_random_fleets_decide_alike(self, seed: int, steps: int) -> None:
        """Over random fleets and steps, both ticks produce the same changes and memory."""
        fast, slow = _world(random.Random(seed)), _world(random.Random(seed))
        fast_rng, slow_rng = random.Random(seed + 1), random.Random(seed + 1)
        for _ in range(steps):
            _step(fast, fast_rng)
            _step(slow, slow_rng)
            _same(_uncached_tick(slow), fast.tick())


def _change(batch: Batch, rng: random.Random) -> None:
    """One change a tick might make to a random replica."""
    r = batch.replica(rng.choice(sorted(batch.base.replicas)))
    assert r is not None
    pick = rng.randrange(6)
    if pick == 0:
        batch.drain(r, "test", grace_s=30.0)
    elif pick == 1 and r.state == "ready":
        batch.sleep(r, rng.choice((1, 2)), "test")
    elif pick == 2:
        batch.stop(r, "test")
    elif pick == 3 and r.state == "sleeping":
        batch.wake(r, "test")
    elif pick == 4:
        batch.put_replica(dataclasses.replace(r, id=batch.new_id(), state="pending"))
    else:
        batch.update(r, weight=2.0)


def _expected(
    view_batch: Batch, w: World, spec_name: str, wait_s: float, *, busy_ok: bool
) -> list[Candidate]:
    """What the view's candidates must be: eviction.idle_candidates, shifted by `wait_s`,
    less those whose model may lose none."""
    base, now = view_batch.base, view_batch.now
    plain = idle_fn(w.usage, now=now)

    def later(rid: str) -> float | None:
        s = plain(rid)
        return None if s is None else s + wait_s

    idle: IdleFor = plain if wait_s == 0.0 else later
    leaving = view_batch.leaving()
    spare = _spare_per_model(base, leaving)
    inflight = None if busy_ok else w.usage.inflight
    found = idle_candidates(
        base.models[spec_name].spec,
        base,
        idle,
        now,
        w.config.heartbeat_timeout_s,
        leaving,
        inflight,
    )
    return [c for c in found if spare[c.replica.model] > 0]


class TestViewFacts:
    """Each fact the view keeps equals what the functions it replaces compute, as a tick changes."""

    @settings(max_examples=80, deadline=None)
    @given(seed=st.integers(0, 2**32 - 1), changes=st.integers(0, 12))
    def test_facts_follow_the_changes(self, seed: int, changes: int) -> None:
        """Leaving, current replicas, card holders, spare, candidates and waits stay exact."""
        rng = random.Random(seed)
        w = _world(rng)
        for _ in range(rng.randint(2, 8)):
            _step(w, rng)
            w.tick()
        batch = Batch(w.state, w.now, new_id=w.new_id)
        view = TickView(batch, w.usage, heartbeat_timeout_s=w.config.heartbeat_timeout_s)
        for _ in range(changes + 1):
            if rng.random() < 0.5 and batch.base.replicas:
                _change(batch, rng)
                continue
            assert view.leaving() == batch.leaving()
            current = dict(batch.base.replicas)
            current.update((r.id, r) for r in batch.changes.replicas)
            assert list(view.current().items()) == list(current.items())
            assert dict(view.holders()) == card_holders(current.values())
            assert dict(view.spare) == dict(_spare_per_model(batch.base, batch.leaving()))
            assert view.pool() is view
            for name, m in sorted(batch.base.models.items()):
                idle = idle_fn(w.usage, now=batch.now)
                waits = eta_waits(m.spec, batch.base, idle, batch.leaving(), 4)
                assert view.waits(m.spec, 4) == waits
                for wait_s in (0.0, *waits):
                    for busy_ok in (False, True):
                        got = view.candidates(m.spec, wait_s=wait_s, busy_ok=busy_ok)
                        assert got == _expected(batch, w, name, wait_s, busy_ok=busy_ok)
                sleeping = [
                    r
                    for r in batch.base.replicas.values()
                    if r.model == name and r.state == "sleeping"
                ]
                assert list(view.sleeping(name)) == sleeping
