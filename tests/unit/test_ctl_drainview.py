"""What a drain waits for, in words: the drain's live view, its piped lines, status, nodes."""

from __future__ import annotations

from pathlib import Path

import msgspec

from llmgw.ctl import drainview, render, tables
from llmgw.runtime.clock import ManualClock
from llmgw.wire.admin import DrainWait, NodeView
from tests.unit.test_ctl_commands import FakeController, run_ctl

BLOCKED = DrainWait(
    replica="r-1", model="big", reason="no replacement fits: needs 8xH100-80G", blocked=True
)
STARTING = DrainWait(replica="r-2", model="m", reason="its replacement is starting", blocked=False)


def node(name: str, state: str = "ready", waits: tuple[DrainWait, ...] = ()) -> NodeView:
    return NodeView(
        name=name, address="127.0.0.1", state=state, fabrics=("ib0",), labels={}, gpus=(),
        gpus_used=(), last_heartbeat=100.0, classes=("H100-80G",), gpu_total=8, gpu_free=0,
        unhealthy=(), drain_waiting=waits,
    )  # fmt: skip


class TestWords:
    """What a drain waits for, said in the live view, piped lines, status and nodes."""

    def test_blocked_says_so(self) -> None:
        """A blocked wait reads `blocked:` before the reason; a passing one does not."""
        assert drainview.wait_text(BLOCKED) == (
            "r-1 (big): blocked: no replacement fits: needs 8xH100-80G"
        )
        assert drainview.wait_text(STARTING) == "r-2 (m): its replacement is starting"

    def test_lines_only_on_change_then_moved(self) -> None:
        """A piped drain prints each reason once, a new reason again, and `moved` once."""
        lines, seen = drainview.change_lines({}, [BLOCKED, STARTING], ["r-1", "r-2"])
        assert lines == [drainview.wait_text(BLOCKED), drainview.wait_text(STARTING)]
        lines, seen = drainview.change_lines(seen, [BLOCKED, STARTING], ["r-1", "r-2"])
        assert lines == []
        ready = msgspec.structs.replace(STARTING, reason="in-flight requests finishing")
        lines, seen = drainview.change_lines(seen, [BLOCKED, ready], ["r-1", "r-2"])
        assert lines == ["r-2 (m): in-flight requests finishing"]
        lines, seen = drainview.change_lines(seen, [BLOCKED], ["r-1"])
        assert lines == ["r-2: moved"]
        lines, _ = drainview.change_lines(seen, [BLOCKED], ["r-1"])
        assert lines == []

    def test_live_screen_lists_every_replica_and_the_way_out(self) -> None:
        """The terminal view: progress, one line per replica, and the ways out named when
        blocked (--evict-idle, --force)."""
        text = render.to_text(
            drainview.drain_screen("h100-a-1", moved=1, total=3, waits=[BLOCKED], elapsed_s=12.4),
            width=120,
        )
        assert "draining h100-a-1: 1/3 replicas moved · 12s" in text
        assert "r-1 (big): blocked: no replacement fits: needs 8xH100-80G" in text
        assert "--force" in text
        assert "--evict-idle" in text
        calm = render.to_text(
            drainview.drain_screen("n", moved=0, total=1, waits=[STARTING], elapsed_s=0), width=120
        )
        assert "--force" not in calm

    def test_status_block_names_draining_nodes_and_blockers(self) -> None:
        """Only draining nodes, with counts and each wait; none draining: no block."""
        assert drainview.draining_block([node("a")]) is None
        block = drainview.draining_block(
            [node("a"), node("b", "draining", (BLOCKED, STARTING)), node("c", "draining")]
        )
        assert block is not None
        text = render.to_text(block, width=120)
        assert "Draining (2 nodes)" in text
        assert "b  2 replica(s) waited for, 1 blocked" in text
        assert "r-1 (big): blocked: no replacement fits" in text
        assert "c  replicas stopping" in text
        assert " a " not in text

    def test_nodes_table_has_the_column_only_while_a_node_drains(self) -> None:
        """WAITING FOR appears with a draining node and says what blocks it."""
        plain = render.to_text(tables.nodes_table([node("a")], now=100.0), width=200)
        assert "WAITING FOR" not in plain
        text = render.to_text(
            tables.nodes_table([node("a"), node("b", "draining", (BLOCKED,))], now=100.0),
            width=200,
        )
        assert "WAITING FOR" in text
        row = next(ln for ln in text.splitlines() if ln.startswith("b "))
        assert row.endswith("r-1 (big): blocked: no replacement fits: needs 8xH100-80G")


class TestDrainCommand:
    """The drain command's piped lines and timeout message."""

    def test_piped_drain_prints_what_it_waits_for(self, tmp_path: Path) -> None:
        """Piped, each replica's wait is a line (once), then the drained line."""
        fake = FakeController()
        fake.drain_progress = True
        fake.drain_waiting = (BLOCKED,)
        run = run_ctl(["drain", "gpu-01", "--timeout", "60"], fake, tmp_path)
        assert run.code == 0, run.err
        assert run.out.splitlines() == [
            "r-1 (big): blocked: no replacement fits: needs 8xH100-80G",
            "node gpu-01 drained (1 replica(s) moved)",
        ]

    def test_timeout_names_every_blocked_replica(self, tmp_path: Path) -> None:
        """--timeout ends with exit 1 and each blocked replica's reason."""
        fake = FakeController()
        other = msgspec.structs.replace(BLOCKED, replica="r-2", reason="needs 2 nodes")
        fake.drain_waiting = (BLOCKED, other)
        run = run_ctl(["drain", "gpu-01", "--timeout", "1"], fake, tmp_path, clock=ManualClock())
        assert run.code == 1
        assert "r-1 (big): no replacement fits: needs 8xH100-80G; r-2 (big): needs 2 nodes" in (
            run.err
        )
