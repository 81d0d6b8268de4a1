"""Fleet summary: one test per rule."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from llmgw.controller.api.summary import IDLE_THRESHOLD_S, summarize, summarize_views
from llmgw.controller.api.views import (
    model_views,
    node_view,
    node_views,
    replica_view,
    replica_views,
)
from llmgw.controller.fleet.records import FleetState
from llmgw.wire.admin import Summary
from llmgw.wire.agent import GPU
from tests.unit.controller_fleet import HB_TIMEOUT_S, NOW, fleet, gpus, node, replica, spec


def summary(
    state: FleetState,
    idle: Mapping[str, float] | None = None,
    unplaceable: Mapping[str, str] | None = None,
) -> Summary:
    known = idle or {}
    return summarize(
        state,
        now=NOW,
        heartbeat_timeout_s=HB_TIMEOUT_S,
        idle_for=known.get,
        unplaceable=unplaceable,
    )


class TestNodeTotals:
    """Nodes counted by the state the summary shows."""

    def test_nodes_are_counted_by_shown_state(self) -> None:
        """Ready, cordoned, draining and unreachable each get their own count."""
        state = fleet(
            [
                node("a"),
                node("b"),
                node("c", operator_state="cordoned"),
                node("d", operator_state="draining"),
                node("e", reachable=False),
            ]
        )
        t = summary(state).nodes
        assert (t.total, t.ready, t.cordoned, t.draining, t.unreachable) == (5, 2, 1, 1, 1)

    def test_unreachable_counts_every_non_listed_state(self) -> None:
        """A state the summary does not name is counted as unreachable, never dropped."""
        odd = msgspec.structs.replace(
            node_view(node("a"), fleet(), now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S),
            state="rebooting",  # type: ignore[arg-type]
        )
        t = summarize_views([odd], [], []).nodes
        assert (t.total, t.unreachable) == (1, 1)

    def test_a_silent_cordoned_node_is_unreachable(self) -> None:
        """No heartbeat within the timeout wins over the operator's cordon."""
        state = fleet([node("a", operator_state="cordoned", reachable=False)])
        assert (summary(state).nodes.unreachable, summary(state).nodes.cordoned) == (1, 0)


class TestGpuClasses:
    """Cards per class counted as used, free or unhealthy."""

    def test_classes_come_from_node_gpus_sorted(self) -> None:
        """Each class the nodes' GPUs report is one row, sorted by class."""
        state = fleet([node("b", 4, "L40S"), node("a", 8, "H100-80G")])
        assert [(c.gpu_class, c.total) for c in summary(state).gpus] == [
            ("H100-80G", 8),
            ("L40S", 4),
        ]

    def test_unhealthy_gpus_are_neither_used_nor_free(self) -> None:
        """An unhealthy card, even one a replica holds, is counted unhealthy and nothing else."""
        state = fleet(
            [node("a", 8, unhealthy=[0, 1])],
            replicas=[replica("r", "m", [("a", (1, 2, 3))])],
        )
        (c,) = summary(state).gpus
        assert (c.total, c.used, c.unhealthy, c.free) == (8, 2, 2, 4)

    def test_used_counts_cards_held_by_live_replicas_only(self) -> None:
        """Pending, starting, ready and draining hold cards; stopped and failed do not."""
        live = [
            replica(f"r-{s}", "m", [("a", (i,))], state=s)
            for i, s in enumerate(["pending", "starting", "ready", "draining"])
        ]
        gone = [
            replica("s", "m", [("a", (4,))], state="stopped"),
            replica("f", "m", [("a", (5,))], state="failed"),
        ]
        (c,) = summary(fleet([node("a")], replicas=[*live, *gone])).gpus
        assert (c.used, c.free) == (4, 4)

    def test_a_mixed_node_counts_each_card_under_its_own_class(self) -> None:
        """A node with two classes adds each card to its class's used, unhealthy and total."""
        mixed = (
            *gpus(2, "H100-80G"),
            GPU(index=2, uuid="x", name="A100", gpu_class="A100", memory_mib=1),
            GPU(index=3, uuid="y", name="A100", gpu_class="A100", memory_mib=1, healthy=False),
        )
        state = fleet(
            [node("m", gpu_list=mixed), node("a", 4)],
            replicas=[replica("r", "m", [("m", (1, 2))])],
        )
        assert [(c.gpu_class, c.total, c.used, c.unhealthy) for c in summary(state).gpus] == [
            ("A100", 2, 1, 1),
            ("H100-80G", 6, 1, 0),
        ]

    def test_classes_are_counted_on_every_node_whatever_its_state(self) -> None:
        """Capacity totals include cordoned and unreachable nodes; state is shown elsewhere."""
        state = fleet([node("a", 4), node("b", 4, reachable=False)])
        assert summary(state).gpus[0].total == 8


class TestFabrics:
    """Nodes per fabric and the largest free block on each."""

    def test_fabric_nodes_count_every_node_on_it(self) -> None:
        """A node counts on each fabric it is on, whatever its state."""
        state = fleet(
            [
                node("a", fabrics=("ib0", "ib1")),
                node("b", fabrics=("ib1",), reachable=False),
                node("c", fabrics=()),
            ]
        )
        assert [(f.fabric, f.nodes) for f in summary(state).fabrics] == [("ib0", 1), ("ib1", 2)]

    def test_largest_free_block_counts_only_ready_entirely_free_nodes(self) -> None:
        """Only ready nodes with every card healthy and free, and at least one card, count."""
        state = fleet(
            [
                node("free1"),
                node("free2"),
                node("one-used"),
                node("unhealthy", unhealthy=[7]),
                node("cordoned", operator_state="cordoned"),
                node("draining", operator_state="draining"),
                node("silent", reachable=False),
                node("empty", 0),
            ],
            replicas=[replica("r", "m", [("one-used", (0,))])],
        )
        (f,) = summary(state).fabrics
        assert (f.nodes, f.largest_free_block) == (8, 2)


class TestReplicaTotals:
    """Replicas counted by state."""

    def test_ready_draining_failed_and_everything_else_starting(self) -> None:
        """Pending and starting both count as starting."""
        states = ["ready", "ready", "draining", "failed", "pending", "starting"]
        state = fleet(
            replicas=[replica(f"r{i}", "m", [], state=s) for i, s in enumerate(states)]  # type: ignore[arg-type]
        )
        t = summary(state).replicas
        assert (t.ready, t.draining, t.failed, t.starting) == (2, 1, 1, 2)

    def test_stopped_replicas_are_not_counted(self) -> None:
        """A stopped replica is gone: it is neither starting nor anything else."""
        state = fleet(replicas=[replica("r", "m", [], state="stopped")])
        t = summary(state).replicas
        assert (t.ready, t.draining, t.failed, t.starting) == (0, 0, 0, 0)


class TestModels:
    """Whether each model is satisfied, short or unplaceable."""

    def test_satisfied_when_ready_reaches_min(self) -> None:
        """Ready ≥ min is satisfied, including a scaled-to-zero model with nothing ready."""
        state = fleet(
            models=[spec("a", min_replicas=1), spec("z", min_replicas=0)],
            replicas=[replica("r", "a", [])],
        )
        m = summary(state).models
        assert (m.total, m.satisfied, m.short) == (2, 2, 0)

    def test_short_when_ready_is_below_min(self) -> None:
        """A starting replica does not make a model satisfied."""
        state = fleet(models=[spec("a")], replicas=[replica("r", "a", [], state="starting")])
        m = summary(state).models
        assert (m.satisfied, m.short) == (0, 1)

    def test_unplaceable_is_short_and_nothing_starting(self) -> None:
        """Short with a replica on its way is a cluster doing its job; short with none is listed."""
        state = fleet(
            models=[spec("b", min_replicas=2), spec("a"), spec("starting"), spec("ok")],
            replicas=[
                replica("r1", "b", []),
                replica("r2", "starting", [], state="pending"),
                replica("r3", "ok", []),
            ],
        )
        assert summary(state).unplaceable == ["a", "b"]

    def test_a_failed_or_draining_replica_counts_as_on_its_way(self) -> None:
        """Total counts every replica not stopped: a failed one awaiting restart is on its way."""
        state = fleet(
            models=[spec("f"), spec("d"), spec("s")],
            replicas=[
                replica("r1", "f", [], state="failed"),
                replica("r2", "d", [], state="draining"),
                replica("r3", "s", [], state="stopped"),
            ],
        )
        assert summary(state).unplaceable == ["s"]

    def test_unplaceable_reasons_follow_the_unplaceable_list(self) -> None:
        """Each unplaceable model carries placement's reason, else its shortfall."""
        state = fleet(models=[spec("a"), spec("b"), spec("c", min_replicas=0)])
        s = summary(state, unplaceable={"a": "no node has GPU class L40S", "c": "stale"})
        assert [(u.model, u.reason) for u in s.unplaceable_reasons] == [
            ("a", "no node has GPU class L40S"),
            ("b", "0 of 1 replicas ready and none starting"),
        ]


class TestIdleReplicas:
    """Which replicas the summary lists as idle."""

    def test_idle_replicas_need_ten_minutes_and_sort_longest_first(self) -> None:
        """599 s is not idle; 600 s is; the longest idle comes first, ties by id."""
        state = fleet(
            [node("a"), node("b")],
            replicas=[
                replica("r-short", "m", [("a", (0,))]),
                replica("r-ten", "m", [("a", (1,))]),
                replica("r-hour", "m", [("a", (2, 3)), ("b", (0, 1))]),
                replica("r-ten2", "m", [("a", (4,))]),
            ],
        )
        idle = {"r-short": 599.9, "r-ten": 600.0, "r-hour": 3_600.5, "r-ten2": 600.2}
        assert [(r.id, r.idle_seconds, r.gpus) for r in summary(state, idle).idle_replicas] == [
            ("r-hour", 3_600, 4),
            ("r-ten", 600, 1),
            ("r-ten2", 600, 1),
        ]
        assert IDLE_THRESHOLD_S == 600

    def test_idle_unknown_is_never_listed(self) -> None:
        """A replica no router has reported is not idle, however old it is."""
        state = fleet([node("a")], replicas=[replica("r", "m", [("a", (0,))])])
        assert summary(state, {}).idle_replicas == []

    def test_only_ready_replicas_are_idle(self) -> None:
        """A draining or starting replica is never named idle."""
        state = fleet(
            replicas=[
                replica("d", "m", [], state="draining"),
                replica("s", "m", [], state="starting"),
            ]
        )
        assert summary(state, {"d": 9_999.0, "s": 9_999.0}).idle_replicas == []


class TestSameFactsAsTables:
    """The summary agrees with the tables and uses the documented names."""

    def test_summary_agrees_with_the_tables(self) -> None:
        """Counts read off the node, replica and model tables equal the summary's."""
        state = fleet(
            [node("a"), node("b", operator_state="cordoned"), node("c", unhealthy=[0])],
            models=[spec("m", min_replicas=2)],
            replicas=[replica("r1", "m", [("a", (0, 1))]), replica("r2", "m", [("c", (1,))])],
        )
        nodes = node_views(state, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)
        s = summary(state)
        assert s.gpus[0].used == sum(len(n.gpus_used) for n in nodes)
        assert s.gpus[0].free == sum(n.gpu_free for n in nodes)
        assert s.replicas.ready == sum(r.state == "ready" for r in replica_views(state, {}.get))
        (mv,) = model_views(state, {})
        assert (mv.ready, mv.total, s.models.short) == (2, 2, 0)

    def test_json_uses_the_documented_field_names(self) -> None:
        """The summary's JSON keys are the API's (class, largest_free_block, idle_seconds...)."""
        state = fleet([node("a")], replicas=[replica("r", "m", [("a", (0,))])])
        doc = msgspec.json.decode(msgspec.json.encode(summary(state, {"r": 700.0})))
        assert doc["gpus"] == [{"class": "H100-80G", "total": 8, "used": 1, "unhealthy": 0}]
        assert doc["fabrics"] == [{"fabric": "ib0", "nodes": 1, "largest_free_block": 0}]
        assert doc["idle_replicas"] == [{"id": "r", "model": "m", "idle_seconds": 700, "gpus": 1}]
        assert set(doc) >= {"nodes", "replicas", "models", "unplaceable"}


class TestViews:
    """The node, replica and model views derived for the API."""

    def test_node_view_derives_free_and_classes(self) -> None:
        """gpu_free is healthy and unheld; classes come from the GPUs; used lists held cards."""
        state = fleet([node("a", 4, unhealthy=[3])], replicas=[replica("r", "m", [("a", (0, 3))])])
        v = node_view(state.nodes["a"], state, now=NOW, heartbeat_timeout_s=HB_TIMEOUT_S)
        assert (v.gpu_total, v.gpu_free, v.gpus_used, v.unhealthy, v.classes, v.state) == (
            4,
            2,
            (0, 3),
            (3,),
            ("H100-80G",),
            "ready",
        )

    def test_replica_view_unknown_idle_is_minus_one(self) -> None:
        """Unknown idleness is -1 in JSON; known idleness is whole seconds."""
        r = replica("r", "m", [("a", (0,))])
        assert replica_view(r, {}.get).idle_seconds == -1
        assert replica_view(r, {"r": 12.9}.get).idle_seconds == 12

    def test_model_view_counts_ready_and_not_stopped(self) -> None:
        """ready counts ready replicas; total counts every replica not stopped."""
        state = fleet(
            models=[spec("m", min_replicas=1, max_replicas=3)],
            replicas=[
                replica("a", "m", []),
                replica("b", "m", [], state="starting"),
                replica("c", "m", [], state="stopped"),
            ],
        )
        (v,) = model_views(state, {"m": "why"})
        assert (v.ready, v.total, v.min, v.max, v.desired, v.unplaceable_reason) == (
            1,
            2,
            1,
            3,
            1,
            "why",
        )
