"""Placement: best fit, whole nodes on one fabric, structured reasons."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.controller.fleet.records import HOLDS_GPUS, FleetState, Node
from llmgw.controller.placement.rules import (
    FreeMap,
    Placement,
    ShardPlacement,
    Unplaceable,
    free_map,
    place,
    place_many,
)
from llmgw.wire.agent import GPU
from llmgw.wire.models import ModelSpec
from tests.unit.controller_fleet import HB_TIMEOUT_S, NOW, fleet, gpus, node, replica, spec


def fmap(state: FleetState) -> FreeMap:
    return free_map(state, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)


def placed(result: Placement | Unplaceable) -> Placement:
    assert isinstance(result, Placement), result
    return result


def refused(result: Placement | Unplaceable) -> Unplaceable:
    assert isinstance(result, Unplaceable), result
    return result


class TestSingleNode:
    """Single-node placement: best fit on healthy cards of one class."""

    def test_best_fit_takes_the_node_left_with_fewest_free_cards(self) -> None:
        """A 2-GPU replica goes to the node with 3 free, not to the whole free node."""
        state = fleet(
            [node("a"), node("b")],
            replicas=[replica("r1", "x", [("b", (0, 1, 2, 3, 4))])],
        )
        result = placed(place(spec(gpus_per_node=2), state.nodes, fmap(state)))
        assert result.shards == (ShardPlacement(node="b", rank=0, gpus=(5, 6)),)

    def test_ties_are_broken_by_node_name(self) -> None:
        """Equally good nodes: the lowest name wins, every time."""
        state = fleet([node("c"), node("a"), node("b")])
        assert placed(place(spec(), state.nodes, fmap(state))).shards[0].node == "a"

    def test_lowest_contiguous_run_is_preferred(self) -> None:
        """With cards 0, 2, 3, 5 free, a 2-GPU replica gets 2 and 3."""
        state = fleet(
            [node("a", 6)],
            replicas=[replica("r1", "x", [("a", (1, 4))])],
        )
        result = placed(place(spec(gpus_per_node=2), state.nodes, fmap(state)))
        assert result.shards[0].gpus == (2, 3)

    def test_without_a_contiguous_run_the_lowest_indices_are_used(self) -> None:
        """Cards 0, 2, 4 free: a 2-GPU replica takes 0 and 2."""
        state = fleet([node("a", 5)], replicas=[replica("r1", "x", [("a", (1, 3))])])
        assert placed(place(spec(gpus_per_node=2), state.nodes, fmap(state))).shards[0].gpus == (
            0,
            2,
        )

    @pytest.mark.parametrize(
        "blocked",
        [
            node("a", operator_state="cordoned"),
            node("a", operator_state="draining"),
            node("a", reachable=False),
        ],
        ids=["cordoned", "draining", "unreachable"],
    )
    def test_never_on_a_node_that_is_not_ready(self, blocked: Node) -> None:
        """Cordoned, draining and unreachable nodes are never placed on."""
        state = fleet([blocked, node("b", 2)])
        assert placed(place(spec(), state.nodes, fmap(state))).shards[0].node == "b"

    def test_never_on_an_unhealthy_gpu(self) -> None:
        """An unhealthy card is not free even when nothing holds it."""
        state = fleet([node("a", 2, unhealthy=[0])])
        assert placed(place(spec(), state.nodes, fmap(state))).shards[0].gpus == (1,)
        assert isinstance(place(spec(gpus_per_node=2), state.nodes, fmap(state)), Unplaceable)

    def test_only_an_acceptable_class(self) -> None:
        """A model that accepts H200 never lands on an H100 node."""
        state = fleet([node("a", 8, "H100-80G"), node("b", 8, "H200-141G")])
        result = placed(place(spec(gpu_classes=("H200-141G",)), state.nodes, fmap(state)))
        assert (result.shards[0].node, result.pool) == ("b", "ib0/H200-141G")

    def test_a_shard_never_mixes_classes(self) -> None:
        """One H100 and one A100 free on a mixed node are not two GPUs for one shard."""
        mixed = (
            *gpus(1, "H100-80G"),
            GPU(index=1, uuid="u", name="A", gpu_class="A100", memory_mib=1),
        )
        state = fleet([node("a", gpu_list=mixed)])
        result = place(
            spec(gpu_classes=("H100-80G", "A100"), gpus_per_node=2), state.nodes, fmap(state)
        )
        assert refused(result).constraint == "gpus_per_node"

    def test_gpus_of_live_replicas_are_held_and_of_gone_ones_free(self) -> None:
        """Pending, starting, ready, draining, waking replicas hold cards; stopped and failed,
        and sleeping ones whose engine is asleep, do not."""
        held = [
            replica(f"h-{s}", "x", [("a", (i,))], state=s) for i, s in enumerate(sorted(HOLDS_GPUS))
        ]
        n = len(held)
        gone = [
            replica("s", "x", [("a", (n,))], state="stopped"),
            replica("f", "x", [("a", (n + 1,))], state="failed"),
            replica("z", "x", [("a", (n + 2,))], state="sleeping"),
        ]
        state = fleet([node("a", n + 3)], replicas=[*held, *gone])
        assert fmap(state).free_gpus("a") == frozenset({n, n + 1, n + 2})

    def test_pool_is_fabric_slash_class_and_empty_fabric_when_none(self) -> None:
        """The pool names rank 0's node's first fabric, or nothing before the slash."""
        state = fleet([node("a", fabrics=())])
        assert placed(place(spec(), state.nodes, fmap(state))).pool == "/H100-80G"


class TestMultiNode:
    """Multi-node placement takes whole free nodes on one fabric."""

    def test_takes_whole_free_nodes_on_one_fabric(self) -> None:
        """Two whole nodes on one fabric, ranks in node order."""
        state = fleet([node("a"), node("b"), node("c", fabrics=("ib1",))])
        result = placed(place(spec(gpus_per_node=8, nodes=2), state.nodes, fmap(state)))
        assert [(s.node, s.rank, s.gpus) for s in result.shards] == [
            ("a", 0, tuple(range(8))),
            ("b", 1, tuple(range(8))),
        ]
        assert result.pool == "ib0/H100-80G"

    def test_free_cards_on_the_wrong_fabric_are_not_capacity(self) -> None:
        """One whole node per fabric is not two whole nodes on one fabric."""
        state = fleet([node("a"), node("b", fabrics=("ib1",))])
        result = refused(place(spec(gpus_per_node=8, nodes=2), state.nodes, fmap(state)))
        assert result.reason == (
            "needs 2 H100-80G nodes with at least 8 GPUs on one fabric; "
            "no fabric has that many: ib0 has 1, ib1 has 1"
        )
        assert (result.constraint, result.counts["fabric:ib0"]) == ("fabric_nodes", 1)

    def test_a_node_with_one_card_in_use_is_not_whole(self) -> None:
        """A node with a single card taken cannot hold a shard of a multi-node replica."""
        state = fleet(
            [node("a"), node("b"), node("c")],
            replicas=[replica("r", "x", [("b", (7,))])],
        )
        result = placed(place(spec(gpus_per_node=4, nodes=2), state.nodes, fmap(state)))
        assert [s.node for s in result.shards] == ["a", "c"]

    def test_a_node_with_an_unhealthy_card_is_not_whole(self) -> None:
        """An unhealthy card makes a node not entirely free."""
        state = fleet([node("a"), node("b", unhealthy=[3])])
        assert refused(
            place(spec(gpus_per_node=4, nodes=2), state.nodes, fmap(state))
        ).constraint == ("whole_nodes")

    def test_the_fabric_with_fewest_whole_nodes_that_fits_is_chosen(self) -> None:
        """Two whole nodes on ib1 fit; the four on ib0 stay together for a bigger replica."""
        ib0 = [node(f"a{i}") for i in range(4)]
        ib1 = [node(f"b{i}", fabrics=("ib1",)) for i in range(2)]
        state = fleet([*ib0, *ib1])
        result = placed(place(spec(gpus_per_node=8, nodes=2), state.nodes, fmap(state)))
        assert ({s.node for s in result.shards}, result.pool) == ({"b0", "b1"}, "ib1/H100-80G")

    def test_a_node_on_two_fabrics_counts_for_both(self) -> None:
        """A node on ib0 and ib1 can join a replica on either fabric."""
        state = fleet([node("a", fabrics=("ib0", "ib1")), node("b", fabrics=("ib1",))])
        result = placed(place(spec(gpus_per_node=8, nodes=2), state.nodes, fmap(state)))
        assert (result.pool, [s.node for s in result.shards]) == ("ib1/H100-80G", ["a", "b"])

    def test_smaller_whole_nodes_are_used_first(self) -> None:
        """4-GPU shards go to whole 4-GPU nodes before whole 8-GPU ones."""
        state = fleet([node("a", 8), node("b", 4), node("c", 4)])
        result = placed(place(spec(gpus_per_node=4, nodes=2), state.nodes, fmap(state)))
        assert [s.node for s in result.shards] == ["b", "c"]


class TestUnplaceableReasons:
    """Why a replica cannot be placed, in structured reasons."""

    def test_unknown_class_is_named(self) -> None:
        """A class no node has is the first thing said."""
        state = fleet([node("a")])
        result = refused(place(spec(gpu_classes=("L40S",)), state.nodes, fmap(state)))
        assert (result.constraint, result.reason) == ("gpu_class", "no node has GPU class L40S")

    def test_width_beyond_any_node_is_named(self) -> None:
        """A 16-GPU shard on 8-GPU nodes can never fit."""
        state = fleet([node("a")])
        result = refused(place(spec(gpus_per_node=16), state.nodes, fmap(state)))
        assert result.constraint == "gpus_per_node"
        assert result.reason == "needs 16 H100-80G GPUs on one node; the largest such node has 8"

    def test_free_gpu_shortfall_names_largest_block_and_blockers(self) -> None:
        """The reason counts the largest free block, blocked nodes and unhealthy cards."""
        nodes = [
            node("a", 4, unhealthy=[0, 1]),
            *(node(f"c{i}", 4, operator_state="cordoned") for i in range(3)),
            node("u", 4, reachable=False),
        ]
        state = fleet(nodes)
        result = refused(place(spec(gpus_per_node=4), state.nodes, fmap(state)))
        assert result.reason == (
            "needs 4 free H100-80G GPUs on one ready node; largest free block is 2 "
            "(3 nodes cordoned, 1 unreachable, 2 GPUs unhealthy)"
        )
        assert result.counts == {
            "needed": 4,
            "largest_free_block": 2,
            "ready": 1,
            "cordoned": 3,
            "draining": 0,
            "unreachable": 1,
            "unhealthy_gpus": 2,
        }

    def test_blocked_fabrics_show_zero_whole_nodes(self) -> None:
        """A fabric whose nodes are all cordoned is listed with 0."""
        state = fleet(
            [
                node("a"),
                node("b", fabrics=("ib1",), operator_state="cordoned"),
                node("c", fabrics=("ib1",), operator_state="cordoned"),
            ]
        )
        result = refused(place(spec(gpus_per_node=8, nodes=2), state.nodes, fmap(state)))
        assert result.reason == (
            "needs 2 whole H100-80G nodes on one fabric; ib0 has 1, ib1 has 0 (2 nodes cordoned)"
        )

    def test_more_nodes_than_any_fabric_has_is_named(self) -> None:
        """Two 8-card nodes on two fabrics never hold a 2-node replica, cordoned or not."""
        state = fleet(
            [
                node("a"),
                node("b", fabrics=("ib1",), operator_state="cordoned"),
                node("small", 4),
            ]
        )
        result = refused(place(spec(gpus_per_node=8, nodes=2), state.nodes, fmap(state)))
        assert result.constraint == "fabric_nodes"
        assert result.reason == (
            "needs 2 H100-80G nodes with at least 8 GPUs on one fabric; "
            "no fabric has that many: ib0 has 1, ib1 has 1"
        )
        assert result.counts == {"needed": 2, "fabric:ib0": 1, "fabric:ib1": 1}

    def test_nodes_without_fabric_cannot_host_multi_node(self) -> None:
        """Multi-node replicas need a fabric; the reason says none exists."""
        state = fleet([node("a", fabrics=()), node("b", fabrics=())])
        result = refused(place(spec(gpus_per_node=8, nodes=2), state.nodes, fmap(state)))
        assert (
            result.reason
            == "needs 2 whole H100-80G nodes on one fabric; no H100-80G node is on a fabric"
        )


class TestFreeMap:
    """The free-card map placement works on."""

    def test_place_does_not_change_the_map(self) -> None:
        """place() only looks; the same call twice gives the same answer."""
        state = fleet([node("a", 2)])
        free = fmap(state)
        assert place(spec(), state.nodes, free) == place(spec(), state.nodes, free)
        assert free.free_gpus("a") == frozenset({0, 1})

    def test_place_many_takes_gpus_as_it_goes(self) -> None:
        """Three 1-GPU replicas on a 2-GPU node: two land, the third is refused."""
        state = fleet([node("a", 2)])
        free = fmap(state)
        results = place_many([spec("x"), spec("y"), spec("z")], state.nodes, free)
        assert [type(r).__name__ for r in results] == ["Placement", "Placement", "Unplaceable"]
        assert free.free_gpus("a") == frozenset({0, 1})

    def test_take_refuses_a_gpu_already_given(self) -> None:
        """Taking the same placement twice is an error, not a double booking."""
        state = fleet([node("a", 2)])
        free = fmap(state)
        p = placed(place(spec(), state.nodes, free))
        free.take(p)
        with pytest.raises(ValueError, match="not free"):
            free.take(p)

    def test_release_returns_only_healthy_cards_of_ready_nodes(self) -> None:
        """A released unhealthy card or a card on a cordoned node is still not capacity."""
        state = fleet([node("a", 2, unhealthy=[1]), node("c", 2, operator_state="cordoned")])
        free = fmap(state)
        free.take(
            Placement(model="m", shards=(ShardPlacement(node="a", rank=0, gpus=(0,)),), pool="")
        )
        free.release("a", [0, 1])
        free.release("c", [0])
        assert (free.free_gpus("a"), free.free_gpus("c")) == (frozenset({0}), frozenset())

    def test_copy_is_independent(self) -> None:
        """Taking from a copy leaves the original untouched."""
        state = fleet([node("a", 2)])
        free = fmap(state)
        other = free.copy()
        other.take(placed(place(spec(gpus_per_node=2), state.nodes, other)))
        assert (free.free_gpus("a"), other.free_gpus("a")) == (frozenset({0, 1}), frozenset())

    def test_heartbeat_timeout_makes_a_node_unplaceable(self) -> None:
        """A node silent past the timeout is not in the map."""
        state = fleet([node("a", reachable=False)])
        assert "a" not in fmap(state)


# -- properties ---------------------------------------------------------------

CLASSES = ("A", "B", "C")
FABRICS = ("f0", "f1")


@st.composite
def small_fleets(draw: st.DrawFn) -> tuple[FleetState, list[ModelSpec]]:
    nodes = []
    for i in range(draw(st.integers(1, 5))):
        count = draw(st.integers(0, 4))
        classes = [draw(st.sampled_from(CLASSES[:2])) for _ in range(count)]
        if draw(st.booleans()):  # most nodes are homogeneous
            classes = [classes[0]] * count if classes else []
        bad = draw(st.sets(st.integers(0, 3)))
        gl = tuple(
            GPU(index=g, uuid=f"n{i}-{g}", name=c, gpu_class=c, memory_mib=1, healthy=g not in bad)
            for g, c in enumerate(classes)
        )
        op = draw(st.sampled_from(["active", "active", "active", "cordoned", "draining"]))
        nodes.append(
            node(
                f"n{i}",
                gpu_list=gl,
                fabrics=tuple(sorted(draw(st.sets(st.sampled_from(FABRICS))))),
                operator_state=op,
                reachable=draw(st.integers(0, 5)) > 0,
            )
        )
    replicas = []
    for j in range(draw(st.integers(0, 4))):
        n = draw(st.sampled_from(nodes))
        held = tuple(sorted(draw(st.sets(st.integers(0, max(len(n.gpus) - 1, 0)), max_size=3))))
        state = draw(
            st.sampled_from(["pending", "starting", "ready", "draining", "stopped", "failed"])
        )
        replicas.append(replica(f"r{j}", "x", [(n.name, held)], state=state))
    specs = [
        spec(
            f"m{k}",
            gpu_classes=tuple(
                draw(st.lists(st.sampled_from(CLASSES), min_size=1, max_size=2, unique=True))
            ),
            gpus_per_node=draw(st.integers(1, 4)),
            nodes=draw(st.integers(1, 3)),
        )
        for k in range(draw(st.integers(1, 6)))
    ]
    return fleet(nodes, replicas=replicas), specs


def oracle_free(state: FleetState) -> dict[str, set[int]]:
    """Independent of FreeMap: healthy cards on ready nodes minus cards live replicas hold."""
    out = {}
    for name, n in state.nodes.items():
        if n.shown_state(now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S) == "ready":
            out[name] = {g.index for g in n.gpus if g.healthy}
    for r in state.replicas.values():
        if r.state in HOLDS_GPUS:
            for s in r.shards:
                out.get(s.node, set()).difference_update(s.gpus)
    return out


def class_free(n: Node, free: set[int], gpu_class: str) -> int:
    return sum(1 for g in n.gpus if g.gpu_class == gpu_class and g.index in free)


def feasible(s: ModelSpec, nodes: Mapping[str, Node], free: Mapping[str, set[int]]) -> bool:
    """Brute force: does any valid placement exist?"""
    if s.nodes == 1:
        return any(
            class_free(nodes[n], f, c) >= s.gpus_per_node
            for n, f in free.items()
            for c in s.gpu_classes
        )
    whole = [n for n, f in free.items() if nodes[n].gpus and len(f) == len(nodes[n].gpus)]
    for combo in itertools.combinations(whole, s.nodes):
        shared = set.intersection(*(set(nodes[n].fabrics) for n in combo))
        if shared and any(
            all(class_free(nodes[n], free[n], c) >= s.gpus_per_node for n in combo)
            for c in s.gpu_classes
        ):
            return True
    return False


class TestPlacementProperties:
    """Placement never gives a card twice and stays best fit."""

    @settings(max_examples=400, deadline=None)
    @given(small_fleets())
    def test_no_gpu_is_given_twice_and_every_shard_is_valid(
        self, case: tuple[FleetState, list[ModelSpec]]
    ) -> None:
        """No card is given twice; shards are healthy, acceptable, ready, and on one fabric."""
        state, specs = case
        free = oracle_free(state)
        classes = {
            n: {g.index: g.gpu_class for g in node_.gpus} for n, node_ in state.nodes.items()
        }
        for s, result in zip(specs, place_many(specs, state.nodes, fmap(state)), strict=True):
            if isinstance(result, Unplaceable):
                assert not feasible(s, state.nodes, free), (s, result)
                continue
            assert result.model == s.name
            assert len(result.shards) == s.nodes
            assert len({sh.node for sh in result.shards}) == s.nodes
            shard_classes = {classes[sh.node][g] for sh in result.shards for g in sh.gpus}
            assert len(shard_classes) == 1
            assert shard_classes <= set(s.gpu_classes)
            if s.nodes > 1:
                fabric = result.pool.split("/")[0]
                assert all(fabric in state.nodes[sh.node].fabrics for sh in result.shards)
                # whole: every card of the node healthy and free before this replica
                assert all(
                    len(free[sh.node]) == len(state.nodes[sh.node].gpus) for sh in result.shards
                )
            for sh in result.shards:
                assert len(sh.gpus) == s.gpus_per_node
                assert set(sh.gpus) <= free[sh.node]  # ready node, healthy, not held, not given
                free[sh.node] -= set(sh.gpus)

    @settings(max_examples=300, deadline=None)
    @given(small_fleets())
    def test_single_node_is_best_fit(self, case: tuple[FleetState, list[ModelSpec]]) -> None:
        """A single-node replica goes where the fewest acceptable free cards are left."""
        state, specs = case
        free = oracle_free(state)
        for s in specs:
            if s.nodes != 1:
                continue
            result = place(s, state.nodes, fmap(state))
            if isinstance(result, Placement):
                sh = result.shards[0]
                chosen_class = result.pool.split("/")[1]
                chosen = class_free(state.nodes[sh.node], free[sh.node], chosen_class)
                best = min(
                    class_free(state.nodes[n], f, c)
                    for n, f in free.items()
                    for c in s.gpu_classes
                    if class_free(state.nodes[n], f, c) >= s.gpus_per_node
                )
                assert chosen == best
