"""What the workers of one router (`--workers N`) share in memory: in-flight counts,
flow control's claims and critical reserves, and the limited keys' buckets.

A table of int32 cells, one row per worker and one column (a *slot*) per
endpoint, in a memory file the supervisor creates and every worker maps. A
row has four quarters: requests in flight, then those of them still awaiting
their first token (`pending`, endpoint.py), then the worker's flow-control
*claim* on the endpoint (the strongest request it holds for a model the endpoint
serves, flowgate.py; 0: none), then when a critical request of the worker last
needed the critical reserve of a model the endpoint serves (whole seconds of the
host's monotonic clock, plus one; 0: never). After them, `TENANT_BUCKETS` cells of
the worker's flow-control requests queued per tenant cell (flowpeers.py). A worker
writes only its own row —
its own counts for an endpoint, after each acquire, first token and release —
and reads an endpoint's host-wide count as the sum of its column. One writer
per cell means no lock and no lost update; a reader may see a count one
request old, which the scheduler tolerates anyway (the engine's own figures
are a scrape old).

Slots are handed out by the supervisor (`SlotTable`), which sends the map with
every endpoint list, so all workers agree on which column is which endpoint.
A freed slot is reused last (oldest freed first): a worker may still hold a
departed endpoint's request when its slot is given to a new one, and that
worker stops writing the slot at once (`Registry.replace`).

After the table, from the next page on, the limited keys' rows (keytable.py).
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections import deque
from collections.abc import Iterable

from llmgw.router.workers.keytable import KeyTable, table_bytes

# Endpoints one router can count across workers; beyond it an endpoint is
# counted per worker only (a warning says so).
DEFAULT_CAPACITY = 4096
# Cells per worker for flow control's queued counts by (model, band, tenant).
TENANT_BUCKETS = 1024
_CELL = 4  # bytes per int32 cell


class SharedInflight:
    """The in-flight table as one worker (or the supervisor) sees it."""

    def __init__(self, fd: int, *, workers: int, index: int, capacity: int = DEFAULT_CAPACITY):
        if not 0 <= index < max(1, workers):
            raise ValueError(f"worker index {index} outside 0..{workers - 1}")
        self.fd = fd
        self.workers = workers
        self.capacity = capacity
        self.index = index
        self._map = mmap.mmap(fd, _size(workers, capacity))
        self._cells = memoryview(self._map).cast("i")
        # This worker's row: the only cells it ever writes. Cell `slot` is its
        # requests in flight to that endpoint, cell `capacity + slot` those of them
        # awaiting their first token, cell `2 * capacity + slot` its claim, cell
        # `3 * capacity + slot` its critical reserve's stamp, cell `4 * capacity + b`
        # its requests queued in tenant cell b.
        self._width = 4 * capacity + TENANT_BUCKETS
        self.row = self._cells[index * self._width : (index + 1) * self._width]
        # Endpoint id → slot, as last sent by the supervisor.
        self.slots: dict[str, int] = {}
        # The limited keys' buckets, every worker's (keytable.py).
        self.keys = KeyTable(fd, offset=_keys_at(workers, capacity))

    @classmethod
    def create(cls, workers: int, capacity: int = DEFAULT_CAPACITY) -> SharedInflight:
        """The supervisor's table: a fresh zeroed memory file its workers inherit."""
        size = _keys_at(workers, capacity) + table_bytes()
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("llmgw-router-inflight", 0)
        else:  # pragma: no cover - not Linux
            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
        os.ftruncate(fd, size)
        return cls(fd, workers=workers, index=0, capacity=capacity)

    def total(self, slot: int) -> int:
        """An endpoint's requests in flight across all workers."""
        return sum(self._cells[slot :: self._width])

    def pending_total(self, slot: int) -> int:
        """An endpoint's requests awaiting their first token, across all workers."""
        return sum(self._cells[self.capacity + slot :: self._width])

    def claim_elsewhere(self, slot: int) -> int:
        """The strongest claim of the other workers on an endpoint (0: none)."""
        return self._most_elsewhere(2 * self.capacity + slot)

    def reserved_elsewhere(self, slot: int) -> int:
        """The latest stamp of another worker's critical reserve on an endpoint (0: none)."""
        return self._most_elsewhere(3 * self.capacity + slot)

    def _most_elsewhere(self, cell: int) -> int:
        """The largest value of row cell `cell` over the other workers' rows (0: none)."""
        best = 0
        for i, value in enumerate(self._cells[cell :: self._width]):
            if i != self.index and value > best:
                best = value
        return best

    def count_queued(self, cell: int, n: int) -> None:
        """This worker's requests queued in tenant cell `cell` (flowpeers.py)."""
        self.row[4 * self.capacity + cell] = n

    def queued_total(self, cell: int) -> int:
        """The requests queued in tenant cell `cell`, over every worker."""
        return sum(self._cells[4 * self.capacity + cell :: self._width])

    def clear_row(self, index: int) -> None:
        """Zero a dead worker's row: its requests died with it (the supervisor's call)."""
        start = index * self._width
        self._cells[start : start + self._width] = memoryview(bytes(self._width * _CELL)).cast("i")


def _size(workers: int, capacity: int) -> int:
    return workers * (4 * capacity + TENANT_BUCKETS) * _CELL


def _keys_at(workers: int, capacity: int) -> int:
    """Where the key rows start: the table's end, rounded up to a page (mmap's offset)."""
    page = mmap.ALLOCATIONGRANULARITY
    return -(-_size(workers, capacity) // page) * page


class SlotTable:
    """The supervisor's endpoint → slot assignment; ids that stay keep their slot."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self.slots: dict[str, int] = {}
        self._next = 0
        self._freed: deque[int] = deque()

    def assign(self, ids: Iterable[str]) -> dict[str, int]:
        """The map for a new endpoint list; returns a copy to send to the workers."""
        wanted = list(dict.fromkeys(ids))
        keep = set(wanted)
        for eid in [e for e in self.slots if e not in keep]:
            self._freed.append(self.slots.pop(eid))
        for eid in wanted:
            if eid in self.slots:
                continue
            if self._next < self.capacity:
                self.slots[eid] = self._next
                self._next += 1
            elif self._freed:
                self.slots[eid] = self._freed.popleft()
        return dict(self.slots)

    def unslotted(self, ids: Iterable[str]) -> list[str]:
        return [e for e in ids if e not in self.slots]
