"""A request's home replica: rendezvous (highest-random-weight) hashing of its first block.

A prefix no replica within the load bound holds goes to its home (scheduler.py,
rule 4). Homes must agree across routers that never talk, and removing one
endpoint must move only the keys it was first for: each candidate's weight for
a key is splitmix64 of the key xor blake2b of the candidate's id, never Python's
per-process hash.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b
from typing import Final

_MASK64: Final = (1 << 64) - 1


def _id_hash(endpoint_id: str) -> int:
    return int.from_bytes(blake2b(endpoint_id.encode(), digest_size=8).digest(), "little")


def _mix64(x: int) -> int:
    """splitmix64's finaliser: every input bit moves every output bit."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def rendezvous_order(key: int, candidates: Sequence[str]) -> list[str]:
    """Candidates by descending highest-random-weight for `key`.

    Deterministic across processes (blake2b of the id and splitmix64, never
    Python's per-process hash): routers that never talk agree on the order, and
    removing one endpoint only moves the keys it was first for.
    """
    return Homes().order(key, candidates)


class Homes:
    """`rendezvous_order`, remembering each endpoint id's blake2b (a policy owns one).

    The ids are the fleet's endpoints, a few hundred at most; the memo is cleared
    when it holds `max_ids` (a cache, not a record).
    """

    __slots__ = ("_ids", "max_ids")

    def __init__(self, *, max_ids: int = 65536) -> None:
        self.max_ids = max_ids
        self._ids: dict[str, int] = {}

    def order(self, key: int, candidates: Sequence[str]) -> list[str]:
        """Candidates by descending highest-random-weight for `key` (`rendezvous_order`)."""
        k = key & _MASK64
        ids = self._ids
        weighted: list[tuple[int, str]] = []
        for c in candidates:
            h = ids.get(c)
            if h is None:
                if len(ids) >= self.max_ids:
                    ids.clear()
                h = ids[c] = _id_hash(c)
            weighted.append((-_mix64(k ^ h), c))
        weighted.sort()
        return [c for _w, c in weighted]

    def lazy(self, key: int, candidates: Sequence[str]) -> Rendezvous:
        """The order for `key`, computed only when the scheduler asks for it."""
        return Rendezvous(self, key, candidates)


class Rendezvous:
    """`homes.order(key, candidates)` when called, and only then: the scheduler's
    home order for a request, which most requests (decided by a prefix holder or by
    load) never need. A class, not a closure: compiled, a closure over the caller's
    locals moved them all into an environment object, one more per request."""

    __slots__ = ("candidates", "homes", "key")

    def __init__(self, homes: Homes, key: int, candidates: Sequence[str]) -> None:
        self.homes = homes
        self.key = key
        self.candidates = candidates

    def __call__(self) -> list[str]:
        return self.homes.order(self.key, self.candidates)
