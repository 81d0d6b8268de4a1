"""Flow control's homes: a freed slot goes to a request whose prefix holder has room,
within its tenant's share."""

from __future__ import annotations

from llmgw.router.request.flow import MAX_PASSED, FlowQueue, Refusal, Ticket
from llmgw.router.request.waits import home_of
from llmgw.router.routing.affinity import RouteKey
from llmgw.router.routing.policies import Ours
from llmgw.router.routing.prefix import PrefixIndex
from tests.unit.test_router_flow import limits
from tests.unit.test_router_policies import snap


def push(q: FlowQueue, tenant: str, home: tuple[str, ...] = ()) -> Ticket:
    got = q.push("standard", tenant, 0.0, home=home)
    assert not isinstance(got, Refusal)
    return got[0]


class TestHomedGrant:
    """A grant told which replicas have room prefers, inside the fair order's tenant, a
    request whose home is among them."""

    def test_a_request_whose_home_has_room_goes_first_with_the_heads_tags(self) -> None:
        """The head's home is full; the tenant's third request's home has room: it goes,
        taking the head's tags, and the two passed over keep their order."""
        q = FlowQueue(limits())
        a, b, c = push(q, "t", ("e1",)), push(q, "t", ("e1",)), push(q, "t", ("e2",))
        tags = [(a.start, a.finish), (b.start, b.finish), (c.start, c.finish)]
        assert q.pop(0.0, frozenset({"e2"})) is c
        assert (c.start, c.finish) == tags[0]
        assert [(a.start, a.finish), (b.start, b.finish)] == tags[1:]
        assert (a.passed, b.passed) == (1, 1)
        assert [q.pop(0.0), q.pop(0.0)] == [a, b]

    def test_other_tenants_keep_their_turn(self) -> None:
        """The fair order still picks the tenant: a quiet tenant's request, first by its
        tag, goes before the backlogged tenant's request whose home has room."""
        q = FlowQueue(limits())
        noisy = [push(q, "noisy", ("e1",)) for _ in range(3)]
        quiet = push(q, "quiet", ("e1",))
        assert q.pop(0.0, frozenset({"e2"})) is quiet
        assert q.pop(0.0, frozenset({"e2"})) is noisy[0]

    def test_head_at_home_or_no_room_given_goes_as_before(self) -> None:
        """Without a room set, or with the head's home in it, the head goes."""
        q = FlowQueue(limits())
        a, b = push(q, "t", ("e1",)), push(q, "t", ("e2",))
        assert q.pop(0.0) is a
        c = push(q, "t", ("e1",))
        assert q.pop(0.0, frozenset({"e1", "e2"})) is b
        assert q.pop(0.0, frozenset({"e2"})) is c

    def test_a_request_is_passed_over_a_bounded_number_of_times(self) -> None:
        """After MAX_PASSED later requests went first, the head goes whatever the room."""
        q = FlowQueue(limits())
        head = push(q, "t", ("e1",))
        for _ in range(MAX_PASSED):
            push(q, "t", ("e2",))
            assert q.pop(0.0, frozenset({"e2"})) is not head
        push(q, "t", ("e2",))
        assert head.passed == MAX_PASSED
        assert q.pop(0.0, frozenset({"e2"})) is head


class TestHomeOf:
    """A held request's home: the replicas holding the most of its prefix."""

    def test_the_longest_holders_unless_all_hold_the_same(self) -> None:
        """The holder of most blocks is the home; ties are all homes; a prefix every
        replica holds as much of, or none holds, gives no home."""
        prefix = PrefixIndex()
        chain = (11, 22, 33)
        snaps = [snap("a"), snap("b"), snap("c")]
        prefix.record("a", chain, capacity_units=None)
        prefix.record("b", chain[:1], capacity_units=None)
        d = Ours(prefix).choose(snaps, RouteKey(chain), (), record=False)
        assert home_of(d, snaps) == ("a",)
        prefix.record("c", chain, capacity_units=None)
        d = Ours(prefix).choose(snaps, RouteKey(chain), (), record=False)
        assert home_of(d, snaps) == ("a", "c")
        prefix.record("b", chain, capacity_units=None)
        d = Ours(prefix).choose(snaps, RouteKey(chain), (), record=False)
        assert home_of(d, snaps) == ()
        d = Ours(PrefixIndex()).choose(snaps, RouteKey(chain), (), record=False)
        assert home_of(d, snaps) == ()
