"""ctl's pure rendering: durations, bars, unknown cells, truncation, the status screen."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.ctl import render, tables
from llmgw.wire.admin import (
    ClassUse,
    EventView,
    FabricUse,
    IdleReplica,
    ModelTotals,
    ModelView,
    NodeTotals,
    NodeView,
    ReplicaTotal,
    ReplicaView,
    ShardView,
    Summary,
    UnplaceableModel,
)
from llmgw.wire.models import ModelSpec
from llmgw.wire.usage import FlowQueued


def big_summary(*, nodes: int = 200, models: int = 500, seed: int = 7) -> Summary:
    """A 200-node, 500-model fleet with some of everything that needs attention."""
    rng = random.Random(seed)
    unplaceable = sorted(f"model-{i:03d}" for i in rng.sample(range(models), 23))
    idle = sorted(
        (
            IdleReplica(
                id=f"r-{i:04d}",
                model=f"model-{i % models:03d}",
                idle_seconds=rng.randint(600, 400_000),
                gpus=rng.choice([1, 2, 4, 8]),
            )
            for i in range(61)
        ),
        key=lambda r: -r.idle_seconds,
    )
    return Summary(
        nodes=NodeTotals(total=nodes, ready=nodes - 11, cordoned=4, draining=2, unreachable=5),
        gpus=[
            ClassUse(gpu_class="A100-80G", total=320, used=250, unhealthy=3),
            ClassUse(gpu_class="H100-80G", total=960, used=900, unhealthy=12),
            ClassUse(gpu_class="H200-141G", total=256, used=256, unhealthy=0),
            ClassUse(gpu_class="L40S", total=64, used=10, unhealthy=0),
        ],
        fabrics=[FabricUse(fabric=f"ib{i}", nodes=20, largest_free_block=i % 3) for i in range(10)],
        replicas=ReplicaTotal(ready=610, starting=14, draining=3, failed=2),
        models=ModelTotals(total=models, satisfied=models - 40, short=40),
        unplaceable=unplaceable,
        idle_replicas=idle,
        unplaceable_reasons=[
            UnplaceableModel(
                model=name,
                reason="needs 2 whole H100-80G nodes on one fabric; ib0 has 1, ib1 has 0",
            )
            for name in unplaceable
        ],
    )


class TestDuration:
    """Durations rounded down to their largest whole unit."""

    @pytest.mark.parametrize(
        ("expected", "seconds"),
        [
            ("0s", 0),
            ("45s", 45),
            ("59s", 59.9),
            ("1m", 60),
            ("3m", 200),
            ("59m", 3599),
            ("1h", 3600),
            ("2h", 7300),
            ("23h", 86399),
            ("1d", 86400),
            ("3d", 3 * 86400 + 5),
        ],
    )
    def test_largest_whole_unit_rounded_down(self, expected: str, seconds: float) -> None:
        """A duration reads in its largest whole unit, rounded down."""
        assert expected == render.fmt_duration(seconds)

    def test_just_under_ten_minutes_is_not_ten(self) -> None:
        """9m59s reads 9m, never 10m next to the eviction threshold."""
        assert render.fmt_duration(599) == "9m"


class TestUnknownCells:
    """Unknown values render as a dash, never as zero."""

    def test_negative_idle_is_a_dash(self) -> None:
        """The JSON's negative idle (no router reported it) shows as '-'."""
        assert render.idle_cell(-1) == "-"

    def test_zero_idle_is_zero_seconds(self) -> None:
        """A replica used this very second is '0s', distinct from unknown."""
        assert render.idle_cell(0) == "0s"

    def test_never_heartbeated_is_a_dash(self) -> None:
        """A node with no heartbeat has '-' as its age."""
        assert render.age_cell(None, now=100.0) == "-"

    def test_age_from_now(self) -> None:
        """An age is now minus the timestamp."""
        assert render.age_cell(1000.0, now=1130.0) == "2m"


class TestTruncation:
    """Cut lists say how much was left out."""

    def test_take_counts_what_was_left_out(self) -> None:
        """take returns the first items and the number hidden."""
        assert render.take([1, 2, 3, 4, 5], 2) == ([1, 2], 3)

    def test_nothing_hidden_means_no_line(self) -> None:
        """No '…and N more' when the list fits."""
        assert render.more_line(0) == ""

    def test_more_line_with_detail(self) -> None:
        """The cut line says how many and what they hold."""
        assert render.more_line(1234, "96 GPUs") == "…and 1,234 more (96 GPUs)"


class TestBar:
    """The card bar's cells for used, free and unhealthy cards."""

    def test_cells_sum_to_width(self) -> None:
        """Used, free and unhealthy cells fill the bar exactly."""
        assert sum(render.bar_cells(1600, 1100, 16, 30)) == 30

    def test_one_unhealthy_card_still_shows(self) -> None:
        """A single unhealthy card in 1,600 gets a cell of its own."""
        unhealthy = render.bar_cells(1600, 800, 1, 30)[2]
        assert unhealthy == 1

    def test_unhealthy_is_never_free(self) -> None:
        """A class whose only spare cards are unhealthy shows no free cells."""
        assert render.bar_cells(64, 60, 4, 30) == (28, 0, 2)

    def test_full_class_has_no_free_cell(self) -> None:
        """All cards used: the whole bar is used."""
        assert render.bar_cells(256, 256, 0, 30) == (30, 0, 0)

    def test_bar_draws_unhealthy_apart_at_the_end(self) -> None:
        """The bar reads used, then free, then the unhealthy glyph."""
        text = render.usage_bar(10, 5, 2, width=10).plain
        assert text == "█████░░░××"

    def test_empty_class_is_blank_not_free(self) -> None:
        """A class with no cards draws nothing rather than free space."""
        assert render.usage_bar(0, 0, 0, width=10).plain == " " * 10

    @given(
        total=st.integers(0, 5000),
        used_frac=st.floats(0, 1),
        bad_frac=st.floats(0, 1),
        width=st.integers(3, 80),
    )
    def test_bar_invariants(
        self, total: int, used_frac: float, bad_frac: float, width: int
    ) -> None:
        """Cells always fill the width and every non-zero part is visible."""
        used = int(total * used_frac)
        unhealthy = int((total - used) * bad_frac)
        cells = render.bar_cells(total, used, unhealthy, width)
        assert width == sum(cells)
        free = total - used - unhealthy
        for part, cell in zip((used, free, unhealthy), cells, strict=True):
            assert (part > 0) <= (cell > 0)


class TestStatusScreen:
    """The status screen fits one screen and keeps what matters."""

    def test_fits_one_screen_at_200_nodes_and_500_models(self) -> None:
        """The status screen for 200 nodes and 500 models is at most ~50 lines."""
        text = render.to_text(render.status_view(big_summary(), title="llmgw fleet"))
        assert len(text.splitlines()) <= 52

    def test_lists_are_cut_with_and_n_more(self) -> None:
        """Long lists (unplaceable, idle, fabrics) end with '…and N more'."""
        text = render.to_text(render.status_view(big_summary()))
        assert "…and 15 more" in text  # 23 unplaceable, 8 shown
        assert "…and 53 more" in text  # 61 idle, 8 shown
        assert "…and 2 more (40 nodes)" in text  # 10 fabrics, 8 shown

    def test_unhealthy_shown_apart_from_free(self) -> None:
        """A class line gives used, free and unhealthy as separate numbers."""
        s = Summary(gpus=[ClassUse(gpu_class="H100-80G", total=16, used=8, unhealthy=2)])
        line = next(ln for ln in render.to_text(render.status_view(s)).splitlines() if "H100" in ln)
        assert line.split()[-4:] == ["8", "6", "2", "16"]
        assert "××" in line

    def test_unplaceable_models_carry_the_reason(self) -> None:
        """Each unplaceable model is listed with the controller's reason."""
        s = Summary(
            unplaceable=["big"],
            unplaceable_reasons=[UnplaceableModel(model="big", reason="needs 2 whole nodes")],
        )
        text = render.to_text(render.status_view(s))
        assert "big" in text
        assert "needs 2 whole nodes" in text

    def test_reason_from_elsewhere_fills_a_gap(self) -> None:
        """Reasons passed in (from the models list) fill names the summary gives no reason for."""
        s = Summary(unplaceable=["big"])
        text = render.to_text(render.status_view(s, reasons={"big": "no L40S node"}))
        assert "no L40S node" in text

    def test_idle_replicas_show_time_and_gpus(self) -> None:
        """Idle replicas read with their idle time and GPU count."""
        s = Summary(idle_replicas=[IdleReplica(id="r-1", model="m", idle_seconds=7300, gpus=4)])
        row = next(ln for ln in render.to_text(render.status_view(s)).splitlines() if "r-1" in ln)
        assert row.split() == ["r-1", "m", "2h", "4"]

    def test_flow_queue_shown_by_band_and_team_only_when_non_zero(self) -> None:
        """Requests the routers queue at capacity appear by band and team, and not at all
        when there are none."""
        assert "Queued at capacity" not in render.to_text(render.status_view(Summary()))
        s = Summary(
            flow_queued=[
                FlowQueued(band="critical", team="ops", requests=2),
                FlowQueued(band="batch", team="", requests=40),
            ]
        )
        lines = render.to_text(render.status_view(s)).splitlines()
        head = next(i for i, ln in enumerate(lines) if "Queued at capacity" in ln)
        assert "42 requests" in lines[head]
        assert lines[head + 1].split() == ["critical", "ops", "2", "req"]
        assert lines[head + 2].split() == ["batch", "(no", "key)", "40", "req"]

    def test_node_totals_by_state(self) -> None:
        """The nodes line counts every state."""
        s = Summary(nodes=NodeTotals(total=7, ready=3, cordoned=1, draining=1, unreachable=2))
        text = render.to_text(render.status_view(s))
        assert "7 total · 3 ready · 1 cordoned · 1 draining · 2 unreachable" in text

    @pytest.mark.parametrize("width", [80, 100, 140])
    def test_long_reasons_end_in_an_ellipsis_within_the_width(self, width: int) -> None:
        """A reason too long for the line is cut with '…', never past the width."""
        reason = "needs 2 free L40S GPUs on one ready node; " * 4
        s = Summary(
            unplaceable=["team10/model-123"],
            unplaceable_reasons=[UnplaceableModel(model="team10/model-123", reason=reason)],
        )
        lines = render.to_text(render.status_view(s), width=width).splitlines()
        row = next(ln for ln in lines if "team10/model-123" in ln)
        assert row.endswith("…")
        assert max(len(ln) for ln in lines) <= width

    def test_no_ansi_in_text(self) -> None:
        """to_text is plain text, fit for the README."""
        assert "\x1b" not in render.to_text(render.status_view(big_summary()))


def replica(rid: str, idle_seconds: int) -> ReplicaView:
    return ReplicaView(
        id=rid,
        model="m",
        state="ready",
        reason=None,
        shards=(ShardView(node="n1", rank=0, gpus=(0, 1), port=21000, state="ready"),),
        endpoint_url="http://n1:21000",
        created_at=0.0,
        updated_at=0.0,
        restarts=0,
        idle_seconds=idle_seconds,
        pool="ib0/H100-80G",
        weight=1.0,
    )


class TestTables:
    """Tables keep ids and figures whole, even in a narrow terminal."""

    def test_a_sleeper_still_falling_asleep_says_so(self) -> None:
        """A sleeping replica whose shard is still ready reads 'falling asleep'; asleep, not."""
        r = msgspec.structs.replace(replica("r-1", 5), state="sleeping", endpoint_url=None)
        asleep = msgspec.structs.replace(
            replica("r-2", 5),
            state="sleeping",
            shards=(ShardView(node="n1", rank=0, gpus=(2,), port=21001, state="sleeping"),),
        )
        lines = render.to_text(tables.replicas_table([r, asleep]), width=160).splitlines()
        assert "sleeping (falling asleep)" in next(ln for ln in lines if "r-1" in ln)
        assert "falling" not in next(ln for ln in lines if "r-2" in ln)

    def test_unknown_idle_is_a_dash_never_zero(self) -> None:
        """A replica no router reported shows '-' in the IDLE column."""
        text = render.to_text(tables.replicas_table([replica("r-1", -1), replica("r-2", 180)]))
        r1 = next(ln for ln in text.splitlines() if "r-1" in ln).split()
        r2 = next(ln for ln in text.splitlines() if "r-2" in ln).split()
        assert r1[5] == "-"
        assert r2[5] == "3m"

    def test_replica_ids_are_never_cut_in_a_narrow_terminal(self) -> None:
        """Ids stay whole at 80 columns, so they can be pasted into `ctl bench`."""
        long = [
            msgspec.structs.replace(
                replica(f"r-0cf7f9{i:04d}", 60),
                model="qwen2.5-72b-instruct-with-a-long-name",
                endpoint_url="http://gpu-node-with-a-long-name.example:21000",
            )
            for i in range(3)
        ]
        text = render.to_text(tables.replicas_table(long), width=80)
        for r in long:
            assert r.id in text

    @pytest.mark.parametrize("width", [80, 100, 120])
    def test_idle_and_state_survive_a_narrow_terminal(self, width: int) -> None:
        """Wide shard and endpoint cells give way: STATE, IDLE, WEIGHT, RESTARTS stay readable."""
        shards = tuple(
            ShardView(node=f"h100-b-{k}", rank=k, gpus=tuple(range(8)), port=21000, state="ready")
            for k in range(2)
        )
        wide = [
            msgspec.structs.replace(
                replica(f"r-2b876d025{i}", idle),
                model="llama-3.1-405b-instruct",
                shards=shards,
                endpoint_url="http://gpu-node-with-a-long-name.example:21000",
            )
            for i, idle in enumerate((-1, 180))
        ]
        lines = render.to_text(tables.replicas_table(wide), width=width).splitlines()
        rows = [ln for ln in lines if ln.startswith("r-")]  # a second shard wraps below
        assert lines[0].split()[-3:] == ["IDLE", "WEIGHT", "RESTARTS"]
        assert "STATE" in lines[0]
        assert [ln.split()[-3:] for ln in rows] == [["-", "1.00", "0"], ["3m", "1.00", "0"]]
        assert all(" ready " in ln for ln in rows)
        assert all(len(ln) <= width for ln in lines)

    def test_node_figures_survive_a_narrow_terminal(self) -> None:
        """Long node names at 80 columns: state, GPU counts and heartbeat age stay whole."""
        node = NodeView(
            name="gpu-node-rack12-slot00.example", address="x", state="unreachable",
            fabrics=("ib0-spine-a",), labels={}, gpus=(), gpus_used=(), last_heartbeat=1000.0,
            classes=("H100-80G", "L40S-48G"), gpu_total=8, gpu_free=2, unhealthy=(1,),
        )  # fmt: skip
        nodes = [node, msgspec.structs.replace(node, name="gpu-node-rack12-slot01.example")]
        lines = render.to_text(tables.nodes_table(nodes, now=4600.0), width=80).splitlines()
        assert lines[1].split()[:2] == ["gpu-node-rack12-slot00.example", "unreachable"]
        assert lines[1].split()[-5:] == ["5/8", "2", "1", "1h", "ago"]
        assert all(len(ln) <= 80 for ln in lines)

    def test_shards_cell_lists_node_and_gpus(self) -> None:
        """The shards cell reads node:gpus."""
        assert tables.shards_cell(replica("r", 0)) == "n1:0,1"

    def test_node_never_heartbeated(self) -> None:
        """A node that never heartbeated shows '-' as its heartbeat age."""
        node = NodeView(
            name="gpu-01", address="10.0.0.1", state="unreachable", fabrics=("ib0",), labels={},
            gpus=(), gpus_used=(), last_heartbeat=None, classes=("H100-80G",), gpu_total=8,
            gpu_free=6, unhealthy=(3,),
        )  # fmt: skip
        row = render.to_text(tables.nodes_table([node], now=0.0)).splitlines()[1].split()
        assert row == ["gpu-01", "unreachable", "H100-80G", "1/8", "6", "1", "ib0", "-"]

    def test_unplaceable_model_shows_reason(self) -> None:
        """A model the controller cannot place shows why."""
        spec = ModelSpec(name="big", engine="sim", gpu_classes=("H100-80G",), nodes=2)
        view = ModelView(
            spec=spec, name="big", ready=0, total=0, min=1, max=1, desired=1,
            unplaceable_reason="needs 2 whole nodes",
        )  # fmt: skip
        text = render.to_text(tables.models_table([view]), width=160)
        assert "unplaceable: needs 2 whole nodes" in text
        assert "2x1" in text

    def test_events_table(self) -> None:
        """Events list kind, subject and message."""
        ev = EventView(
            id=1, at=0.0, kind="replica.failed", subject="replica", subject_id="r-1", model="m",
            message="engine exited 1",
        )  # fmt: skip
        text = render.to_text(tables.events_table([ev]), width=160)
        assert "replica.failed" in text
        assert "replica r-1" in text
        assert "engine exited 1" in text
