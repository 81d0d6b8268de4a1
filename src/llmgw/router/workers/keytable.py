"""What the workers of one router share of each limited client key: its RPM and TPM
buckets, its budget's spend and its leased budget allowance, one row per key
(request/tenants.py reads them).

Without it each worker kept its own buckets, so a key got N times its limits
through a router of N workers (docs/tenants.md). The rows live in the memory
file of the in-flight table (shared.py), after it, so they are the router's: a
worker that dies (even by SIGKILL) and is started again finds the counts as
they were.

A row is 20 float64 cells: the key (its sha256, 32 bytes), its budget period
(16 ASCII bytes), whether the row is empty, used or freed, the limits the row
was started for, then each bucket's level and when it was last refilled, the
budget spent, and the allowance of a budget the controller leases (`KeyRow.cut`).
A worker finds its key's row by open addressing from the key's hash, and claims
an empty or freed one; no message from the supervisor, so a worker never holds a
map older than the key lists it enforces. A key revoked is freed by the first
worker that forgets it; a worker that still enforces it sees another key (or
none) in the row and claims one again (`KeyRow.mine`).

Each bucket's read-refill-check-take spans several cells, so it runs under a
byte-range `fcntl.lockf` on the row (the workers are exec'd processes: no lock
object to inherit); claims and frees hold the table's header range too. A
record lock, unlike a spinlock in the shared memory, is released by the kernel
when its holder dies, so a worker killed inside a take cannot stall the others.
Locks are per process: two views in one process (the unit tests) do not
exclude each other.

The allowance is the router's, not a worker's: when each worker spent 1/N of it,
a client whose requests all reached one worker was refused at 1/N. It is leased
in the answer to a usage report and counts from when that report was built, so
the row keeps what is left, the tokens spent since the last report's cut, and
two report numbers (the supervisor numbers its reports): the first worker asked
for report k cuts the row (and alone says what is left, so the supervisor's sum
counts it once), and the first to take its answer sets the allowance to the
lease less the spend since the cut; the others find both done. A worker takes
answer k before it is asked for report k+1 (one channel, in order), so a row is
never cut for k+1 before answer k is in it; a row made later takes the last
answer from the worker that makes it. A worker asked after the first counts its
spend between the two asks twice (in its report's tokens and in the spend since
the cut): the allowance errs low, never above what the controller leased.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import mmap
import struct

# Limited keys one router shares across its workers; beyond it a key is counted
# per worker (a warning says so).
DEFAULT_KEY_CAPACITY = 16384
_ROW = 160  # bytes per row: 20 float64 cells
_CELLS = _ROW // 8
# Byte offsets and cell indexes within a row.
_DIGEST = slice(0, 32)
_PERIOD = slice(32, 48)
STATE, RPM_LIMIT, TPM_LIMIT, BUDGET_TOKENS, BUDGET_PER = 6, 7, 8, 9, 10
RPM_LEVEL, RPM_AT, TPM_LEVEL, TPM_AT, SPENT = 11, 12, 13, 14, 15
# The leased allowance left (NaN: none leased yet), the tokens spent since the last
# cut, the number of the report that cut last, and of the one whose answer it is.
LEFT, SINCE, CUT, LEASED = 16, 17, 18, 19
_EMPTY, _USED, _FREED = 0.0, 1.0, 2.0
# The row's limits: rpm, tpm, budget tokens, budget period (0 day, 1 week, 2 month);
# NaN where the key has none.
Limits = tuple[float, float, float, float]


def table_bytes(capacity: int = DEFAULT_KEY_CAPACITY) -> int:
    """The key table's size in the memory file: a header row (the claim lock), then rows."""
    return (capacity + 1) * _ROW


class KeyRow:
    """One key's row as one worker sees it: cells to read and write under `lock()`."""

    __slots__ = ("_fd", "_raw", "_start", "cells", "digest", "index")

    def __init__(self, fd: int, raw: memoryview, start: int, index: int, digest: bytes) -> None:
        self._fd = fd
        self._raw = raw
        # The row's first byte in the memory file (the lock's range).
        self._start = start
        self.index = index
        self.digest = digest
        self.cells = raw.cast("d")

    def lock(self) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_EX, _ROW, self._start)

    def unlock(self) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, _ROW, self._start)

    def mine(self) -> bool:
        """Whether the row still holds this key (under `lock()`): freed and claimed by
        another key meanwhile, it must be found again."""
        return self.cells[STATE] == _USED and self._raw[_DIGEST] == self.digest

    @property
    def period(self) -> str:
        """The budget period the spend counts in ("" before the first request)."""
        return bytes(self._raw[_PERIOD]).rstrip(b"\0").decode("ascii")

    @period.setter
    def period(self, value: str) -> None:
        self._raw[_PERIOD] = value.encode("ascii")[:16].ljust(16, b"\0")

    # The leased allowance, under `lock()`.

    def cut(self, report: int) -> float | None:
        """Report `report` is being built: its answer's allowance counts from now on.
        What is left of the last one, from the first worker asked (None: another
        worker said it, or none was leased)."""
        cells = self.cells
        if cells[CUT] >= report:
            return None
        cells[CUT], cells[SINCE] = float(report), 0.0
        left = cells[LEFT]
        return None if math.isnan(left) else left

    def allow(self, report: int, tokens: float) -> None:
        """`tokens` leased in the answer to report `report`, less what was spent since
        its cut; taken once per report. An answer older than the last cut is not: the
        spend since would be counted from too late, and the next answer comes."""
        cells = self.cells
        if cells[LEASED] >= report or cells[CUT] > report:
            return
        cells[LEASED] = float(report)
        cells[LEFT] = tokens - cells[SINCE]

    def spend(self, tokens: float) -> None:
        cells = self.cells
        cells[SINCE] += tokens
        cells[LEFT] -= tokens  # NaN (none leased) stays NaN

    def allowance(self) -> float | None:
        """The leased allowance left; None: none leased yet."""
        left = self.cells[LEFT]
        return None if math.isnan(left) else left


class KeyTable:
    """The key rows of a memory file, from byte `offset` (page-aligned) on."""

    def __init__(self, fd: int, *, offset: int, capacity: int = DEFAULT_KEY_CAPACITY) -> None:
        self.fd = fd
        self.offset = offset
        self.capacity = capacity
        self._map = mmap.mmap(fd, table_bytes(capacity), offset=offset)
        self._raw = memoryview(self._map)

    def find(
        self, digest_hex: str, limits: Limits, share: tuple[float, float], now: float
    ) -> KeyRow | None:
        """The key's row, claimed (and started full) if it had none, or given its new
        limits if they changed (`_relimit`); None: the table is full."""
        digest = hashlib.sha256(digest_hex.encode()).digest()
        self._lock_header(fcntl.LOCK_EX)
        try:
            index = self._probe(digest)
            if index is None:
                return None
            row = self._row(index, digest)
            row.lock()
            try:
                cells = row.cells
                if cells[STATE] != _USED:
                    _start(row, limits, share, now)
                elif not _same(cells, limits):
                    _relimit(row, limits, share, now)
            finally:
                row.unlock()
            return row
        finally:
            self._lock_header(fcntl.LOCK_UN)

    def free(self, digest_hex: str) -> None:
        """Forget a key's counts (it was revoked); a freed row stays in the probe chains."""
        digest = hashlib.sha256(digest_hex.encode()).digest()
        self._lock_header(fcntl.LOCK_EX)
        try:
            index = self._probe(digest, claim=False)
            if index is not None:
                self._row(index, digest).cells[STATE] = _FREED
        finally:
            self._lock_header(fcntl.LOCK_UN)

    def _probe(self, digest: bytes, *, claim: bool = True) -> int | None:
        """The key's row index; else (with `claim`) the first freed or empty one on its
        chain, marked as the key's; None: not there, or no room."""
        home = int.from_bytes(digest[:8], "big") % self.capacity
        spare: int | None = None
        for step in range(self.capacity):
            index = (home + step) % self.capacity
            raw = self._row_bytes(index)
            state = raw[48:56].cast("d")[0]
            if state == _USED and raw[_DIGEST] == digest:
                return index
            if state == _FREED and spare is None:
                spare = index
            if state == _EMPTY:
                if spare is None:
                    spare = index
                break
        if not claim or spare is None:
            return None
        raw = self._row_bytes(spare)
        raw[_DIGEST] = digest
        raw.cast("d")[STATE] = _FREED  # not used until `_start` fills it
        return spare

    def _row_bytes(self, index: int) -> memoryview:
        start = (index + 1) * _ROW
        return self._raw[start : start + _ROW]

    def _row(self, index: int, digest: bytes) -> KeyRow:
        return KeyRow(
            self.fd, self._row_bytes(index), self.offset + (index + 1) * _ROW, index, digest
        )

    def _lock_header(self, cmd: int) -> None:
        fcntl.lockf(self.fd, cmd, _ROW, self.offset)


def _same(cells: memoryview[float], limits: Limits) -> bool:
    return all(
        (math.isnan(a) and math.isnan(b)) or a == b
        for a, b in zip(cells[RPM_LIMIT : BUDGET_PER + 1], limits, strict=True)
    )


def _start(row: KeyRow, limits: Limits, share: tuple[float, float], now: float) -> None:
    """A fresh row: both buckets full (as a one-process router starts a key), no spend,
    no allowance (the worker that claims it gives it the last, `KeyRow.allow`)."""
    cells = row.cells
    cells[RPM_LIMIT : BUDGET_PER + 1] = memoryview(_floats(limits)).cast("d")
    cells[RPM_LEVEL], cells[RPM_AT] = share[0], now
    cells[TPM_LEVEL], cells[TPM_AT] = share[1], now
    cells[SPENT] = 0.0
    cells[LEFT : LEASED + 1] = memoryview(_floats((math.nan, 0.0, 0.0, 0.0))).cast("d")
    row.period = ""
    cells[STATE] = _USED


def _floats(values: tuple[float, ...]) -> bytes:
    return struct.pack(f"={len(values)}d", *values)


def _relimit(row: KeyRow, limits: Limits, share: tuple[float, float], now: float) -> None:
    """New limits (a reload, the controller's list), as one process takes them: what a
    bucket holds is kept, never grown past its new size; a bucket the key had none of
    starts full; what it spent stays spent."""
    cells = row.cells
    had = (cells[RPM_LIMIT], cells[TPM_LIMIT])
    cells[RPM_LIMIT : BUDGET_PER + 1] = memoryview(_floats(limits)).cast("d")
    for i, (level, at) in enumerate(((RPM_LEVEL, RPM_AT), (TPM_LEVEL, TPM_AT))):
        if math.isnan(had[i]):
            cells[level], cells[at] = share[i], now
        else:
            cells[level] = min(cells[level], max(1.0, share[i]))
