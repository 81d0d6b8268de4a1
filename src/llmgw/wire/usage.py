"""Usage report (router → controller), once a tick (docs/architecture.md).

A map per tick, never a message per request: it costs the same on four replicas
as on four hundred.
"""

from __future__ import annotations

from typing import Annotated

import msgspec


class ModelLoad(msgspec.Struct, frozen=True, kw_only=True):
    """What one router saw of one model during the last report interval."""

    # Requests in flight to this model's replicas at report time.
    inflight: int = 0
    # Requests held because no replica was available, at report time.
    held: int = 0
    # Requests started during the interval, and the interval's length.
    requests: int = 0
    interval_s: float = 0.0


class UsageReport(msgspec.Struct, frozen=True, kw_only=True):
    """Body of `POST /v1/usage`."""

    # Stable for one router process; a restarted router gets a new one.
    router_id: Annotated[str, msgspec.Meta(min_length=1)]
    # Unix seconds when the router built this report.
    sent_at: float
    # Endpoint id → unix seconds of the last dispatch there. Endpoints never used
    # since this router started are ABSENT, never 0: unknown is not idle.
    last_used: dict[str, float] = {}
    # Endpoint id → requests in flight there now.
    inflight: dict[str, int] = {}
    # Model name → requests held now for lack of a replica (scale from zero).
    demand: dict[str, int] = {}
    # Model name → load during the last interval (autoscaling).
    load: dict[str, ModelLoad] = {}
