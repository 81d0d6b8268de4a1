"""A key's RPM and TPM buckets, this process's or its row's in the workers' shared
memory (request/tenants.py fills and reads them; workers/keytable.py holds the rows).
"""

from __future__ import annotations

import math

# Retry-After of a key with no share on this router yet (its lease is a report away).
NO_SHARE_RETRY_S = 2.0


class Bucket:
    """A token bucket: `share` per minute, refilled evenly, starting with `share` in it.

    It holds a minute's worth, and never less than one (a request, a token): a share
    below one would otherwise never admit anything. `limit` is the key's whole limit,
    shown in the x-ratelimit-limit-* header.
    """

    __slots__ = ("at", "level", "limit", "rate", "size")

    def __init__(self, limit: int, share: float, now: float) -> None:
        self.limit = limit
        self.size = max(1.0, share)
        self.rate = share / 60.0
        self.level = share
        self.at = now

    def reshare(self, share: float, now: float) -> None:
        """A new share: the rate changes, and a smaller bucket spills what it cannot
        hold; a larger one fills only at its rate (a new share is never a burst)."""
        self.refill(now)
        self.size = max(1.0, share)
        self.rate = share / 60.0
        self.level = min(self.level, self.size)

    def refill(self, now: float) -> None:
        self.level = min(self.size, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_s(self, need: float) -> float:
        """Seconds until `need` is in the bucket (0 when it is now).

        A share of zero never refills: the answer is the next lease, a report away.
        """
        if self.rate <= 0.0:
            return 0.0 if self.level >= need else NO_SHARE_RETRY_S
        return max(0.0, (need - self.level) / self.rate)

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return self.wait_s(self.size)


class SharedBucket(Bucket):
    """A bucket whose level and stamp are cells of the key's row, shared by the
    router's workers; read and written only under the row's lock."""

    __slots__ = ("_cell", "_cells")

    def __init__(self, limit: int, share: float, cells: memoryview[float], cell: int) -> None:
        self.limit = limit
        self.size = max(1.0, share)
        self.rate = share / 60.0
        self._cells = cells
        # The level's cell; the stamp's is the next one (keytable.py).
        self._cell = cell

    @property
    def level(self) -> float:
        return float(self._cells[self._cell])

    @level.setter
    def level(self, value: float) -> None:
        self._cells[self._cell] = value

    @property
    def at(self) -> float:
        return float(self._cells[self._cell + 1])

    @at.setter
    def at(self, value: float) -> None:
        self._cells[self._cell + 1] = value


def relimited(bucket: Bucket | None, limit: int | None, share: float, now: float) -> Bucket | None:
    """`bucket` with the limit `limit` (None: none) at `share`; a new one when it had none."""
    if limit is None:
        return None
    if bucket is None:
        return Bucket(limit, share, now)
    bucket.limit = limit
    bucket.reshare(share, now)
    return bucket


def duration(seconds: float) -> str:
    """OpenAI's reset format (Go's durations): `250ms`, `12s`, `1m30s`, `1h40m0s`.

    Hours are named as OpenAI names them: a small leased share, or a bucket an answer
    overdrew, is full again only hours later, which read `100m0s` before."""
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, secs = divmod(math.ceil(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
