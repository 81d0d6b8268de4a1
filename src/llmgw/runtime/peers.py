"""What one client address holds of a server's shared budgets (docs/hardening.md).

Every budget a server shares among its clients — open connections, request-body
bytes in flight, requests held while no replica is ready — is also divided: one
address may hold at most `client_share` of each. Without that, one client fills
the budget (eighty slow uploads, a few thousand idle connections) and every other
client is refused until it lets go; with it, that client is refused and the rest
are served.

A `Peer` is one address's tally. `Peers` hands it out when a connection opens and
forgets it when the address's last connection closes; each request carries its
connection's `Peer`, so charging a request is a few integer operations, not a
lookup. Clients behind one proxy share its address: there `client_share` 1.0
turns the division off.
"""

from __future__ import annotations

from typing import Final

# What a request without a known connection (a test's, a server without an Edge)
# is charged to: an address of its own, never anyone else's.
NO_ADDRESS: Final = ""


class Peer:
    """One client address: what its connections and requests hold now."""

    __slots__ = ("addr", "body_bytes", "conns", "held")

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.conns = 0  # open connections, counted by `Peers`
        self.body_bytes = 0  # request-body bytes in flight (the router's intake)
        self.held = 0  # requests waiting for a replica (the router's holding)


def share_of(total: int, share: float, *, at_least: int = 1) -> int:
    """One address's part of a budget of `total` units: `share` of it, never under
    `at_least` (one connection, one held request, one whole body)."""
    return max(at_least, int(total * share))


class Peers:
    """The connection count per address, and each address's `Peer`."""

    __slots__ = ("_by_addr", "max_conns_each", "share")

    def __init__(self, *, max_connections: int, share: float = 1.0) -> None:
        self.share = share
        # Connections one address may hold open; the server's own cap still applies.
        self.max_conns_each = share_of(max_connections, share)
        self._by_addr: dict[str, Peer] = {}

    def __len__(self) -> int:
        return len(self._by_addr)

    def enter(self, addr: str | None) -> Peer | None:
        """A connection from `addr` opens: its Peer, counted; None when the address
        already holds its share of connections (the caller refuses it)."""
        key = NO_ADDRESS if addr is None else addr
        peer = self._by_addr.get(key)
        if peer is None:
            peer = self._by_addr[key] = Peer(key)
        elif peer.conns >= self.max_conns_each:
            return None
        peer.conns += 1
        return peer

    def leave(self, peer: Peer) -> None:
        """A connection `enter` counted has closed."""
        peer.conns -= 1
        if peer.conns <= 0 and self._by_addr.get(peer.addr) is peer:
            # A request still running keeps its own reference; its tallies end with it.
            del self._by_addr[peer.addr]
