"""The endpoint list (controller → router, docs/architecture.md) and static endpoints."""

from __future__ import annotations

from typing import Literal

import msgspec

from llmgw.wire.keys import ClientKey

# What the controller is doing for a model that has no ready replica.
#   starting     a replica is placed and its engine is starting: hold the request
#   making_room  replicas of other models are being evicted for it: hold the request
#   cannot_place no placement fits and nothing can be evicted for it, or its
#                max_replicas is 0: refuse at once
#   waking       a sleeping replica of it is waking (or its cards are being freed
#                for that): hold the request; retry_after_s is the expected wake
OutlookState = Literal["starting", "making_room", "cannot_place", "waking"]


class ModelOutlook(msgspec.Struct, frozen=True, kw_only=True):
    """A model without a ready replica, and what the controller is doing about it."""

    # Served names (the model's name, then its aliases).
    models: tuple[str, ...]
    state: OutlookState
    # For people: "needs 4×H100-80G on one node; largest free block 0; nothing can be
    # evicted for it now". Empty when there is nothing to say.
    reason: str = ""
    # cannot_place: when to try again (when an eviction could make room, else the
    # controller's default); starting: how long its starts usually take (the median
    # of recent ones). None when unknown. Rounded up (10 s, then whole minutes) so
    # the outlook does not change every tick.
    retry_after_s: float | None = None


class EndpointInfo(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """A replica's static description, as the router's registry keeps it.

    Encoded without its default fields, so a list whose engines have no key
    (`api_key` "") reads the same as before the field existed.
    """

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
    # The engine's own key (the agent starts each replica with a fresh one); the
    # router sends it as `Authorization: Bearer`. "": the engine needs none.
    # Secret: repr() masks it, and nothing prints or exports it.
    api_key: str = ""
    # Precise mode (docs/routing.md): the ZeroMQ address of the engine's KV-event
    # publisher (vLLM's --kv-events-config endpoint, e.g. tcp://gpu-a-01:5557);
    # "": the router guesses what the engine caches from what it sent there.
    kv_events: str = ""
    # The publisher's topic (vLLM's default is "").
    kv_events_topic: str = ""
    # The publisher's replay socket (vLLM's replay_endpoint), to fetch missed
    # batches after a gap; "": none, a gap falls back to guessing until the set is
    # known again.
    kv_events_replay: str = ""
    # How the router tokenizes prompts for precise mode: "sim" (the sim-engine's
    # tokenizer) or "hf:<path to tokenizer.json>" (needs the tokenizers package).
    tokenizer: str = ""
    # llama.cpp replicas serving LoRA adapters: the adapters in the order the engine
    # loaded them (a request selects one by its position, router/request/lora.py). Empty for
    # other engines, which take an adapter's name as the model.
    lora_ids: tuple[str, ...] = ()
    # The engine orders its waiting queue by each request's `priority` field (vLLM's
    # --scheduling-policy priority): the router writes the request's band there
    # (docs/tenants.md, "Engine priority"). False: it sends none.
    priority_scheduling: bool = False

    def __repr__(self) -> str:
        key = "'***'" if self.api_key else "''"
        return (
            f"EndpointInfo(id={self.id!r}, url={self.url!r}, models={self.models!r}, "
            f"engine={self.engine!r}, pool={self.pool!r}, weight={self.weight!r}, "
            f"priority={self.priority!r}, api_key={key}, kv_events={self.kv_events!r}, "
            f"kv_events_topic={self.kv_events_topic!r}, "
            f"kv_events_replay={self.kv_events_replay!r}, tokenizer={self.tokenizer!r}, "
            f"lora_ids={self.lora_ids!r}, priority_scheduling={self.priority_scheduling!r})"
        )


class EndpointList(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of `GET /v1/endpoints?after=VERSION` (long-poll).

    Routers read it entry by entry (router/control/listread.py): what a newer
    controller adds to an endpoint or an outlook is ignored or left out, and a key with
    a field or value they do not know is refused, never served with fewer limits.
    """

    # Strictly increasing while one controller's store lives; a router that sees a
    # smaller version than it holds takes the list anyway (the store was replaced).
    version: int
    endpoints: tuple[EndpointInfo, ...]
    # Every model the controller knows (names and aliases), including those with no
    # ready replica: the router holds requests for these instead of answering 404
    # (scale from zero, docs/router.md).
    models: tuple[str, ...] = ()
    # Models with no ready replica that the controller is acting on (or cannot).
    # A model absent here and from `endpoints` is idle at zero: held, which asks
    # the controller to place it.
    outlook: tuple[ModelOutlook, ...] = ()
    # The client keys in force, by name: hashes and limits, never a key (docs/tenants.md).
    keys: tuple[ClientKey, ...] = ()
    # True once the controller has held any key, revoked ones included: routers then
    # refuse /v1/* requests without one of `keys`, even when none is left in force.
    keys_required: bool = False
