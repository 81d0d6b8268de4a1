"""Secondary indices over FleetState's replicas, kept in step with every change.

The tick, the heartbeat and the endpoint list each ask "which replicas of this
model / on this node / in this state"; answering by scanning every replica
would make each of them cost O(fleet) even when nothing changed. The index is
updated per changed replica (`put`), so its upkeep costs O(changes).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TypeVar

from llmgw.controller.fleet.records import FleetState, Replica
from llmgw.wire.admin import ReplicaState


@dataclass(slots=True)
class FleetIndex:
    by_model: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    by_node: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    by_state: defaultdict[ReplicaState, set[str]] = field(default_factory=lambda: defaultdict(set))

    @classmethod
    def build(cls, state: FleetState) -> FleetIndex:
        idx = cls()
        for r in state.replicas.values():
            idx.put(None, r)
        return idx

    def put(self, old: Replica | None, new: Replica | None) -> None:
        """Move one replica's entries from `old` to `new` (None: absent before/after)."""
        if old is not None:
            self._drop(old)
        if new is not None:
            self.by_model[new.model].add(new.id)
            self.by_state[new.state].add(new.id)
            for s in new.shards:
                self.by_node[s.node].add(new.id)

    def _drop(self, r: Replica) -> None:
        _discard(self.by_model, r.model, r.id)
        _discard(self.by_state, r.state, r.id)
        for s in r.shards:
            _discard(self.by_node, s.node, r.id)

    def of_model(self, model: str) -> set[str]:
        return self.by_model.get(model) or set()

    def on_node(self, node: str) -> set[str]:
        return self.by_node.get(node) or set()

    def in_state(self, state: ReplicaState) -> set[str]:
        return self.by_state.get(state) or set()


K = TypeVar("K")


def _discard(d: defaultdict[K, set[str]], key: K, rid: str) -> None:
    ids = d.get(key)
    if ids is not None:
        ids.discard(rid)
        if not ids:
            del d[key]
