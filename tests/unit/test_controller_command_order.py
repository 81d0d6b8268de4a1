"""Operator commands that race or come in conflicting orders: what they decide and say."""

from __future__ import annotations

from llmgw.controller.fleet import commands
from tests.unit.controller_reconcile_world import World, spec


class TestDeleteStory:
    """A deleted model's events say so before they say what became of its replicas."""

    def test_model_deleted_comes_first(self) -> None:
        """Read in id order, model.deleted precedes each replica's drain or stop."""
        w = World()
        w.node("a")
        w.model(spec("m", min_replicas=2, max_replicas=2))
        w.tick()
        w.ready_all("m")
        batch = commands.delete_model(w.state, w.index, "m", now=w.now, grace_s=5)
        kinds = [e.kind for e in batch.changes.events]
        assert kinds[0] == "model.deleted"
        assert len(kinds) == 3, kinds
        assert all(k.startswith("replica.") for k in kinds[1:]), kinds
        assert batch.changes.events[0].message == "deleted; 2 replica(s) drain"
