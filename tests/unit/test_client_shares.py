"""Each shared budget divided by client address (runtime/peers.py and its users)."""

from __future__ import annotations

import pytest

from llmgw.router.errors import HoldQueueFull
from llmgw.router.request.holding import Holding
from llmgw.router.request.intake import ByteBudget
from llmgw.runtime.peers import Peer, Peers, share_of


class TestPeers:
    """Connections are shared among client addresses, each with a floor."""

    def test_an_address_past_its_share_of_connections_is_refused(self) -> None:
        """Share 0.5 of 4 connections: two per address; another address still enters."""
        peers = Peers(max_connections=4, share=0.5)
        a1, a2 = peers.enter("10.0.0.1"), peers.enter("10.0.0.1")
        assert a1 is a2 is not None
        assert peers.enter("10.0.0.1") is None
        assert peers.enter("10.0.0.2") is not None

    def test_the_last_connection_closing_forgets_the_address(self) -> None:
        """Counted per connection; the address is forgotten with its last one."""
        peers = Peers(max_connections=10)
        p = peers.enter("10.0.0.1")
        assert p is not None
        peers.enter("10.0.0.1")
        peers.leave(p)
        assert (len(peers), p.conns) == (1, 1)
        peers.leave(p)
        assert len(peers) == 0

    def test_a_share_is_never_below_its_floor(self) -> None:
        """One connection, one held request or one whole body at least."""
        assert (share_of(3, 0.1), share_of(100, 0.5), share_of(8, 0.25, at_least=4)) == (1, 50, 4)


class TestByteBudget:
    """The byte budget holds an address to its share and leaves others alone."""

    def test_an_address_is_held_to_its_share_and_others_are_not(self) -> None:
        """`each` bytes per address, `limit` for all; give returns them to both."""
        budget = ByteBudget(100, each=50)
        a, b = Peer("a"), Peer("b")
        assert budget.take(50, a)
        assert not budget.take(1, a)
        assert not budget.fits(1, a)
        assert budget.take(50, b)
        assert not budget.take(1, Peer("c"))
        budget.give(50, a)
        assert (budget.used, a.body_bytes, b.body_bytes) == (50, 0, 50)
        assert budget.take(10, None)


class TestHeldPerAddress:
    """One address cannot fill the hold queue."""

    def test_one_address_cannot_fill_the_hold_queue(self) -> None:
        """max_held 4, share 0.5: the third held request of one address is refused, another
        address's is held; leaving returns the slot."""
        h = Holding(max_held=4, client_share=0.5)
        a, b = Peer("a"), Peer("b")
        with h.hold("m", a), h.hold("m", a):
            with pytest.raises(HoldQueueFull) as refused, h.hold("m", a):
                pass
            assert refused.value.share
            with h.hold("m", b):
                assert h.total == 3
        assert (a.held, b.held, h.total) == (0, 0, 0)
