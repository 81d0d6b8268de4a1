"""What the reconcile loop remembers between ticks (reconcile.py). Not stored.

Everything the fleet needs to survive a restart is in the store; this is only
what makes the next tick smarter, and each field says what losing it costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.controller.placement import Unplaceable


@dataclass(frozen=True, slots=True)
class Reservation:
    """Room being made for a model: its victims drain, their cards are held for it."""

    # Replicas drained for it; while any still holds cards, it evicts no more.
    victims: frozenset[str]
    # (node, GPU indices) where it will land (the eviction plan's placement):
    # other models may not take these cards as they free up.
    gpus: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(slots=True)
class Memory:
    """Reconcile memory; a fresh one per leadership term."""

    # When this controller started leading. Silence is counted from here at the
    # earliest, so a restarted controller does not find every node "unreachable
    # for an hour" and fail the whole fleet on its first tick.
    leader_since: float
    # Model → last change of its desired count (restart: the cool-down starts over).
    last_scaled_at: dict[str, float] = field(default_factory=dict)
    # Nodes announced unreachable (restart: announced again if still silent).
    unreachable: set[str] = field(default_factory=set)
    # Model → why its last placement failed (restart: known again after one tick).
    unplaceable: dict[str, Unplaceable] = field(default_factory=dict)
    # Model → the room being made for it by eviction (restart: the room is not
    # held for it, and it may evict once more).
    evicting: dict[str, Reservation] = field(default_factory=dict)
    # Node → drain grace the operator asked for (restart: the default grace).
    drain_grace_s: dict[str, float] = field(default_factory=dict)
    # Draining nodes already announced empty.
    drained: set[str] = field(default_factory=set)

    def copy(self) -> Memory:
        return Memory(
            leader_since=self.leader_since,
            last_scaled_at=dict(self.last_scaled_at),
            unreachable=set(self.unreachable),
            unplaceable=dict(self.unplaceable),
            evicting=dict(self.evicting),
            drain_grace_s=dict(self.drain_grace_s),
            drained=set(self.drained),
        )
