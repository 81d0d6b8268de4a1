"""max_answer_bytes in memory: the real Proxy, scripted engines, virtual time."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from llmgw.testing.forwarder import Scripted, reply
from tests.unit.router_world import Answered, Pipe, World
from tests.unit.test_router_passthrough import send

BOUND = 1000
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def world(n: int = 2, extra: str = "") -> World:
    lines = "".join(
        f'  - {{id: {chr(97 + i)}, url: "http://10.0.0.{i + 1}:8000", models: [m]}}\n'
        for i in range(n)
    )
    return World(f"endpoints:\n{lines}policy: round_robin\nmax_answer_bytes: {BOUND}\n{extra}")


def once(w: World) -> Any:
    async def main() -> Any:
        return await w.send()

    return w.run(main)


def answer(size: int) -> bytes:
    """A chat answer of exactly `size` bytes, its usage last."""
    bare = {"id": "x", "choices": [{"message": {"content": ""}}], "usage": USAGE}
    pad = size - len(json.dumps(bare).encode())
    bare["choices"][0]["message"]["content"] = "x" * pad
    body = json.dumps(bare).encode()
    assert len(body) == size
    return body


def series(w: World, prefix: str) -> float:
    for line in w.router.metrics.render().decode().splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


class TestWholeAnswers:
    """A whole answer within the bound is held; past it, relayed as it arrives."""

    def test_an_answer_at_the_bound_is_held_whole(self) -> None:
        """Exactly max_answer_bytes: one whole answer with its Content-Length, counted."""
        w = world(1)
        body = answer(BOUND)
        w.fake.script("a", reply(200, body))
        r = once(w)
        assert (r.status, r.body, r.streamed) == (200, body, False)
        assert series(w, 'llmgw_router_prompt_tokens_total{model="m"}') == 5
        assert series(w, "llmgw_router_unbuffered_answers_total{") == 0

    def test_an_answer_past_the_bound_is_relayed_with_its_usage(self) -> None:
        """One byte more: the same bytes relayed chunked, its usage read from its tail,
        counted as unbuffered; the endpoint served it (its breaker stays closed)."""
        w = world(1, "breaker: {failure_threshold: 1}\n")
        body = answer(BOUND + 1)
        w.fake.script("a", reply(200, body))
        r = once(w)
        assert (r.status, r.body, r.streamed) == (200, body, True)
        assert r.headers["x-llmgw-endpoint"] == "a"
        assert series(w, 'llmgw_router_prompt_tokens_total{model="m"}') == 5
        unbuffered = 'llmgw_router_unbuffered_answers_total{endpoint="a",model="m"}'
        assert series(w, unbuffered) == 1
        assert w.breaker("a") == "closed"

    def test_an_engine_breaking_off_leaves_the_answer_cut(self) -> None:
        """An engine that breaks off after the bound: the client's chunked answer has no
        last chunk (never a clean end), counted stream_broken, the replica's failure."""
        w = world(1, "breaker: {failure_threshold: 1}\n")
        first = answer(BOUND + 1)
        broken = Scripted(chunks=(first, b"more"), fail_after=1, is_stream=True)
        w.fake.script("a", broken)
        r = once(w)
        assert (r.status, r.body, r.streamed, r.complete) == (200, first, True, False)
        broke = (
            'llmgw_router_requests_total{code="200",endpoint="a",model="m",outcome="stream_broken"}'
        )
        assert series(w, broke) == 1
        assert w.breaker("a") == "open"

    def test_an_answer_shorter_than_it_declared_is_what_came(self) -> None:
        """A body in two chunks that declared 40 bytes more than came: the client gets
        the bytes that came, none of the room made for the rest."""
        w = world(1)
        body = answer(950)
        declared = (("Content-Length", "990"),)
        w.fake.script(
            "a", Scripted(chunks=(body[:500], body[500:]), is_stream=True, headers=declared)
        )
        r = once(w)
        assert (r.status, r.body, r.streamed) == (200, body, False)

    def test_a_declared_length_past_the_bound_is_not_read_first(self) -> None:
        """A Content-Length over the bound is believed: relayed from its first byte."""
        w = world(1)
        w.fake.script("a", reply(200, b'{"id":"x"}', headers={"Content-Length": "10000000000"}))
        r = once(w)
        assert (r.status, r.body, r.streamed) == (200, b'{"id":"x"}', True)


class TestOtherApis:
    """The usage of a Responses or Messages answer over the bound is read from its tail."""

    @pytest.mark.parametrize(
        ("path", "usage"),
        [
            ("/v1/responses", {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}),
            ("/v1/messages", {"input_tokens": 5, "output_tokens": 2}),
        ],
    )
    def test_its_usage_is_counted(self, path: str, usage: dict[str, int]) -> None:
        """An answer of twice the bound, its usage last but one field: 5 prompt tokens."""
        w = world(1)
        doc = {"id": "x", "output": "y" * (2 * BOUND), "usage": usage, "user": None}
        body = json.dumps(doc).encode()
        w.fake.script("a", reply(200, body))

        async def main() -> Any:
            return await send(w, path, b'{"model": "m", "input": "hi", "max_tokens": 4}')

        r = w.run(main)
        assert (r.status, r.body, r.streamed) == (200, body, True)
        assert series(w, 'llmgw_router_prompt_tokens_total{model="m"}') == 5


class TestErrorAnswers:
    """An error answer past the bound is the replica's failure, never held."""

    def test_another_replica_serves(self) -> None:
        """A 500 over the bound on one replica: retried on the other, the first's breaker
        counts the failure."""
        w = world(2, "breaker: {failure_threshold: 1}\n")
        w.fake.script("a", reply(500, b"e" * (BOUND + 1)))
        w.fake.script("b", reply(200, b'{"id":"x"}'))
        r = once(w)
        assert (r.status, r.body, w.fake.tried()) == (200, b'{"id":"x"}', ["a", "b"])
        assert w.breaker("a") == "open"

    def test_with_none_left_the_client_gets_a_502_in_openais_shape(self) -> None:
        """Every replica answers 503 over the bound: 502 naming max_answer_bytes."""
        w = world(2)
        for eid in "ab":
            w.fake.script(eid, reply(503, b"e" * (BOUND + 1)))
        r = once(w)
        assert r.status == 502
        err = r.json()["error"]
        assert (err["type"], err["code"]) == ("upstream_error", "answer_too_large")
        assert "HTTP 503" in err["message"]
        assert "max_answer_bytes" in err["message"]


class TestMessagesErrors:
    """A Messages error answer past the bound is Anthropic's 502, not the engine's bytes."""

    def test_a_400_over_the_bound_is_an_api_error(self) -> None:
        """A 400 whose body is over the bound, nothing sent yet: 502 in Anthropic's shape
        (type api_error) naming max_answer_bytes, whole, with its request id."""
        w = world(1)
        w.fake.script("a", reply(400, b"e" * (BOUND + 1)))

        async def main() -> Any:
            return await send(w, "/v1/messages", b'{"model": "m", "max_tokens": 4}')

        r = w.run(main)
        assert (r.status, r.streamed) == (502, False)
        doc = r.json()
        assert (doc["type"], doc["error"]["type"]) == ("error", "api_error")
        assert "max_answer_bytes" in doc["error"]["message"]
        assert r.headers["request-id"] == r.headers["x-request-id"]

    def test_a_chat_400_over_the_bound_is_still_relayed(self) -> None:
        """The same on the chat route: the engine's answer relayed as it comes (its
        shape is already the route's)."""
        w = world(1)
        w.fake.script("a", reply(400, b"e" * (BOUND + 1)))
        r = once(w)
        assert (r.status, r.body, r.streamed) == (400, b"e" * (BOUND + 1), True)


HELD = "llmgw_router_held_answer_bytes "


def held(w: World) -> float:
    """The held-answer-bytes gauge (it must be there)."""
    text = w.router.metrics.render().decode()
    assert HELD in text
    return series(w, HELD)


def slowly(body: bytes, at: int, gap_s: float) -> Scripted:
    """A whole answer in two chunks, its first `at` bytes, the rest `gap_s` later."""
    return Scripted(chunks=(body[:at], body[at:]), gap_s=gap_s, is_stream=True)


class PausingPipe(Pipe):
    """A client that reads nothing: a write over 64 KiB fills its transport's buffer."""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        super().write(data)
        if len(data) > 64 * 1024:
            self.protocol.pause_writing()


def opened(w: World, pipe_type: type[Pipe] = Pipe) -> Pipe:
    """One keep-alive chat request written into the router's server; its pipe."""
    raw = b'{"model": "m", "messages": []}'
    head = f"Host: router\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
    conn = w._server().protocol()
    pipe = pipe_type(conn)
    conn.connection_made(pipe)
    conn.data_received(f"POST /v1/chat/completions HTTP/1.1\r\n{head}\r\n".encode() + raw)
    return pipe


class TestHeldAnswers:
    """Whole answers held at once stay within max_held_answer_bytes; past it, relayed."""

    def test_an_answer_that_would_pass_the_budget_is_relayed(self) -> None:
        """Two 950-byte answers read at once under a budget of 1,500: the first held whole,
        the second (900 + 900 held) relayed as it arrives, its bytes the same, none
        refused; the gauge shows the first's 900 while both are in, 0 after."""
        w = world(1, "max_held_answer_bytes: 1500\n")
        body = answer(950)
        w.fake.script("a", slowly(body, 900, 2.0))

        async def main() -> Any:
            first = asyncio.create_task(w.send())
            await asyncio.sleep(0.5)
            second = asyncio.create_task(w.send())
            await asyncio.sleep(0.5)
            mid = held(w)
            return await first, await second, mid

        first, second, mid = w.run(main)
        assert (first.status, first.body, first.streamed) == (200, body, False)
        assert (second.status, second.body, second.streamed) == (200, body, True)
        assert mid == 900
        assert held(w) == 0

    def test_an_engine_breaking_off_gives_its_bytes_back(self) -> None:
        """A replica that breaks off after 900 bytes: retried on the other, whose 950
        bytes are then held whole under a budget of 1,000 (900 not left charged)."""
        w = world(2, "max_held_answer_bytes: 1000\n")
        body = answer(950)
        w.fake.script("a", Scripted(chunks=(body[:900], b"x"), fail_after=1, is_stream=True))
        w.fake.script("b", reply(200, body))
        r = once(w)
        assert (r.status, r.body, r.streamed, w.fake.tried()) == (200, body, False, ["a", "b"])
        assert held(w) == 0

    def test_a_client_gone_gives_its_bytes_back(self) -> None:
        """The client leaves while 900 bytes of its answer are held: 0 held after."""
        w = world(1, "max_held_answer_bytes: 1000\n")
        w.fake.script("a", slowly(answer(950), 900, 2.0))

        async def main() -> tuple[float, float]:
            pipe = opened(w)
            await asyncio.sleep(0.5)
            during = held(w)
            pipe.close()
            await asyncio.sleep(0.1)
            return during, held(w)

        assert w.run(main) == (900, 0)

    def test_an_answer_unread_by_its_client_stays_held(self) -> None:
        """A 150,000-byte answer its client does not read stays charged while the
        transport holds it: a second one under a budget of 250,000 is relayed; the
        bytes go back when the transport drains, and once only."""
        w = world(1, "max_answer_bytes: 200000\nmax_held_answer_bytes: 250000\n")
        body = answer(150_000)
        w.fake.script("a", reply(200, body))

        async def main() -> tuple[float, Answered, float, float]:
            pipe = opened(w, PausingPipe)
            await asyncio.sleep(0.1)
            during = held(w)
            second = await w.send()
            pipe.protocol.resume_writing()
            after = held(w)
            pipe.close()
            await asyncio.sleep(0.1)
            return during, second, after, held(w)

        during, second, after, closed = w.run(main)
        assert during == 150_000
        assert (second.status, second.body, second.streamed) == (200, body, True)
        assert (after, closed) == (0, 0)

    def test_a_connection_lost_with_its_answer_unread_gives_the_bytes_back(self) -> None:
        """The client of an unread answer goes away: the transport's bytes go back."""
        w = world(1, "max_answer_bytes: 200000\nmax_held_answer_bytes: 250000\n")
        w.fake.script("a", reply(200, answer(150_000)))

        async def main() -> tuple[float, float]:
            pipe = opened(w, PausingPipe)
            await asyncio.sleep(0.1)
            during = held(w)
            pipe.close()
            await asyncio.sleep(0.1)
            return during, held(w)

        assert w.run(main) == (150_000, 0)
