"""Flow control across a router's workers (`--workers N`): what one worker's gate
(flowgate.py) tells the others, and reads of them, so their queues act as one.

Each worker queues the requests it accepted. Through the memory the workers share
(workers/shared.py, reached through the Registry: `Peers`) each publishes:

- its **claim** per model: how strongly its queue asks for a slot that frees up
  (`FlowQueue.claim`: the band of the request it would let go first, then how few
  requests that request's tenant has queued over all the workers, then how long the
  request has waited). A slot goes to the worker with the strongest claim, so a quiet
  tenant's request goes before a backlog wherever each waits, and a tenant's requests
  go in the order they came whichever worker holds them;
- its **queued count** per (model, band, tenant), hashed into `TENANT_BUCKETS` cells
  (the workers share one string-hash seed, so a key lands in the same cell in each;
  two keys in one cell count together, which only makes both look busier);
- when a critical request of it last needed a model's **critical reserve**, so every
  worker keeps the reserve one keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from llmgw.router.request.flow import FlowQueue
from llmgw.router.workers.shared import TENANT_BUCKETS


class Peers(Protocol):
    """The other workers of this router, through the memory they share (Registry)."""

    def claim(self, model: str, claims: Mapping[str, int]) -> None:
        """Publish this worker's claims (model → `FlowQueue.claim`) for `model`."""

    def claimed_elsewhere(self, model: str) -> int:
        """The strongest claim of another worker on `model`'s replicas (0: none)."""

    def reserve(self, model: str, stamp: int) -> None:
        """Publish when this worker's critical request last needed `model`'s reserve."""

    def reserved_elsewhere(self, model: str) -> int:
        """The latest such stamp of another worker for `model`'s replicas (0: none)."""

    def count_queued(self, bucket: int, n: int) -> None:
        """Publish this worker's requests queued in tenant cell `bucket`."""

    def queued_total(self, bucket: int) -> int:
        """The requests queued in tenant cell `bucket` over every worker."""


def bucket(model: str, band: str, tenant: str) -> int:
    """The tenant cell of (model, band, tenant)."""
    return hash((model, band, tenant)) % TENANT_BUCKETS


class SharedQueues:
    """One worker's side of the workers' common queue (module doc)."""

    def __init__(self, peers: Peers) -> None:
        self.peers = peers
        # Model → the claim last published.
        self._claims: dict[str, int] = {}
        # Model → the reserve stamp last published (`keep_reserve`).
        self._stamps: dict[str, int] = {}
        # Tenant cell → this worker's requests queued in it.
        self._counts: dict[int, int] = {}

    def counted(self, model: str, band: str, tenant: str, delta: int) -> None:
        """A request of (model, band, tenant) joined (+1) or left (-1) the queue here."""
        cell = bucket(model, band, tenant)
        n = self._counts.get(cell, 0) + delta
        if n > 0:
            self._counts[cell] = n
        else:
            self._counts.pop(cell, None)
            n = 0
        self.peers.count_queued(cell, n)

    def publish(self, model: str, queue: FlowQueue, now: float) -> None:
        """Tell the other workers `model`'s claim, when it changed."""
        peers = self.peers
        claim = queue.claim(
            now, lambda band, tenant: peers.queued_total(bucket(model, band, tenant))
        )
        if claim == self._claims.get(model, 0):
            return
        if claim:
            self._claims[model] = claim
        else:
            del self._claims[model]
        peers.claim(model, self._claims)

    def ours(self, model: str, queue: FlowQueue, now: float) -> bool:
        """Whether a slot for `model` goes to this worker's queue: no other worker claims
        it more strongly (the claim, which ages, published afresh first). Ties stay
        with the worker that saw the room."""
        self.publish(model, queue, now)
        return self._claims.get(model, 0) >= self.peers.claimed_elsewhere(model)

    def keep_reserve(self, model: str, now: float) -> None:
        """A critical request here needed `model`'s reserve at `now`: told to the other
        workers, once a second at most (a stamp is the second after the need)."""
        stamp = int(now) + 1
        if self._stamps.get(model) != stamp:
            self._stamps[model] = stamp
            self.peers.reserve(model, stamp)

    def reserved_elsewhere(self, model: str) -> int:
        return self.peers.reserved_elsewhere(model)
