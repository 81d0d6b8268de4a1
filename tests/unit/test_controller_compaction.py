"""Compaction: serving replicas moved (make-before-break) so a fragmented fleet holds a model."""

from __future__ import annotations

from collections.abc import Callable

from llmgw.controller.fleet.records import FleetState, Replica
from llmgw.controller.placement.compaction import CompactionPlan, plan_compaction
from llmgw.controller.placement.requests import COMPACT_RETRY_S
from llmgw.controller.placement.rules import free_map
from llmgw.controller.placement.wakes import card_holders
from llmgw.wire.models import ModelSpec
from tests.unit.controller_fleet import HB_TIMEOUT_S, NOW, fleet, node, replica, spec
from tests.unit.controller_reconcile_world import World

BIG = spec("big", gpus_per_node=8, nodes=2)
FOUR = spec("four", gpus_per_node=4)


def ready_only(r: Replica) -> bool:
    return r.state == "ready"


def plan(
    want: ModelSpec, state: FleetState, movable: Callable[[Replica], bool] = ready_only
) -> CompactionPlan | None:
    free = free_map(state, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)
    return plan_compaction(
        want,
        state.nodes,
        free,
        holders=card_holders(state.replicas.values()),
        movable=movable,
        specs={name: m.spec for name, m in state.models.items()},
    )


def split_fabrics() -> FleetState:
    """a-1 holds a 4-card replica, b-1 an 8-card one; a-2 and b-2 are free, on two fabrics."""
    return fleet(
        [
            node("a-1", fabrics=("ib0",)),
            node("a-2", fabrics=("ib0",)),
            node("b-1", fabrics=("ib1",)),
            node("b-2", fabrics=("ib1",)),
        ],
        models=[BIG, spec("x", gpus_per_node=4), spec("y", gpus_per_node=8)],
        replicas=[
            replica("r-x", "x", [("a-1", (0, 1, 2, 3))]),
            replica("r-y", "y", [("b-1", tuple(range(8)))]),
        ],
    )


def two_free_each(*, stuck: str = "ready") -> FleetState:
    """Two 8-card nodes with 2 free each: a 2-card and a 4-card replica on both.

    `stuck`: the state of the 2-card replicas (movable only when ready).
    """
    return fleet(
        [node("n1"), node("n2")],
        models=[FOUR, spec("p", gpus_per_node=2, min_replicas=2), spec("q", gpus_per_node=4)],
        replicas=[
            replica("r-p1", "p", [("n1", (0, 1))], state=stuck),  # type: ignore[arg-type]
            replica("r-q1", "q", [("n1", (2, 3, 4, 5))]),
            replica("r-p2", "p", [("n2", (0, 1))], state=stuck),  # type: ignore[arg-type]
            replica("r-q2", "q", [("n2", (2, 3, 4, 5))]),
        ],
    )


class TestPlan:
    """Which replicas move, and where their replacements and the model go."""

    def test_two_whole_nodes_on_one_fabric(self) -> None:
        """One move empties a fabric's second node; the replacement stays off the model's nodes."""
        p = plan(BIG, split_fabrics())
        assert p is not None
        (move,) = p.moves
        model_nodes = {s.node for s in p.placement.shards}
        assert move.replica.id == "r-x"  # of two one-move plans, the fewer cards
        assert model_nodes == {"a-1", "a-2"}
        assert {s.node for s in move.placement.shards}.isdisjoint(model_nodes)
        assert dict(p.room) == {"a-1": tuple(range(8)), "a-2": tuple(range(8))}

    def test_one_two_card_move_frees_four_on_a_node(self) -> None:
        """2 free on every node: moving a 2-card replica to the other node makes 4 on one."""
        p = plan(FOUR, two_free_each())
        assert p is not None
        (move,) = p.moves
        (shard,) = p.placement.shards
        assert (move.replica.id, shard.node) == ("r-p1", "n1")
        assert move.placement.shards[0].node == "n2"
        assert set(shard.gpus) == {0, 1, 6, 7}

    def test_never_a_move_whose_replacement_does_not_fit_now(self) -> None:
        """Only the 4-card replicas may move, and 4 free cards exist nowhere else: no plan."""
        assert plan(FOUR, two_free_each(stuck="starting")) is None

    def test_nothing_when_the_free_cards_do_not_add_up(self) -> None:
        """Not fragmentation: 4 free cards in all, 6 needed."""
        assert plan(spec("six", gpus_per_node=6), two_free_each()) is None

    def test_only_what_the_caller_allows_moves(self) -> None:
        """Sleeping, starting and draining holders rule their node out (the caller's rule)."""
        state = split_fabrics()
        assert plan(BIG, state, movable=lambda r: r.id == "r-y").moves[0].replica.id == "r-y"  # type: ignore[union-attr]
        assert plan(BIG, state, movable=lambda r: False) is None

    def test_fewest_moves_win(self) -> None:
        """Moving one 4-card replica beats moving two 2-card ones that free as much."""
        q = spec("q", gpus_per_node=4, gpu_classes=("H100-80G", "A100-80G"))
        state = fleet(
            [node("n1"), node("n2"), node("n3", gpu_class="A100-80G"), node("n4")],
            models=[FOUR, spec("p", gpus_per_node=2, min_replicas=2), q, spec("s")],
            replicas=[
                replica("r-p1", "p", [("n1", (0, 1))]),
                replica("r-p2", "p", [("n1", (2, 3))]),
                replica("r-s1", "s", [("n1", (4, 5, 6, 7))], state="starting"),
                replica("r-q1", "q", [("n2", (0, 1, 2, 3))]),
                replica("r-s2", "s", [("n2", (4, 5))], state="starting"),
                replica("r-s3", "s", [("n4", (0, 1, 2, 3, 4, 5))], state="starting"),
            ],
        )
        p = plan(FOUR, state)
        assert p is not None
        assert [m.replica.id for m in p.moves] == ["r-q1"]
        assert p.moves[0].placement.shards[0].node == "n3"
        assert p.placement.shards[0].node == "n2"


def fragmented_world(*, y_min: int = 1) -> World:
    """x (4 cards) on a-1, y (8) on b-1, both ready; a-2 (ib0) and b-2 (ib1) free."""
    w = World()
    for name, fabric in (("a-1", "ib0"), ("a-2", "ib0"), ("b-1", "ib1"), ("b-2", "ib1")):
        w.node(name, fabrics=(fabric,))
    w.model(spec("x", gpus_per_node=4))
    w.tick()
    w.set_node("a-2", operator_state="cordoned")
    w.model(spec("y", gpus_per_node=8, min_replicas=y_min), desired=1)
    w.tick()
    w.set_node("a-2", operator_state="active")
    w.ready_all()
    assert (w.only("x").shards[0].node, w.only("y").shards[0].node) == ("a-1", "b-1")
    return w


def settle(w: World, *, seconds: float = 31.0) -> None:
    """Time passes (past the drain grace), every node heartbeats what it runs, a tick."""
    w.clock.advance(seconds)
    w.touch(*w.state.nodes)
    w.tick()
    for name in w.state.nodes:
        running = {
            rid: "ready"
            for rid in w.index.on_node(name)
            if w.state.replicas[rid].state in ("ready", "draining")
        }
        w.heartbeat(name, running)  # type: ignore[arg-type]
    w.tick()


class TestCompactionTick:
    """The reconcile tick moves replicas for an unplaceable model and places it afterwards."""

    def test_the_fragmented_fleet_ends_with_every_model_ready(self) -> None:
        """x moves to b-2 (make-before-break), then big lands on a-1 and a-2."""
        w = fragmented_world()
        old_x = w.only("x").id
        w.model(BIG)
        w.tick()
        new_x = w.only("x", "pending")
        assert (new_x.replaces, new_x.shards[0].node) == (old_x, "b-2")
        assert w.state.replicas[old_x].state == "ready"
        assert w.memory.evicting["big"].victims == {old_x}
        moving = f"model.compacting big: moving {old_x} to make room"
        assert any(e.startswith(moving) for e in w.events)
        assert any(
            e.startswith(f"replica.placed {new_x.id}: replacing {old_x} (to make room for big: ")
            for e in w.events
        )
        assert w.replicas("big") == []
        w.ready_all("x")
        w.tick()
        assert w.state.replicas[old_x].state == "draining"
        settle(w)
        assert w.state.replicas[old_x].state == "stopped"
        settle(w, seconds=1.0)
        big = w.only("big")
        assert {s.node for s in big.shards} == {"a-1", "a-2"}
        w.ready_all("big")
        states = [r.state for r in (w.only("big"), w.only("x", "ready"), w.only("y"))]
        assert states == ["ready"] * 3
        assert "big" not in w.memory.evicting

    def test_a_failed_replacement_releases_the_room(self) -> None:
        """The replacement fails: the room ends, x serves on, nothing is held for nobody."""
        w = fragmented_world()
        old_x = w.only("x").id
        w.model(BIG)
        w.tick()
        new_x = w.only("x", "pending")
        w.heartbeat("b-2", {new_x.id: "failed"})
        w.tick()
        # A later plan may move another replica; never the one whose move is stuck.
        room = w.memory.evicting.get("big")
        assert room is None or old_x not in room.victims
        assert w.state.replicas[old_x].state == "ready"
        assert any(
            e.startswith(f"model.room_released big: stopped making room: {old_x} (x)")
            for e in w.events
        )

    def test_nothing_moves_when_idle_eviction_suffices(self) -> None:
        """y is idle past its timeout and may go: it is evicted, nothing is moved."""
        w = fragmented_world(y_min=0)
        y = w.only("y").id
        w.report(last_used={y: w.now - 3_600}, inflight={y: 0})
        w.model(BIG)
        w.tick()
        assert w.state.replicas[y].state == "draining"
        assert not any(e.startswith("model.compacting") for e in w.events)
        assert [r.state for r in w.replicas("x")] == ["ready"]

    def test_nothing_moves_for_a_lasting_failure(self) -> None:
        """A class the fleet lacks, three whole nodes on one fabric of two: no compaction."""
        w = fragmented_world()
        before = {r.id: r.state for r in w.replicas()}
        w.model(spec("huge", gpus_per_node=8, nodes=2, gpu_classes=("A100-80G",)))
        w.model(spec("wide", gpus_per_node=8, nodes=3))
        w.tick()
        assert {r.id: r.state for r in w.replicas() if r.model in ("x", "y")} == before
        assert not any(e.startswith("model.compacting") for e in w.events)

    def test_nothing_moves_when_no_set_of_moves_works(self) -> None:
        """Every other card is taken: x's replacement fits nowhere, so x stays put."""
        w = fragmented_world()
        w.model(spec("z", gpus_per_node=8))
        w.tick()
        w.ready_all()
        assert w.only("z").shards[0].node in ("a-2", "b-2")
        w.model(spec("half", gpus_per_node=4, nodes=2))
        before = {r.id: r.state for r in w.replicas()}
        w.tick()
        assert not any(e.startswith("model.compacting") for e in w.events)
        assert {r.id: r.state for r in w.replicas() if r.id in before} == before


class TestRetry:
    """A model no set of moves can make room for is planned again only now and then."""

    def test_a_failed_plan_waits_compact_retry_s(self) -> None:
        """Ticks within COMPACT_RETRY_S of a plan that found nothing do not plan again."""
        w = fragmented_world()
        w.model(spec("z", gpus_per_node=8))
        w.tick()
        w.ready_all()
        w.model(spec("half", gpus_per_node=4, nodes=2))
        w.tick()
        first = w.memory.compaction_failed["half"]
        w.clock.advance(1.0)
        w.touch(*w.state.nodes)
        w.tick()
        assert w.memory.compaction_failed["half"] == first
        w.clock.advance(COMPACT_RETRY_S)
        w.touch(*w.state.nodes)
        w.tick()
        assert w.memory.compaction_failed["half"] > first
