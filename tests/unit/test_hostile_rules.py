"""The pure rules behind the hostile-input limits: the connection cap and the hold rule."""

from __future__ import annotations

import resource

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot
from llmgw.router.request.holding import hold_until, retry_after_s
from llmgw.runtime.httpserver import FD_RESERVE, connection_cap, raise_nofile_limit
from llmgw.wire.endpoints import EndpointInfo


def snap(
    eid: str,
    breaker: BreakerState = BreakerState.CLOSED,
    *,
    probe_in_s: float | None = None,
    opened_total: int = 0,
) -> Snapshot:
    return Snapshot.of(
        info=EndpointInfo(id=eid, url=f"http://{eid}", models=("m",)),
        stats=None,
        drain_rate=0.0,
        inflight=0,
        running_capacity=0,
        stale=False,
        age_s=None,
        breaker=breaker,
        restarts=0,
        probe_in_s=probe_in_s,
        opened_total=opened_total,
    )


class TestConnectionCap:
    """The connection cap derived from the open-file limit."""

    def test_half_the_open_file_limit_less_the_reserve(self) -> None:
        """The cap is half the open-file limit less the reserve."""
        # The router at 1,024 open files: 448 client connections, 576 left over.
        assert connection_cap(10_000, 1024) == 1024 // 2 - FD_RESERVE == 448
        assert connection_cap(40, 1 << 20) == 40
        assert connection_cap(10_000, 100) == 1

    def test_the_soft_limit_is_raised_to_the_hard_one(self) -> None:
        """The soft limit is raised to the hard one."""
        soft = raise_nofile_limit()
        now_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert soft == now_soft
        if hard != resource.RLIM_INFINITY:
            assert now_soft == hard


OPEN = BreakerState.OPEN


class TestHoldUntil:
    """How long a request is held before it is answered."""

    def test_no_replica_waits_for_the_hold_deadline(self) -> None:
        """No replica waits for the hold deadline."""
        assert hold_until([], now=10.0, deadline=130.0, opened={}) == 130.0

    def test_all_open_waits_for_the_earliest_probe(self) -> None:
        """All open waits for the earliest probe."""
        snaps = [snap("a", OPEN, probe_in_s=7.0), snap("b", OPEN, probe_in_s=2.5)]
        opened = {"a": 0, "b": 0}
        assert hold_until(snaps, now=10.0, deadline=130.0, opened=opened) == 12.5
        # The hold deadline first: it wins.
        assert hold_until(snaps, now=10.0, deadline=11.0, opened=opened) == 11.0

    def test_a_long_cooldown_is_waited_no_longer_than_the_first(self) -> None:
        """A probe 40 s away (a doubled cooldown) is waited for until probe_wait_until."""
        snaps = [snap("a", OPEN, probe_in_s=40.0)]
        opened = {"a": 0}
        until = hold_until(snaps, now=10.0, deadline=130.0, opened=opened, probe_wait_until=20.0)
        assert until == 20.0
        # The hold deadline, when it comes first, still wins.
        until = hold_until(snaps, now=10.0, deadline=15.0, opened=opened, probe_wait_until=20.0)
        assert until == 15.0

    def test_a_probe_that_failed_meanwhile_ends_the_wait(self) -> None:
        """A probe that failed meanwhile ends the wait."""
        snaps = [snap("a", OPEN, probe_in_s=20.0, opened_total=2)]
        assert hold_until(snaps, now=10.0, deadline=130.0, opened={"a": 1}) is None
        assert retry_after_s(snaps) == 20

    def test_a_probe_out_waits_for_its_verdict(self) -> None:
        """A probe out waits for its verdict."""
        snaps = [snap("a", BreakerState.HALF_OPEN, opened_total=1)]
        assert hold_until(snaps, now=10.0, deadline=130.0, opened={"a": 1}) == 130.0

    def test_a_replica_new_since_the_wait_began_is_no_failed_probe(self) -> None:
        """A replica new since the wait began is no failed probe."""
        snaps = [snap("a", OPEN, probe_in_s=1.0, opened_total=3)]
        assert hold_until(snaps, now=0.0, deadline=60.0, opened={}) == 1.0

    def test_retry_after_is_whole_seconds_at_least_one(self) -> None:
        """Retry-After is whole seconds, at least one."""
        assert retry_after_s([snap("a", OPEN, probe_in_s=0.2)]) == 1
        assert retry_after_s([snap("a", OPEN, probe_in_s=2.1)]) == 3
        assert retry_after_s([snap("a")]) == 1
