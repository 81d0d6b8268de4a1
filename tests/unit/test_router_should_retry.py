"""Which of the router's error answers tell the SDKs to retry (`x-should-retry`).

The openai and anthropic packages retry 408, 409, 429 and 5xx twice on their own
unless the answer says otherwise: where the router has already retried or waited
for the client, a retry of theirs only multiplies the load and the wait.
"""

from __future__ import annotations

from typing import Any

from llmgw.router.errors import FlowRefused, NoReplica
from llmgw.router.request.refusals import flow_refused, retry_after, unavailable
from llmgw.testing.forwarder import refuse, reply
from tests.unit.router_world import World


def world(n: int, extra: str = "") -> World:
    lines = "".join(
        f'  - {{id: {chr(97 + i)}, url: "http://10.0.0.{i + 1}:8000", models: [m]}}\n'
        for i in range(n)
    )
    return World(f"endpoints:\n{lines}policy: round_robin\n{extra}")


def once(w: World) -> Any:
    async def main() -> Any:
        return await w.send()

    return w.run(main)


class TestRelayedFailures:
    """An engine's error relayed after the router's own retries is not the SDKs' to retry."""

    def test_failures_on_every_replica_say_false(self) -> None:
        """Two replicas answered 500: the relayed 500 says false, the engine's Retry-After kept."""
        w = world(2)
        w.fake.script("a", reply(500))
        w.fake.script("b", reply(503, headers={"Retry-After": "3"}))
        r = once(w)
        assert (
            r.status,
            r.headers["Retry-After"],
            r.headers["x-should-retry"],
        ) == (503, "3", "false")

    def test_one_attempt_leaves_the_sdks_to_decide(self) -> None:
        """One replica, one attempt: the router retried nothing, so it says nothing."""
        w = world(1)
        w.fake.script("a", reply(500))
        r = once(w)
        assert (r.status, r.headers.get("x-should-retry")) == (500, None)

    def test_max_retries_zero_leaves_the_sdks_to_decide(self) -> None:
        """An operator who turned the router's retries off left them to the clients."""
        w = world(2, "max_retries: 0\n")
        w.fake.script("a", reply(502))
        w.fake.script("b", reply(502))
        r = once(w)
        assert (r.status, r.headers.get("x-should-retry")) == (502, None)

    def test_an_engine_refusing_the_router_key_says_false(self) -> None:
        """engine_refused_key is the operator's to fix, whatever was tried."""
        w = world(1)
        w.fake.script("a", reply(401))
        r = once(w)
        assert (r.status, r.headers["x-should-retry"]) == (502, "false")

    def test_connect_errors_everywhere_say_false(self) -> None:
        """Nothing answered on any replica after the router's retry: 503 with false."""
        w = world(2)
        w.fake.script("a", refuse())
        w.fake.script("b", refuse())
        r = once(w)
        assert (r.status, r.headers["x-should-retry"]) == (503, "false")

    def test_a_connect_error_without_a_retry_says_true(self) -> None:
        """The one replica refused the connection once: a later try may find it back."""
        w = world(1)
        w.fake.script("a", refuse())
        r = once(w)
        assert (r.status, r.headers["x-should-retry"]) == (503, "true")


class TestRefusals:
    """The router's own refusals: a wait that may end says true, one already waited false."""

    def test_retry_after_within_a_minute_says_true(self) -> None:
        """A rate limit's or a full queue's seconds are worth waiting for."""
        assert retry_after(5) == {"Retry-After": "5", "x-should-retry": "true"}

    def test_retry_after_past_a_minute_says_false(self) -> None:
        """Minutes are the application's to wait, not the SDKs' to sleep through."""
        assert retry_after(61)["x-should-retry"] == "false"

    def test_held_to_the_deadline_says_false(self) -> None:
        """A request held to hold_timeout_s would be held as long again."""
        exc = NoReplica("m", "held too long", retry_after_s=5, again=False)
        assert unavailable(exc).header("x-should-retry") == "false"

    def test_a_full_hold_queue_says_true(self) -> None:
        """Refused at once for a moment's crowd: worth one more try."""
        assert unavailable(NoReplica("m", "too many waiting")).header("x-should-retry") == "true"

    def test_flow_queue_full_says_true_and_waited_out_false(self) -> None:
        """429 flow_queue_full frees as requests end; 503 flow_wait_exceeded was waited."""
        full = FlowRefused("m", "full", status=429, code="flow_queue_full", retry_after_s=2)
        waited = FlowRefused("m", "waited", status=503, code="flow_wait_exceeded", retry_after_s=2)
        assert (
            flow_refused(full).header("x-should-retry"),
            flow_refused(waited).header("x-should-retry"),
        ) == ("true", "false")

    def test_held_past_hold_timeout_in_the_proxy_says_false(self) -> None:
        """A model with no replica, held to hold_timeout_s: 503 no_replica with false."""
        w = World("models: [m]\nendpoints: []\nhold_timeout_s: 2\n")
        r = once(w)
        assert (
            r.status,
            r.json()["error"]["code"],
            r.headers["x-should-retry"],
        ) == (503, "no_replica", "false")
