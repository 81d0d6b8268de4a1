"""The proxy's retry and hold rules in memory: the real Proxy, scripted engines, virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.snapshot import Snapshot
from llmgw.router.request.attempts import Attempts, another, is_retryable
from llmgw.testing import vtime
from llmgw.testing.forwarder import refuse, reply, stream
from llmgw.wire.endpoints import EndpointInfo
from tests.unit.router_world import World

TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
DONE = b"data: [DONE]\n\n"
ERROR_EVENT = b'data: {"error":{"message":"engine died","code":500}}\n\n'


def world(n: int = 2, extra: str = "") -> World:
    lines = "".join(
        f'  - {{id: {chr(97 + i)}, url: "http://10.0.0.{i + 1}:8000", models: [m]}}\n'
        for i in range(n)
    )
    return World(f"endpoints:\n{lines}policy: round_robin\n{extra}")


def once(w: World, **kw: Any) -> Any:
    async def main() -> Any:
        return await w.send(**kw)

    return w.run(main)


def snap(eid: str, breaker: BreakerState = BreakerState.CLOSED) -> Snapshot:
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
    )


class TestAttempts:
    """The retry rule itself: retries left, the deadline, somewhere else to go."""

    def test_each_retry_counts_one_and_leaves_the_replica_out(self) -> None:
        """Two retries allowed: two yeses, each replica left out after it, then a no."""
        att = Attempts(deadline=10.0, retries=2)
        assert [att.retry(e, 1.0) for e in ("a", "b", "c")] == [True, True, False]
        assert (list(att.tried), att.retries_left) == (["a", "b"], 0)

    def test_no_retry_at_or_past_the_deadline(self) -> None:
        """At the deadline no retry is granted and none is spent."""
        att = Attempts(deadline=10.0, retries=2)
        assert not att.retry("a", 10.0)
        assert (list(att.tried), att.retries_left) == ([], 2)

    def test_no_retry_with_nowhere_else_to_go(self) -> None:
        """With no other replica to choose, a retry is refused and none is spent."""
        att = Attempts(deadline=10.0, retries=2)
        assert not att.retry("a", 1.0, elsewhere=False)
        assert att.retries_left == 2

    def test_a_skipped_replica_is_left_out_without_spending_a_retry(self) -> None:
        """A replica whose probe was taken is left out, and the retries stay."""
        att = Attempts(deadline=10.0, retries=1)
        att.skip("a")
        assert (list(att.tried), att.retries_left) == (["a"], 1)

    def test_another_replica_means_one_untried_with_its_breaker_not_open(self) -> None:
        """Only an untried replica whose breaker is not open counts as somewhere else."""
        snaps = [snap("a"), snap("b", BreakerState.OPEN), snap("c")]
        assert another(snaps, (), "a")
        assert not another(snaps, ["c"], "a")
        assert another([snap("a"), snap("b", BreakerState.HALF_OPEN)], (), "a")

    @pytest.mark.parametrize(
        ("status", "retried"),
        [
            (200, False),
            (400, False),
            (404, False),
            (401, True),
            (403, True),
            (429, True),
            (500, True),
            (503, True),
        ],
    )
    def test_which_statuses_are_retried(self, status: int, retried: bool) -> None:
        """5xx, 429 and the engine refusing the router's key are retried; other answers are not."""
        assert is_retryable(status) is retried


class TestRetryRules:
    """When the proxy retries a request elsewhere and what it relays."""

    def test_connect_error_is_retried_on_another_replica(self) -> None:
        """Nothing reached the engine: the next replica answers, one retry is counted."""
        w = world()
        w.fake.script("a", refuse())
        w.fake.script("b", reply(200, b'{"id":"x"}'))
        r = once(w)
        assert (r.status, r.json(), r.headers["x-llmgw-endpoint"]) == (200, {"id": "x"}, "b")
        assert w.fake.tried() == ["a", "b"]
        assert w.retries() == {"a": 1.0}

    def test_retry_of_an_alias_counts_under_the_served_name(self) -> None:
        """A request naming an alias is retried under the served name, as its answer is
        counted (docs/metrics.md): it made a series of the alias's own."""
        w = World(
            "endpoints:\n"
            '  - {id: a, url: "http://10.0.0.1:8000", models: [m, m-alias]}\n'
            '  - {id: b, url: "http://10.0.0.2:8000", models: [m, m-alias]}\n'
            "policy: round_robin\n"
        )
        w.fake.script("a", refuse())
        w.fake.script("b", reply(200, b'{"id":"x"}'))
        assert once(w, body={"model": "m-alias", "messages": []}).status == 200
        text = w.router.metrics.render().decode()
        retried = [x for x in text.splitlines() if x.startswith("llmgw_router_retries_total{")]
        assert retried == ['llmgw_router_retries_total{endpoint="a",model="m"} 1.0']

    def test_5xx_everywhere_relays_the_last_answer_with_its_retry_after(self) -> None:
        """Each replica tried once; the last engine's own status, body and Retry-After reach
        the client."""
        w = world()
        w.fake.script("a", reply(502, b'{"e":"a"}'))
        w.fake.script("b", reply(503, b'{"e":"b"}', headers={"Retry-After": "7"}))
        r = once(w)
        assert (r.status, r.json(), r.headers["Retry-After"]) == (503, {"e": "b"}, "7")
        assert sorted(w.fake.tried()) == ["a", "b"]

    def test_retries_are_bounded_by_max_retries(self) -> None:
        """max_retries: 1 with three failing replicas: two attempts, then the last answer."""
        w = world(3, "max_retries: 1\n")
        for eid in "abc":
            w.fake.script(eid, reply(429, b'{"e":"%s"}' % eid.encode()))
        r = once(w)
        assert r.status == 429
        assert len(w.fake.tried()) == 2
        assert sum(w.retries().values()) == 1.0

    def test_client_error_is_relayed_and_not_charged(self) -> None:
        """A 400 is the request's fault: relayed at once, the breaker counts no failure."""
        w = world(2, "breaker: {failure_threshold: 1}\n")
        w.fake.script("a", reply(400, b'{"error":"bad"}'))
        w.fake.script("b", reply(200))
        r = once(w)
        assert (r.status, w.fake.tried(), w.breaker("a")) == (400, ["a"], "closed")

    def test_failures_open_the_breaker(self) -> None:
        """A 5xx is the endpoint's failure: with threshold 1 its breaker opens."""
        w = world(2, "breaker: {failure_threshold: 1}\n")
        w.fake.script("a", reply(500))
        w.fake.script("b", reply(200))
        assert once(w).status == 200
        assert (w.breaker("a"), w.breaker("b")) == ("open", "closed")

    def test_every_replica_failing_to_connect_is_503(self) -> None:
        """No answer to relay: OpenAI's 503 naming the last error, Retry-After set."""
        w = world()
        w.fake.script("a", refuse())
        w.fake.script("b", refuse())
        r = once(w)
        assert r.status == 503
        assert "Retry-After" in r.headers
        assert "refused" in r.json()["error"]["message"]

    def test_a_retry_gets_only_the_time_left(self) -> None:
        """The second attempt's timeout is the request's deadline minus the time spent."""
        w = world(2, "request_timeout_s: 10\n")
        w.fake.script("a", reply(503, delay_s=4))
        w.fake.script("b", reply(200))
        start = w.clock.monotonic()
        assert once(w).status == 200
        assert [c.timeout_s for c in w.fake.calls] == [10.0, 6.0]
        assert w.clock.monotonic() - start == pytest.approx(4.0)

    def test_no_retry_once_the_deadline_passed(self) -> None:
        """An engine silent past the deadline: one attempt, 503, the clock at the deadline."""
        w = world(2, "request_timeout_s: 5\n")
        w.fake.script("a", reply(200, delay_s=60))
        w.fake.script("b", reply(200))
        start = w.clock.monotonic()
        r = once(w)
        assert (r.status, w.fake.tried()) == (503, ["a"])
        assert w.clock.monotonic() - start == pytest.approx(5.0)

    def test_stream_failing_before_its_first_chunk_is_retried(self) -> None:
        """Nothing reached the client yet: the next replica's stream is relayed whole."""
        w = world()
        w.fake.script("a", stream([TOKEN, DONE], fail_after=0))
        w.fake.script("b", stream([TOKEN, DONE]))
        r = once(w)
        assert (r.status, r.streamed, r.body) == (200, True, TOKEN + DONE)
        assert w.fake.tried() == ["a", "b"]

    def test_stream_failing_after_its_first_chunk_ends_with_an_error_event(self) -> None:
        """Bytes reached the client: never retried; the stream ends with a 502 error event
        and [DONE], and the endpoint is charged."""
        w = world(2, "breaker: {failure_threshold: 1}\n")
        w.fake.script("a", stream([TOKEN, TOKEN, DONE], fail_after=1))
        w.fake.script("b", stream([TOKEN, DONE]))
        r = once(w)
        assert w.fake.tried() == ["a"]
        assert r.body.startswith(TOKEN)
        assert r.body.endswith(DONE)
        assert b'"code":502' in r.body
        assert b"upstream stream broke" in r.body
        assert w.breaker("a") == "open"

    def test_silent_stream_ends_at_the_idle_bound(self) -> None:
        """A gap longer than stream_idle_timeout_s ends the stream there, not at the deadline."""
        w = world(1, "stream_idle_timeout_s: 3\n")
        w.fake.script("a", stream([TOKEN, TOKEN], gap_s=100))
        start = w.clock.monotonic()
        r = once(w)
        assert b"no data for 3s" in r.body
        assert r.body.endswith(DONE)
        assert w.clock.monotonic() - start == pytest.approx(3.0)

    def test_error_event_before_output_is_retried_elsewhere(self) -> None:
        """The engine's 5xx error event before any token: as safe to retry as a 5xx."""
        w = world()
        w.fake.script("a", stream([ERROR_EVENT, DONE]))
        w.fake.script("b", stream([TOKEN, DONE]))
        r = once(w)
        assert (r.body, w.fake.tried(), w.retries()) == (TOKEN + DONE, ["a", "b"], {"a": 1.0})
        assert w.fake.replies[0].closed

    def test_error_event_with_nowhere_else_is_relayed(self) -> None:
        """No other replica: the engine's own error event reaches the client as sent."""
        w = world(1)
        w.fake.script("a", stream([ERROR_EVENT, DONE]))
        r = once(w)
        assert (r.status, r.body, w.retries()) == (200, ERROR_EVENT + DONE, {})


class TestEngineRefusingTheKey:
    """An engine refusing the router's key is the replica's failure."""

    def test_a_401_is_the_replicas_failure_and_retried_elsewhere(self) -> None:
        """An engine refusing the router's key counts against it; another replica serves."""
        w = world(2, "breaker: {failure_threshold: 1}\n")
        w.fake.script("a", reply(401, b'{"error": "Unauthorized"}'))
        w.fake.script("b", reply(200, b'{"id":"x"}'))
        r = once(w)
        assert (r.status, r.json(), w.fake.tried()) == (200, {"id": "x"}, ["a", "b"])
        assert w.breaker("a") == "open"

    @pytest.mark.parametrize("status", [401, 403])
    def test_with_none_left_the_client_gets_a_502_in_openais_shape(self, status: int) -> None:
        """Every replica refuses the key: 502 in OpenAI's error shape, not the engine's body."""
        w = world(2)
        w.fake.script("a", reply(status, b'{"error": "Unauthorized"}'))
        w.fake.script("b", reply(status, b'{"error": "Unauthorized"}'))
        r = once(w)
        assert r.status == 502
        err = r.json()["error"]
        assert (err["type"], err["code"]) == ("upstream_error", "engine_refused_key")
        assert f"HTTP {status}" in err["message"]
        assert r.headers["Content-Type"].startswith("application/json")


class TestHoldRules:
    """How long a request without a replica is held."""

    def test_known_model_without_replica_is_held_until_the_hold_timeout(self) -> None:
        """Held for hold_timeout_s, then 503 with Retry-After 5; its demand shows while held."""
        w = World("models: [m]\nhold_timeout_s: 30\n")
        seen: list[dict[str, int]] = []

        async def main() -> Any:
            task = asyncio.create_task(w.send())
            await asyncio.sleep(1)
            seen.append(w.router.holding.demand())
            return await task

        start = w.clock.monotonic()
        r = w.run(main)
        assert (r.status, r.headers["Retry-After"]) == (503, "5")
        assert "within 30s" in r.json()["error"]["message"]
        assert w.clock.monotonic() - start == pytest.approx(30.0, abs=0.5)
        assert seen == [{"m": 1}]
        assert w.router.holding.demand() == {}

    def test_hold_ends_when_a_replica_arrives(self) -> None:
        """A list with a replica wakes the held request at once; it is served there."""
        w = World("models: [m]\nhold_timeout_s: 30\n")
        w.fake.script("r1", reply(200, b'{"id":"late"}'))

        async def main() -> Any:
            task = asyncio.create_task(w.send())
            await asyncio.sleep(3)
            w.router.apply_endpoints(
                [EndpointInfo(id="r1", url="http://10.0.0.9:1", models=("m",))]
            )
            return await task

        start = w.clock.monotonic()
        r = w.run(main)
        assert (r.status, r.json()) == (200, {"id": "late"})
        assert w.clock.monotonic() - start == pytest.approx(3.0)

    def test_full_hold_queue_answers_at_once(self) -> None:
        """With max_held requests waiting, one more is answered 503 without waiting."""
        w = World("models: [m]\nmax_held: 1\nhold_timeout_s: 30\n")

        async def main() -> Any:
            first = asyncio.create_task(w.send())
            await asyncio.sleep(1)
            t = w.clock.monotonic()
            second = await w.send()
            waited = w.clock.monotonic() - t
            await first
            return second, waited

        r, waited = w.run(main)
        assert (r.status, waited) == (503, 0.0)
        assert "too many requests are already waiting" in r.json()["error"]["message"]

    def test_hold_is_bounded_by_the_request_deadline(self) -> None:
        """request_timeout_s below hold_timeout_s: the request gives up at its deadline."""
        w = World("models: [m]\nhold_timeout_s: 60\nrequest_timeout_s: 4\n")
        start = w.clock.monotonic()
        assert once(w).status == 503
        assert w.clock.monotonic() - start == pytest.approx(4.0, abs=0.5)

    def test_open_breaker_holds_until_its_cooldown_admits_a_probe(self) -> None:
        """The only replica's breaker is open: the request waits (it has not failed there)
        and is the half-open probe once the cooldown passes."""
        w = world(1, "breaker: {failure_threshold: 1, cooldown_s: 2}\n")
        w.fake.script("a", reply(500), reply(200, b'{"id":"probe"}'))
        assert once(w).status == 500
        assert w.breaker("a") == "open"
        start = w.clock.monotonic()
        r = once(w)
        assert (r.status, r.json()) == (200, {"id": "probe"})
        assert 2.0 <= w.clock.monotonic() - start <= 2.6
        assert w.breaker("a") == "closed"

    def test_a_dead_engine_is_answered_within_one_cooldown(self) -> None:
        """Failed probes double the cooldown (2, 4, 8 s), yet no request waits more than the
        first cooldown: it is the probe, or 503 naming the next one."""
        w = world(1, "breaker: {failure_threshold: 1, cooldown_s: 2, max_cooldown_s: 60}\n")
        w.fake.script("a", *(refuse() for _ in range(3)))

        async def main() -> Any:
            out = []
            for _ in range(5):
                start = w.clock.monotonic()
                r = await w.send()
                out.append((r, w.clock.monotonic() - start))
            return out

        got = w.run(main)
        assert [r.status for r, _ in got] == [503] * 5
        assert max(waited for _, waited in got) <= 2.1
        last = got[-1][0]
        # Opened at 0; probes failed at 2 and 6: the next is at 14, the last request at 8.
        assert "breaker is open" in last.json()["error"]["message"]
        assert last.headers["Retry-After"] == "6"
        assert len(w.fake.tried()) == 3


class TestTakenProbe:
    """A request whose only replica's half-open probe is out waits for the probe's verdict."""

    def _world(self, probe_s: float) -> World:
        w = world(1, "breaker: {failure_threshold: 1, cooldown_s: 2}\nhold_timeout_s: 1\n")
        w.fake.script("a", reply(500), reply(200, b'{"id":"probe"}', delay_s=probe_s), reply(200))
        return w

    def _behind_the_probe(self, w: World) -> tuple[Any, Any, float]:
        async def main() -> tuple[Any, Any, float]:
            await w.send()  # opens the breaker
            await asyncio.sleep(2.5)  # the cooldown passed: the next request is the probe
            probe = asyncio.create_task(w.send())
            await asyncio.sleep(0.25)
            start = w.clock.monotonic()
            behind = await w.send()
            waited = w.clock.monotonic() - start
            return behind, await probe, waited

        result: tuple[Any, Any, float] = w.run(main)
        return result

    @pytest.mark.timeout(10)
    def test_held_to_its_deadline_while_the_probe_is_out(self) -> None:
        """A probe slower than the hold: the request behind it is answered 503 at its hold
        deadline, not spun on the busy replica forever."""
        w = self._world(probe_s=5.0)
        behind, probe, waited = self._behind_the_probe(w)
        assert (behind.status, probe.status) == (503, 200)
        assert waited == pytest.approx(1.0, abs=0.1)
        assert w.fake.tried() == ["a", "a"]

    @pytest.mark.timeout(10)
    def test_served_once_the_probe_succeeds(self) -> None:
        """A probe faster than the hold: its success closes the breaker and the request
        behind it is served there."""
        w = self._world(probe_s=0.5)
        behind, probe, waited = self._behind_the_probe(w)
        assert (behind.status, probe.status) == (200, 200)
        assert waited < 1.0
        assert w.fake.tried() == ["a", "a", "a"]


class TestVirtualTime:
    """Virtual time reports a wait that nothing can end."""

    def test_nothing_to_wait_for_is_reported_not_hung(self) -> None:
        """A task awaiting what no timer brings ends in Stuck instead of hanging the test."""
        from llmgw.runtime.clock import ManualClock

        async def forever() -> None:
            await asyncio.Event().wait()

        with pytest.raises(vtime.Stuck):
            vtime.run(forever(), ManualClock())
