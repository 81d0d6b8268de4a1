"""What every decision of one tick reads and writes, as one value.

A tick's decisions (tick/plan.py, tick/per_model.py, placement/requests.py)
all work on the same five things: the batch of changes being built over the
state the tick started from, the replica index over that state, what the
routers report (usage), what the loop remembers between ticks (memory), and
the configuration. They pass this one object instead of the five values, with
a view over the batch that placement reads for every model it cannot place
(placement/tickview.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.controller.config import ControllerConfig
from llmgw.controller.fleet.batch import Batch
from llmgw.controller.fleet.index import FleetIndex
from llmgw.controller.idle import IdleTracker
from llmgw.controller.placement.tickview import TickView
from llmgw.controller.tick.carryover import TickMemory


@dataclass(frozen=True, slots=True)
class TickContext:
    # The tick's changes over the state it started from; reads see earlier writes.
    batch: Batch
    # Replicas by model / node / state, over the state the tick started from.
    index: FleetIndex
    usage: IdleTracker
    # This tick's working copy of the memory (the loop adopts it once the plan is stored).
    memory: TickMemory
    config: ControllerConfig
    # What placement reads for every model it cannot place, kept once per tick.
    view: TickView

    @property
    def now(self) -> float:
        return self.batch.now
