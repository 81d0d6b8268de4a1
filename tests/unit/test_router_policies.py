"""The baseline routing policies and our policy's prefix bookkeeping."""

from __future__ import annotations

import collections

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot, Stats
from llmgw.router.routing.affinity import NO_KEY, RouteKey, SessionAffinity
from llmgw.router.routing.policies import LeastInflight, Ours, RoundRobin, make_policy
from llmgw.router.routing.prefix import PrefixIndex
from llmgw.wire.endpoints import EndpointInfo


def snap(eid: str, *, inflight: int = 0, breaker: BreakerState = BreakerState.CLOSED) -> Snapshot:
    return Snapshot.of(
        info=EndpointInfo(id=eid, url=f"http://{eid}", models=("m",)),
        stats=Stats(running=0, waiting=0, kv_usage=0.0, kv_capacity_tokens=16_000),
        drain_rate=0.0,
        inflight=inflight,
        running_capacity=8,
        stale=False,
        age_s=0.1,
        breaker=breaker,
        restarts=0,
    )


class TestRoundRobin:
    """The round-robin baseline policy."""

    def test_cycles_in_id_order(self) -> None:
        """Requests go a, b, c, a, b, c whatever the load."""
        rr = RoundRobin()
        snaps = [snap("a", inflight=50), snap("b"), snap("c")]
        assert [rr.choose(snaps, NO_KEY, ()).endpoint_id for _ in range(6)] == list("abcabc")

    def test_skips_excluded_and_open(self) -> None:
        """Excluded and open endpoints are never chosen."""
        rr = RoundRobin()
        snaps = [snap("a"), snap("b", breaker=BreakerState.OPEN), snap("c")]
        picks = {rr.choose(snaps, NO_KEY, ("a",)).endpoint_id for _ in range(4)}
        assert picks == {"c"}

    def test_nothing_to_choose(self) -> None:
        """No candidate gives a decision without an endpoint."""
        assert RoundRobin().choose([], NO_KEY, ()).endpoint_id is None


class TestLeastInflight:
    """The least-in-flight baseline policy."""

    def test_picks_fewest_inflight(self) -> None:
        """The endpoint with the fewest requests in flight wins."""
        li = LeastInflight()
        snaps = [snap("a", inflight=3), snap("b", inflight=1), snap("c", inflight=2)]
        assert li.choose(snaps, NO_KEY, ()).endpoint_id == "b"

    def test_ties_rotate(self) -> None:
        """Ties are spread, not always given to the first id."""
        li = LeastInflight()
        snaps = [snap("a"), snap("b")]
        picks = collections.Counter(li.choose(snaps, NO_KEY, ()).endpoint_id for _ in range(10))
        assert picks == {"a": 5, "b": 5}


class TestOurs:
    """Our policy records what it dispatches in the prefix index."""

    def test_served_request_is_remembered(self) -> None:
        """After a request completes on an endpoint, the same prefix is routed back there."""
        prefix = PrefixIndex()
        ours = Ours(prefix)
        hashes = RouteKey((11, 22, 33))
        snaps = [snap("a"), snap("b"), snap("c")]
        # Where a fresh policy would send it (its home), asked of one that records nothing here.
        first = Ours(PrefixIndex()).choose(snaps, hashes, ()).endpoint_id
        other = next(s.id for s in snaps if s.id != first)
        ours.served(other, hashes, snaps[0].stats)
        d = ours.choose(snaps, hashes, ())
        assert (d.endpoint_id, d.reason) == (other, "prefix")

    def test_dispatched_request_is_remembered_before_it_completes(self) -> None:
        """A prefix sent to an endpoint is routed back there while the first request runs."""
        ours = Ours(PrefixIndex())
        hashes = RouteKey((11, 22, 33))
        ids = ("a", "b", "c")
        home = Ours(PrefixIndex()).choose([snap(i) for i in ids], hashes, ()).endpoint_id
        # The home is busy beyond the home bound, so the first request goes elsewhere.
        first = ours.choose([snap(i, inflight=4 if i == home else 0) for i in ids], hashes, ())
        assert first.endpoint_id not in (None, home)
        # Not completed yet (no served() call): the next request follows the first.
        busy = {first.endpoint_id: 1}
        d = ours.choose([snap(i, inflight=busy.get(i, 0)) for i in ids], hashes, ())
        assert (d.endpoint_id, d.reason) == (first.endpoint_id, "prefix")

    def test_no_choice_records_nothing(self) -> None:
        """When every endpoint is excluded, no endpoint is credited with the prefix."""
        prefix = PrefixIndex()
        d = Ours(prefix).choose([snap("a"), snap("b")], RouteKey((11, 22)), ("a", "b"))
        assert (d.endpoint_id, len(prefix)) == (None, 0)

    def test_a_choice_asked_without_dispatch_records_nothing(self) -> None:
        """A choice made with record=False (a request flow control may hold) credits no
        endpoint and no session; `dispatched` then records the one that was sent."""
        prefix = PrefixIndex()
        ours = Ours(prefix)
        key = RouteKey((11, 22, 33), session=7)
        snaps = [snap("a"), snap("b")]
        d = ours.choose(snaps, key, (), record=False)
        assert d.endpoint_id is not None
        assert (len(prefix), ours.sessions.last(key)) == (0, None)
        ours.dispatched(d, snaps, key)
        assert prefix.match(key.hashes, ["a", "b"]) == {d.endpoint_id: 3}
        assert ours.sessions.last(key) == d.endpoint_id

    def test_no_hashes_is_plain_load(self) -> None:
        """A request without a prompt (no hashes) is routed on load alone."""
        ours = Ours(PrefixIndex())
        d = ours.choose([snap("a", inflight=4), snap("b")], NO_KEY, ())
        assert d.endpoint_id == "b"


class TestGains:
    """A prefix every endpoint holds saves nothing."""

    def test_what_every_endpoint_holds_saves_nothing(self) -> None:
        """Both hold a long shared start; the extra of one is a small share (11 %), so a holder
        half a batch busier loses to the idle one."""
        ours = Ours(PrefixIndex())
        chain = tuple(range(1, 61))  # 60 blocks: ~13 KiB
        ours.prefix.record("a", chain, capacity_units=None)
        ours.prefix.record("b", chain[:58], capacity_units=None)
        d = ours.choose([snap("a", inflight=4), snap("b")], RouteKey(chain), ())
        assert d.endpoint_id == "b"
        # Where "b" holds nothing, holding the whole chain is worth the wait.
        ours = Ours(PrefixIndex())
        ours.prefix.record("a", chain, capacity_units=None)
        d = ours.choose([snap("a", inflight=4), snap("b")], RouteKey(chain), ())
        assert d.endpoint_id == "a"


class TestSessionHints:
    """Session hints break ties and are bounded."""

    def test_hint_breaks_a_tie_between_equal_holders(self) -> None:
        """Two endpoints hold the same prefix: the session goes back where it was served."""
        snaps = [snap("a"), snap("b"), snap("c")]
        for last in ("a", "b"):
            ours = Ours(PrefixIndex())
            ours.prefix.record("a", (11, 22), capacity_units=None)
            ours.prefix.record("b", (11, 22), capacity_units=None)
            ours.sessions.served(RouteKey((11, 22, 33), session=7), last)
            d = ours.choose(snaps, RouteKey((11, 22, 33, 44), session=7), ())
            assert d.endpoint_id == last
            assert f"{last}* 0.00 p2 " in d.header()
            assert d.header().split(f"{last}*", 1)[1].split(",", 1)[0].endswith(" s")
        # Without the hint the tie goes to the lower id: "b" above was the hint's doing.
        ours = Ours(PrefixIndex())
        ours.prefix.record("a", (11, 22), capacity_units=None)
        ours.prefix.record("b", (11, 22), capacity_units=None)
        d = ours.choose(snaps, RouteKey((11, 22, 33, 44)), ())
        assert (d.endpoint_id, d.reason) == ("a", "prefix")

    def test_hint_never_beats_a_longer_prefix(self) -> None:
        """The session's last endpoint holds less of the prompt than another: content wins."""
        prefix = PrefixIndex()
        ours = Ours(prefix)
        prefix.record("a", (11, 22, 33), capacity_units=None)
        prefix.record("b", (11,), capacity_units=None)
        ours.sessions.served(RouteKey((11, 99), session=7), "b")
        d = ours.choose([snap("a"), snap("b")], RouteKey((11, 22, 33), session=7), ())
        assert (d.endpoint_id, d.reason) == ("a", "prefix")

    def test_hint_never_beats_the_load_bound(self) -> None:
        """A session whose last endpoint is a full batch busier goes elsewhere."""
        prefix = PrefixIndex()
        ours = Ours(prefix)
        prefix.record("a", (11, 22), capacity_units=None)
        prefix.record("b", (11, 22), capacity_units=None)
        ours.sessions.served(RouteKey((11, 22), session=7), "a")
        d = ours.choose([snap("a", inflight=9), snap("b")], RouteKey((11, 22), session=7), ())
        assert d.endpoint_id == "b"

    def test_other_conversation_of_the_same_user_gets_no_pull(self) -> None:
        """A remembered endpoint counts only for a request with the same first block."""
        aff = SessionAffinity()
        aff.served(RouteKey((11, 22), session=7), "a")
        assert aff.last(RouteKey((11, 23), session=7)) == "a"
        assert aff.last(RouteKey((12, 22), session=7)) is None
        assert aff.last(RouteKey((11, 22))) is None

    def test_sessions_are_bounded_and_forget_departed_endpoints(self) -> None:
        """The LRU keeps max_sessions; retain() drops sessions of endpoints gone."""
        aff = SessionAffinity(max_sessions=3)
        for i in range(5):
            aff.served(RouteKey((1,), session=i), "a" if i % 2 else "b")
        assert len(aff) == 3
        assert aff.last(RouteKey((1,), session=0)) is None
        aff.retain(["a"])
        assert (len(aff), aff.last(RouteKey((1,), session=3))) == (1, "a")

    def test_a_session_served_again_is_the_last_to_be_forgotten(self) -> None:
        """Least recently served goes first: serving a session again renews it."""
        aff = SessionAffinity(max_sessions=3)
        for i in range(3):
            aff.served(RouteKey((1,), session=i), f"e{i}")
        aff.served(RouteKey((1,), session=0), "e9")
        aff.served(RouteKey((1,), session=3), "e3")
        got = [aff.last(RouteKey((1,), session=i)) for i in range(4)]
        assert got == ["e9", None, "e2", "e3"]


class TestMakePolicy:
    """Policies made by name."""

    def test_names(self) -> None:
        """Each configured name builds its policy."""
        names = [
            make_policy(n, PrefixIndex()).name for n in ("ours", "round_robin", "least_inflight")
        ]
        assert names == ["ours", "round_robin", "least_inflight"]
