"""Why a replica must move: the one rule, used to decide a move and to explain it.

A replica moves (make-before-break: a replacement is placed, and the old one
drains once it is ready) when, in this order of precedence:

- one of its nodes is being drained by the operator, or
- one of its GPUs is reported unhealthy: these move every such replica at once;
- its model's spec changed since it was placed (`created_at < updated_at`):
  these roll over one replica at a time per model;
- placement moves it to make room for a model that fits nowhere else
  (placement/compaction.py): that depends on the whole fleet, not on the
  replica, so it is decided there; its reason is written here (`making_room`).

The reason's text goes into the stop/drain event of the replica and the
placement event of its replacement, so both say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.controller.fleet.batch import Batch
from llmgw.controller.fleet.records import Model, Replica


@dataclass(frozen=True, slots=True)
class Move:
    # "node a draining", "GPU 3 on a unhealthy", "model spec changed".
    reason: str
    # True: its node or a card is going away, so it moves now with every other
    # such replica; False: a spec rollover, one replica of the model at a time.
    at_once: bool


SPEC_CHANGED = Move("model spec changed", at_once=False)


def move_reason(batch: Batch, m: Model, r: Replica) -> Move | None:
    """Why `r` (a replica of `m`) must move, or None when it may stay where it is."""
    for s in r.shards:
        node = batch.node(s.node)
        if node is not None and node.operator_state == "draining":
            return Move(f"node {s.node} draining", at_once=True)
    for s in r.shards:
        node = batch.node(s.node)
        if node is None:
            continue
        for g in node.gpus:
            if not g.healthy and g.index in s.gpus:
                return Move(f"GPU {g.index} on {s.node} unhealthy", at_once=True)
    if r.created_at < m.updated_at:
        return SPEC_CHANGED
    return None


def making_room(model: str, why: str) -> Move:
    """The move compaction makes: `model` is unplaceable for `why` until it has moved."""
    return Move(f"to make room for {model}: {why}", at_once=True)
