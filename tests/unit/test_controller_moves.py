"""Why a replica must move (controller/tick/moves.py): one rule, used to decide and to explain."""

from __future__ import annotations

import dataclasses

from llmgw.controller.fleet.batch import Batch
from llmgw.controller.tick.moves import Move, move_reason
from tests.unit.controller_fleet import NOW, fleet, model, node, replica, spec
from tests.unit.controller_reconcile_world import World


def _batch(*, op: str = "active", unhealthy: tuple[int, ...] = (), b_op: str = "active") -> Batch:
    state = fleet(
        nodes=[
            node("a", operator_state=op, unhealthy=unhealthy),  # type: ignore[arg-type]
            node("b", operator_state=b_op),  # type: ignore[arg-type]
        ],
        models=[spec("m", gpus_per_node=8, nodes=2)],
        replicas=[replica("r1", "m", [("a", tuple(range(8))), ("b", tuple(range(8)))])],
    )
    return Batch(state, NOW)


class TestMoveReason:
    """The one rule that says why a replica must move."""

    def test_a_replica_nothing_happened_to_stays(self) -> None:
        """A replica nothing happened to stays."""
        b = _batch()
        assert move_reason(b, b.base.models["m"], b.base.replicas["r1"]) is None

    def test_a_draining_node_moves_it_at_once_and_names_the_node(self) -> None:
        """A draining node moves it at once and names the node."""
        b = _batch(b_op="draining")
        got = move_reason(b, b.base.models["m"], b.base.replicas["r1"])
        assert got == Move("node b draining", at_once=True)

    def test_an_unhealthy_card_moves_it_at_once_and_names_the_card(self) -> None:
        """An unhealthy card moves it at once and names the card."""
        b = _batch(unhealthy=(3, 5))
        got = move_reason(b, b.base.models["m"], b.base.replicas["r1"])
        assert got == Move("GPU 3 on a unhealthy", at_once=True)

    def test_a_spec_change_rolls(self) -> None:
        """A changed spec rolls the replica over, not at once."""
        b = _batch()
        m = dataclasses.replace(b.base.models["m"], updated_at=NOW)
        assert move_reason(b, m, b.base.replicas["r1"]) == Move("model spec changed", at_once=False)

    def test_a_drain_wins_over_a_bad_card_which_wins_over_a_spec_change(self) -> None:
        """A drain wins over a bad card which wins over a spec change."""
        b = _batch(unhealthy=(0,), b_op="draining")
        m = dataclasses.replace(b.base.models["m"], updated_at=NOW)
        r = b.base.replicas["r1"]
        assert move_reason(b, m, r) == Move("node b draining", at_once=True)
        b2 = _batch(unhealthy=(0,))
        assert move_reason(b2, m, r) == Move("GPU 0 on a unhealthy", at_once=True)

    def test_a_bad_card_the_replica_does_not_use_moves_nothing(self) -> None:
        """A bad card the replica does not use moves nothing."""
        state = fleet(
            nodes=[node("a", unhealthy=(7,))],
            models=[spec("m")],
            replicas=[replica("r1", "m", [("a", (0,))])],
        )
        b = Batch(state, NOW)
        assert move_reason(b, model(spec("m")), state.replicas["r1"]) is None


class TestTheSameReasonDecidesAndExplains:
    """The reason that moves a replica is the one its events give."""

    def test_a_ready_replica_and_its_replacement_say_the_same_reason(self) -> None:
        """A ready replica and its replacement say the same reason."""
        w = World()
        w.node("a")
        w.node("b")
        w.model(spec("m", gpus_per_node=8))
        w.tick()
        w.ready_all()
        old = w.only("m", "ready")
        on = old.shards[0].node
        w.set_node(on, operator_state="draining")
        w.tick()
        placed = [e for e in w.events if f"replacing {old.id}" in e]
        assert placed == [
            f"replica.placed {w.only('m', 'pending').id}: replacing {old.id} "
            f"(node {on} draining) on {'b' if on == 'a' else 'a'} GPUs 0,1,2,3,4,5,6,7"
        ]

    def test_a_replica_not_serving_yet_is_stopped_with_the_reason(self) -> None:
        """A replica not serving yet is stopped with the reason."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        pending = w.only("m", "pending")
        w.set_node("a", operator_state="draining")
        w.tick()
        assert w.state.replicas[pending.id].state == "stopped"
        assert f"replica.stopped {pending.id}: node a draining" in w.events
