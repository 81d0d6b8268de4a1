"""Endpoint registry: the seed's behaviours, one test each."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.router.replicas.breaker import BreakerConfig, BreakerState, Outcome
from llmgw.router.replicas.registry import Registry, Release, Snapshot, Stats
from llmgw.testing import ManualClock
from llmgw.wire.endpoints import EndpointInfo


def info(id: str, *models: str, url: str = "") -> EndpointInfo:
    return EndpointInfo(id=id, url=url or f"http://{id}", models=models or ("m",))


def stats(running: int = 0, success: float | None = 0.0, waiting: int = 0, **kw: float) -> Stats:
    return Stats(running=running, waiting=waiting, kv_usage=0.5, success_total=success, **kw)  # type: ignore[arg-type]


def registry(*ids: str, clock: ManualClock | None = None, **kw: object) -> Registry:
    reg = Registry(clock=clock or ManualClock(), **kw)  # type: ignore[arg-type]
    reg.replace(info(i) for i in ids)
    return reg


class TestReplace:
    """Replacing the endpoint list keeps survivors' state and starts new ones fresh."""

    def test_replace_keeps_survivors_live_state(self) -> None:
        """An endpoint present before and after keeps stats, drain rate, inflight and breaker."""
        clock = ManualClock()
        reg = registry("a", "b", clock=clock, breaker=BreakerConfig(failure_threshold=1))
        reg.observe("a", stats(success=0))
        clock.advance(1)
        reg.observe("a", stats(running=3, success=10))
        held = reg.acquire("a")
        fail = reg.acquire("b")
        assert held is not None
        assert fail is not None
        fail(Outcome.ENDPOINT_FAILURE)
        before_a, before_b = reg.snapshot("a"), reg.snapshot("b")

        reg.replace([info("a", url="http://moved"), info("b"), info("c")])

        a, b = reg.snapshot("a"), reg.snapshot("b")
        assert a is not None
        assert b is not None
        assert before_a is not None
        assert before_b is not None
        assert (a.stats, a.drain_rate, a.inflight, a.running_capacity) == (
            before_a.stats,
            before_a.drain_rate,
            1,
            3,
        )
        assert b.breaker is BreakerState.OPEN
        assert a.info.url == "http://moved"

    def test_replace_gives_new_endpoints_fresh_state(self) -> None:
        """A new endpoint starts never scraped, idle, with a closed breaker."""
        reg = registry("a")
        reg.replace([info("a"), info("n")])
        n = reg.snapshot("n")
        assert n is not None
        assert (n.stats, n.inflight, n.breaker, n.stale, n.age_s) == (
            None,
            0,
            BreakerState.CLOSED,
            True,
            None,
        )

    def test_replace_returns_removed_ids_sorted(self) -> None:
        """Removed endpoints are dropped and named, sorted, for the prefix index to purge."""
        reg = registry("c", "a", "b", "d")
        assert reg.replace([info("b")]) == ["a", "c", "d"]
        assert reg.ids() == ["b"]
        assert reg.snapshot("a") is None

    def test_replace_bumps_version(self) -> None:
        """Every replace() bumps the version caches key on."""
        reg = Registry(clock=ManualClock())
        v0 = reg.version
        reg.replace([info("a")])
        reg.replace([info("a")])
        assert reg.version == v0 + 2

    def test_removed_then_readded_starts_fresh(self) -> None:
        """An endpoint that left and came back has no memory of its old state."""
        reg = registry("a")
        reg.observe("a", stats(running=5))
        reg.replace([])
        reg.replace([info("a")])
        a = reg.snapshot("a")
        assert a is not None
        assert (a.stats, a.running_capacity) == (None, 0)

    def test_infos_and_models_follow_the_list(self) -> None:
        """infos() is sorted by id; models() is every model any endpoint serves."""
        reg = Registry(clock=ManualClock())
        reg.replace([info("b", "x", "y"), info("a", "y")])
        assert [i.id for i in reg.infos()] == ["a", "b"]
        assert reg.models() == frozenset({"x", "y"})


class TestObserve:
    """Scrape observations update rates, capacities and restarts."""

    def test_observe_of_unknown_endpoint_is_ignored(self) -> None:
        """A scrape that lands after its endpoint was removed changes nothing."""
        reg = registry("a")
        assert reg.observe("gone", stats()) is False
        assert reg.ids() == ["a"]

    def test_first_observe_has_no_derivative(self) -> None:
        """The drain rate needs two scrapes; after one it is still 0."""
        reg = registry("a")
        reg.observe("a", stats(success=1000))
        assert reg.snapshots()[0].drain_rate == 0.0

    def test_drain_rate_is_an_ema_of_success_deltas_per_second(self) -> None:
        """Each scrape moves the rate 30 % of the way to the newly measured rate."""
        clock = ManualClock()
        reg = registry("a", clock=clock)
        reg.observe("a", stats(success=0))
        clock.advance(2)
        reg.observe("a", stats(success=20))  # 10/s
        assert reg.snapshots()[0].drain_rate == pytest.approx(3.0)
        clock.advance(2)
        reg.observe("a", stats(success=60))  # 20/s
        assert reg.snapshots()[0].drain_rate == pytest.approx(0.3 * 20 + 0.7 * 3.0)

    def test_counter_going_backwards_resets_drain_rate(self) -> None:
        """A finished-request counter that decreases is an engine restart: rate reset, no
        derivative, restarts counted, and observe() says so."""
        clock = ManualClock()
        reg = registry("a", clock=clock)
        reg.observe("a", stats(success=0))
        clock.advance(1)
        reg.observe("a", stats(success=100))
        clock.advance(1)
        assert reg.observe("a", stats(success=5)) is True
        s = reg.snapshots()[0]
        assert (s.drain_rate, s.restarts) == (0.0, 1)

    def test_rate_resumes_from_the_restarted_counter(self) -> None:
        """After a restart the next derivative is taken from the new, smaller counter."""
        clock = ManualClock()
        reg = registry("a", clock=clock)
        reg.observe("a", stats(success=500))
        clock.advance(1)
        reg.observe("a", stats(success=0))
        clock.advance(1)
        assert reg.observe("a", stats(success=10)) is False
        assert reg.snapshots()[0].drain_rate == pytest.approx(3.0)

    def test_token_counter_going_backwards_is_a_restart_without_a_success_counter(self) -> None:
        """Engines with no finished-request counter (llama.cpp) still reveal restarts."""
        reg = registry("a")
        reg.observe("a", stats(success=None, generation_tokens=5e6))
        assert reg.observe("a", stats(success=None, generation_tokens=10.0)) is True

    def test_missing_success_counter_leaves_drain_rate_at_zero(self) -> None:
        """With no finished-request counter there is no rate to take."""
        clock = ManualClock()
        reg = registry("a", clock=clock)
        reg.observe("a", stats(success=None))
        clock.advance(1)
        reg.observe("a", stats(success=None))
        assert reg.snapshots()[0].drain_rate == 0.0

    def test_running_capacity_is_the_max_running_ever_observed(self) -> None:
        """The learned batch capacity only grows, and survives an engine restart."""
        reg = registry("a")
        for running, success in [(3, 10), (9, 20), (4, 30), (1, 0)]:
            reg.observe("a", stats(running=running, success=success))
        assert reg.snapshots()[0].running_capacity == 9

    def test_capacity_is_shown_once_the_engine_was_seen_queueing(self) -> None:
        """capacity_shown turns true at the first scrape with requests waiting, and stays."""
        reg = registry("a")
        reg.observe("a", stats(running=8))
        assert (reg.capacity_shown("a"), reg.capacity_shown("nope")) == (False, False)
        reg.observe("a", stats(running=8, waiting=2))
        reg.observe("a", stats(running=3))
        assert reg.capacity_shown("a") is True

    def test_observe_records_inflight_at_scrape(self) -> None:
        """The scrape remembers how many of our requests were in flight when it landed."""
        reg = registry("a")
        r1, r2 = reg.acquire("a"), reg.acquire("a")
        reg.observe("a", stats())
        reg.acquire("a")
        s = reg.snapshots()[0]
        assert (s.inflight, s.inflight_at_scrape) == (3, 2)
        assert r1 is not None
        assert r2 is not None


class TestStaleness:
    """When an endpoint's figures count as stale."""

    def test_never_scraped_is_stale(self) -> None:
        """An endpoint with no successful scrape is stale and has no age."""
        s = registry("a").snapshots()[0]
        assert (s.stale, s.age_s, s.stats) == (True, None, None)

    def test_fresh_scrape_is_not_stale(self) -> None:
        """Within stale_after_s of a scrape the endpoint is fresh, with its age."""
        clock = ManualClock()
        reg = registry("a", clock=clock, stale_after_s=5.0)
        reg.observe("a", stats())
        clock.advance(5.0)
        s = reg.snapshots()[0]
        assert (s.stale, s.age_s) == (False, 5.0)

    def test_stale_after_stale_after_s(self) -> None:
        """Past stale_after_s without a successful scrape the endpoint turns stale."""
        clock = ManualClock()
        reg = registry("a", clock=clock, stale_after_s=5.0)
        reg.observe("a", stats())
        clock.advance(5.01)
        assert reg.snapshots()[0].stale

    def test_scrape_failure_does_not_touch_breaker(self) -> None:
        """Failed scrapes leave the breaker closed; the endpoint only goes stale."""
        clock = ManualClock()
        reg = registry("a", clock=clock, breaker=BreakerConfig(failure_threshold=1))
        reg.observe("a", stats())
        for _ in range(10):
            clock.advance(2)
            reg.scrape_failed("a")
        s = reg.snapshots()[0]
        assert (s.breaker, s.stale) == (BreakerState.CLOSED, True)
        assert reg.acquire("a") is not None


class TestSnapshots:
    """Registry snapshots are sorted, filtered and read without side effects."""

    def test_snapshots_are_sorted_by_id(self) -> None:
        """Snapshots come out sorted by id whatever the list order."""
        reg = registry("c", "a", "b")
        assert [s.id for s in reg.snapshots()] == ["a", "b", "c"]

    def test_snapshots_filter_by_model(self) -> None:
        """Given a model, only endpoints serving it are returned."""
        reg = Registry(clock=ManualClock())
        reg.replace([info("a", "x"), info("b", "y"), info("c", "x", "y")])
        assert [s.id for s in reg.snapshots("x")] == ["a", "c"]
        assert reg.snapshots("z") == []

    def test_snapshots_read_the_breaker_without_consuming_the_probe(self) -> None:
        """Reading a half-open endpoint's snapshot leaves its single probe available."""
        clock = ManualClock()
        reg = registry("a", clock=clock, breaker=BreakerConfig(failure_threshold=1, cooldown_s=1))
        rel = reg.acquire("a")
        assert rel is not None
        rel(Outcome.ENDPOINT_FAILURE)
        clock.advance(1)
        snap = reg.snapshot("a")
        assert snap is not None
        assert (reg.snapshots()[0].breaker, snap.breaker) == (BreakerState.HALF_OPEN,) * 2
        assert reg.acquire("a") is not None
        assert reg.acquire("a") is None

    def test_registry_snapshots_carry_info_and_stats_figures(self) -> None:
        """What the scheduler reads per request comes with the snapshot, kept current:
        the info's id, weight and priority, the last scrape's running + waiting."""
        reg = Registry(clock=ManualClock())
        reg.replace([EndpointInfo(id="a", url="http://a", models=("m",), weight=2.5, priority=3)])
        s = reg.snapshots()[0]
        assert (s.id, s.weight, s.priority, s.engine_requests) == ("a", 2.5, 3, None)
        reg.observe("a", Stats(running=4, waiting=3, kv_usage=None))
        reg.replace([EndpointInfo(id="a", url="http://a", models=("m",), weight=0.5)])
        s = reg.snapshots()[0]
        assert (s.id, s.weight, s.priority, s.engine_requests) == ("a", 0.5, 0, 7)
        assert (s.info.weight, s.stats) == (0.5, Stats(running=4, waiting=3, kv_usage=None))

    def test_snapshot_of_derives_what_the_scheduler_reads(self) -> None:
        """Snapshot.of reads id, weight, priority and engine_requests off info and stats;
        built by every keyword, a snapshot keeps what it was given; equal fields, equal
        values and hashes."""
        i = EndpointInfo(id="e", url="http://e", models=("m",), weight=1.5, priority=2)
        base: dict[str, Any] = {
            "drain_rate": 0.0,
            "inflight": 0,
            "running_capacity": 0,
            "stale": False,
            "age_s": None,
            "breaker": BreakerState.CLOSED,
            "restarts": 0,
        }
        never = Snapshot.of(info=i, stats=None, **base)
        assert (never.id, never.weight, never.priority, never.engine_requests) == (
            "e",
            1.5,
            2,
            None,
        )
        scraped = Snapshot.of(info=i, stats=Stats(running=2, waiting=5, kv_usage=0.1), **base)
        assert scraped.engine_requests == 7
        given_ = Snapshot(
            info=i, stats=None, id="e", weight=1.5, priority=2, engine_requests=None, **base
        )
        assert given_ == never
        assert (scraped == never, hash(given_) == hash(never)) == (False, True)
        assert repr(never).startswith("Snapshot(info=EndpointInfo(id='e'")

    def test_snapshots_as_shown_by_admin_endpoints(self) -> None:
        """/admin/endpoints shows each snapshot as msgspec encoded it when it was a
        Struct: its keywords in order, info without its default fields, stats whole,
        the breaker by name; nothing derived."""
        clock = ManualClock()
        reg = Registry(clock=clock, breaker=BreakerConfig(failure_threshold=1))
        reg.replace(
            [
                EndpointInfo(
                    id="a", url="http://a", models=("m",), weight=2.5, priority=1, api_key="k"
                ),
                EndpointInfo(id="b", url="http://b", models=("m", "n"), engine="vllm"),
            ]
        )
        reg.observe("a", Stats(running=3, waiting=2, kv_usage=0.5, success_total=5.0))
        clock.advance(2)
        reg.observe("a", Stats(running=4, waiting=1, kv_usage=None, success_total=9.0))
        assert reg.acquire("a", pending=True) is not None
        failed = reg.acquire("b")
        assert failed is not None
        failed(Outcome.ENDPOINT_FAILURE)
        clock.advance(1)
        # As the JSON answer has them (builtins keep info's models a tuple).
        shown = json.loads(json.dumps([s.as_builtins() for s in reg.snapshots()]))
        a_info = {"id": "a", "url": "http://a", "models": ["m"], "weight": 2.5, "priority": 1}
        assert shown == [
            {
                "info": {**a_info, "api_key": "k"},
                "stats": {
                    "running": 4,
                    "waiting": 1,
                    "kv_usage": None,
                    "block_size": None,
                    "num_gpu_blocks": None,
                    "prompt_tokens": None,
                    "generation_tokens": None,
                    "success_total": 9.0,
                    "kv_capacity_tokens": None,
                    "prefill_seconds": None,
                    "prefix_hit_tokens": None,
                },
                "drain_rate": pytest.approx(0.6),
                "inflight": 1,
                "running_capacity": 4,
                "stale": False,
                "age_s": 1.0,
                "breaker": "closed",
                "restarts": 0,
                "inflight_at_scrape": 0,
                "pending": 1,
                "probe_in_s": None,
                "opened_total": 0,
                "owed_tokens": 0,
                "owed_full": 0,
                "prefill_s_per_token": None,
                "owed_count": 0,
                "decode_rate": 0.0,
            },
            {
                "info": {"id": "b", "url": "http://b", "models": ["m", "n"], "engine": "vllm"},
                "stats": None,
                "drain_rate": 0.0,
                "inflight": 0,
                "running_capacity": 0,
                "stale": True,
                "age_s": None,
                "breaker": "open",
                "restarts": 0,
                "inflight_at_scrape": 0,
                "pending": 0,
                "probe_in_s": 9.0,
                "opened_total": 1,
                "owed_tokens": 0,
                "owed_full": 0,
                "prefill_s_per_token": None,
                "owed_count": 0,
                "decode_rate": 0.0,
            },
        ]
        assert [list(d) for d in shown] == [list(shown[0])] * 2
        assert list(shown[0]) == [
            "info",
            "stats",
            "drain_rate",
            "inflight",
            "running_capacity",
            "stale",
            "age_s",
            "breaker",
            "restarts",
            "inflight_at_scrape",
            "pending",
            "probe_in_s",
            "opened_total",
            "owed_tokens",
            "owed_full",
            "prefill_s_per_token",
            "owed_count",
            "decode_rate",
        ]


class TestAcquire:
    """Acquiring an endpoint counts in-flight requests and releases exactly once."""

    def test_acquire_counts_inflight(self) -> None:
        """Each grant adds one in flight and each release takes it away."""
        reg = registry("a")
        r1, r2 = reg.acquire("a"), reg.acquire("a")
        assert r1 is not None
        assert r2 is not None
        assert reg.inflight("a") == 2
        r1(Outcome.OK)
        assert reg.inflight("a") == 1

    def test_a_stream_is_pending_until_its_first_token(self) -> None:
        """A streamed request counts as pending from acquire to started() (or its
        release, whichever comes first); one that does not stream never does."""
        reg = registry("a")
        plain = reg.acquire("a")
        s1, s2 = reg.acquire("a", pending=True), reg.acquire("a", pending=True)
        assert plain is not None
        assert s1 is not None
        assert s2 is not None

        def counts() -> tuple[int, int]:
            snap = reg.snapshot("a")
            assert snap is not None
            return snap.inflight, snap.pending

        assert counts() == (3, 2)
        s1.started()
        s1.started()  # once only
        assert counts() == (3, 1)
        s2(Outcome.ENDPOINT_FAILURE)  # failed before its first token
        assert counts() == (2, 0)
        s1(Outcome.OK)
        s2.started()  # after its release: nothing
        plain(Outcome.OK)
        assert counts() == (0, 0)

    def test_acquire_of_unknown_endpoint_is_refused(self) -> None:
        """An id not in the registry gets no grant."""
        assert registry("a").acquire("nope") is None
        assert registry("a").inflight("nope") == 0

    def test_acquire_is_refused_while_the_breaker_is_open(self) -> None:
        """Endpoint failures up to the threshold open the breaker, and acquire refuses."""
        reg = registry("a", breaker=BreakerConfig(failure_threshold=2))
        for _ in range(2):
            rel = reg.acquire("a")
            assert rel is not None
            rel(Outcome.ENDPOINT_FAILURE)
        assert reg.acquire("a") is None
        assert reg.inflight("a") == 0

    def test_client_errors_do_not_open_the_breaker(self) -> None:
        """Request-caused errors are the endpoint answering: it stays closed."""
        reg = registry("a", breaker=BreakerConfig(failure_threshold=2))
        for _ in range(5):
            rel = reg.acquire("a")
            assert rel is not None
            rel(Outcome.CLIENT_ERROR)
        assert reg.snapshots()[0].breaker is BreakerState.CLOSED

    def test_release_runs_exactly_once(self) -> None:
        """A second call of the same release changes neither inflight nor the breaker."""
        reg = registry("a", breaker=BreakerConfig(failure_threshold=2))
        keep = reg.acquire("a")
        rel = reg.acquire("a")
        assert keep is not None
        assert rel is not None
        for _ in range(3):
            rel(Outcome.ENDPOINT_FAILURE)
        assert reg.inflight("a") == 1
        assert reg.snapshots()[0].breaker is BreakerState.CLOSED

    async def test_release_runs_exactly_once_under_cancellation(self) -> None:
        """A request task cancelled mid-flight releases once in its finally, and a late
        duplicate release is a no-op."""
        reg = registry("a")
        started = asyncio.Event()
        releases: list[Release] = []

        async def request() -> None:
            rel = reg.acquire("a")
            assert rel is not None
            releases.append(rel)
            outcome = Outcome.ABANDONED
            try:
                started.set()
                await asyncio.sleep(3600)
                outcome = Outcome.OK
            finally:
                rel(outcome)

        task = asyncio.create_task(request())
        await started.wait()
        assert reg.inflight("a") == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        releases[0](Outcome.ENDPOINT_FAILURE)
        assert reg.inflight("a") == 0
        assert reg.snapshots()[0].breaker is BreakerState.CLOSED

    def test_abandoned_probe_returns_the_probe(self) -> None:
        """A half-open probe whose client went away lets the next request probe."""
        clock = ManualClock()
        reg = registry("a", clock=clock, breaker=BreakerConfig(failure_threshold=1, cooldown_s=1))
        rel = reg.acquire("a")
        assert rel is not None
        rel(Outcome.ENDPOINT_FAILURE)
        clock.advance(1)
        probe = reg.acquire("a")
        assert probe is not None
        assert reg.acquire("a") is None
        probe(Outcome.ABANDONED)
        assert reg.acquire("a") is not None

    def test_release_after_removal_is_harmless(self) -> None:
        """A request that outlives its endpoint's removal releases without touching the
        endpoint that replaced it."""
        reg = registry("a")
        rel = reg.acquire("a")
        assert rel is not None
        reg.replace([])
        reg.replace([info("a")])
        rel(Outcome.ENDPOINT_FAILURE)
        assert reg.inflight("a") == 0

    @given(st.lists(st.tuples(st.booleans(), st.integers(0, 20)), max_size=80))
    def test_inflight_counts_unreleased_grants(self, ops: list[tuple[bool, int]]) -> None:
        """Under any mix of acquires and (repeated) releases, inflight equals the grants
        not yet released."""
        reg = registry("a")
        grants: list[Release] = []
        released: set[int] = set()
        for acquire, pick in ops:
            if acquire or not grants:
                rel = reg.acquire("a")
                assert rel is not None
                grants.append(rel)
            else:
                i = pick % len(grants)
                grants[i](Outcome.OK)
                released.add(i)
            assert reg.inflight("a") == len(grants) - len(released)


class TestLastUsed:
    """Last-used times record dispatches only."""

    def test_last_used_leaves_never_used_out(self) -> None:
        """Endpoints never dispatched to are absent, not zero."""
        clock = ManualClock(start_wall=1.9e9)
        reg = registry("a", "b", "c", clock=clock)
        reg.acquire("b")
        assert reg.last_used() == {"b": 1.9e9}

    def test_last_used_is_the_wall_clock_of_the_latest_dispatch(self) -> None:
        """Each grant moves last_used to the current wall-clock time."""
        clock = ManualClock(start_wall=1.9e9)
        reg = registry("a", clock=clock)
        reg.acquire("a")
        clock.advance(42)
        reg.acquire("a")
        assert reg.last_used() == {"a": 1.9e9 + 42}

    def test_refused_acquire_does_not_count_as_use(self) -> None:
        """An open breaker's refusal is not a dispatch: last_used does not move."""
        clock = ManualClock(start_wall=1.9e9)
        reg = registry("a", clock=clock, breaker=BreakerConfig(failure_threshold=1))
        rel = reg.acquire("a")
        assert rel is not None
        rel(Outcome.ENDPOINT_FAILURE)
        clock.advance(1)
        assert reg.acquire("a") is None
        assert reg.last_used() == {"a": 1.9e9}


class TestDeparted:
    """A removed endpoint counts its requests until they finish, then is forgotten."""

    def test_removed_endpoint_reports_inflight_until_its_requests_finish(self) -> None:
        """A replica that left the list is reported with its in-flight count, then 0."""
        clock = ManualClock()
        reg = Registry(clock=clock)
        reg.replace([info("a", "m"), info("b", "m")])
        release = reg.acquire("a")
        assert release is not None
        reg.replace([info("b", "m")])
        assert reg.departed_inflight() == {"a": 1}
        release(Outcome.OK)
        assert reg.departed_inflight() == {"a": 0}

    def test_departed_endpoint_is_forgotten_after_the_linger(self) -> None:
        """Once idle and past the linger, a removed endpoint is no longer reported."""
        clock = ManualClock()
        reg = Registry(clock=clock)
        reg.replace([info("a", "m")])
        reg.replace([])
        assert reg.departed_inflight(linger_s=5) == {"a": 0}
        clock.advance(6)
        assert reg.departed_inflight(linger_s=5) == {}

    def test_endpoint_that_returns_is_not_departed(self) -> None:
        """An id back in the list is live again, not departed."""
        reg = Registry(clock=ManualClock())
        reg.replace([info("a", "m")])
        reg.replace([])
        reg.replace([info("a", "m")])
        assert reg.departed_inflight() == {}
