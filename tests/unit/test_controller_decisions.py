"""Committed decisions: counted by a bounded reason, logged once each with the message."""

from __future__ import annotations

import logging

import pytest

from llmgw.controller.fleet.decisions import (
    Decisions,
    drain_reason,
    failure_reason,
    placement_reason,
)
from llmgw.controller.fleet.records import Event


def ev(kind: str, message: str) -> Event:
    return Event(
        id=1, at=0.0, kind=kind, subject="replica", subject_id="r-1", model="m", message=message
    )


class TestDecisionReasons:
    """Committed decisions are counted by a bounded reason and logged once each."""

    @pytest.mark.parametrize(
        ("message", "reason"),
        [
            ("placed on a-1 [0]", "new"),
            ("restart 2 of r-1 on a-1 [0]", "restart"),
            ("replacing r-1 (node a-1 drains) on a-2 [0]", "replacement"),
        ],
    )
    def test_placement_reasons(self, message: str, reason: str) -> None:
        """A placement message maps to its bounded reason."""
        assert placement_reason(message) == reason

    @pytest.mark.parametrize(
        ("message", "reason"),
        [
            ("still starting after 600s (deadline)", "deadline"),
            ("node a-1 unreachable for 40s", "node_unreachable"),
            ("rank 0 on a-1 exited with code 1: CUDA out of memory", "engine_exited"),
            ("rank 1 on a-2 stopped unexpectedly", "engine_exited"),
            ("something new", "other"),
        ],
    )
    def test_failure_reasons(self, message: str, reason: str) -> None:
        """A failure message maps to its bounded reason, unknown ones to "other"."""
        assert failure_reason(message) == reason

    def test_drain_reasons(self) -> None:
        """A drain message maps to its bounded reason."""
        assert drain_reason("evicted for big: idle 700s") == "eviction"
        assert drain_reason("replaced by r-9, which is ready") == "replaced"
        assert drain_reason("model m deleted") == "model_deleted"

    def test_each_event_logged_once_and_counted(self, caplog: pytest.LogCaptureFixture) -> None:
        """Each event logged once and counted."""
        d = Decisions()
        caplog.set_level(logging.INFO, logger="llmgw.controller.decisions")
        d.committed(
            [
                ev("replica.placed", "restart 1 of r-0 on a-1 [0]"),
                ev("replica.failed", "x (deadline)"),
            ]
        )
        assert d.placements.labels("restart")._value.get() == 1
        assert d.failures.labels("deadline")._value.get() == 1
        assert d.events.labels("replica.placed")._value.get() == 1
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2
        assert "kind=replica.placed" in lines[0]
        assert 'reason="restart 1 of r-0 on a-1 [0]"' in lines[0]
        assert "reason_class=deadline" in lines[1]
