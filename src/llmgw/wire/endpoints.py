"""The endpoint list (controller → router, docs/architecture.md) and static endpoints."""

from __future__ import annotations

import msgspec


class EndpointInfo(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A replica's static description, as the router's registry keeps it."""

    # Uniquely identifies the replica and labels its metrics (controller: replica id).
    id: str
    # Engine root address, e.g. http://gpu-a-01:8000, no trailing slash.
    url: str
    # Served model names and aliases.
    models: tuple[str, ...]
    # Which metric names the engine exposes: "" or "vllm", "sglang", "llamacpp", "tgi".
    # The sim-engine speaks vLLM's names unless started with another dialect.
    engine: str = ""
    # "<fabric>/<gpu class>"; observability and pool preference only.
    pool: str = ""
    # Capacity weight measured by `ctl bench` (docs/ctl.md); 1.0 when never measured.
    weight: float = 1.0
    # Pool preference: higher is tried first.
    priority: int = 0


class EndpointList(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of `GET /v1/endpoints?after=VERSION` (long-poll)."""

    # Strictly increasing while one controller's store lives; a router that sees a
    # smaller version than it holds takes the list anyway (the store was replaced).
    version: int
    endpoints: tuple[EndpointInfo, ...]
    # Every model the controller knows (names and aliases), including those with no
    # ready replica: the router holds requests for these instead of answering 404
    # (scale from zero, docs/router.md).
    models: tuple[str, ...] = ()
