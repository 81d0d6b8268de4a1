"""What the reconcile loop remembers between ticks (tick/plan.py).

Most of it is not stored: it only makes the next tick smarter, and each field
says what losing it costs. The exception is `evicting`, the working copy of
the stored reservations (FleetState.reservations): the tick writes whatever it
changed there through the store with its other changes, and a new leadership
term starts from what the store holds (Fleet.begin_term).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.controller.fleet.records import Reservation
from llmgw.controller.placement.rules import Unplaceable

__all__ = ["Reservation", "TickMemory"]


@dataclass(slots=True)
class TickMemory:
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
    # Model → the room being made for it by eviction. Stored (see the module
    # docstring): a restart neither frees the room nor evicts a second time.
    evicting: dict[str, Reservation] = field(default_factory=dict)
    # Replica → why its node's drain waits for it (no replacement fits), as last
    # announced (restart: announced once more).
    drain_waiting: dict[str, str] = field(default_factory=dict)
    # Draining nodes already announced empty.
    drained: set[str] = field(default_factory=set)
    # Unplaceable model → wall time at which enough replicas will have been idle
    # long enough to evict for it, if they stay unused (the outlook's "the first
    # candidate is idle enough in 7 min"); absent when waiting would not help
    # (restart: known again after one tick).
    idle_enough_at: dict[str, float] = field(default_factory=dict)
    # Model → when idle_enough_at was last worked out (it costs a few eviction
    # plans, so it is refreshed every ETA_REFRESH_S, not every tick).
    idle_eta_checked: dict[str, float] = field(default_factory=dict)
    # Model → when a compaction plan last found no moves for it (it costs about what
    # an eviction plan does, so it is tried again every COMPACT_RETRY_S, not every
    # tick; restart: tried at once).
    compaction_failed: dict[str, float] = field(default_factory=dict)

    def copy(self) -> TickMemory:
        return TickMemory(
            leader_since=self.leader_since,
            last_scaled_at=dict(self.last_scaled_at),
            unreachable=set(self.unreachable),
            unplaceable=dict(self.unplaceable),
            evicting=dict(self.evicting),
            drain_waiting=dict(self.drain_waiting),
            drained=set(self.drained),
            idle_enough_at=dict(self.idle_enough_at),
            idle_eta_checked=dict(self.idle_eta_checked),
            compaction_failed=dict(self.compaction_failed),
        )
