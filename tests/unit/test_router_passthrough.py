"""The passed-through routes' handler in memory: what a refusal costs and what reaches
the engine (router/apis/passthrough.py), through the router's whole route table."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import msgspec
import pytest

from llmgw.router.apis import catalog
from llmgw.router.apis.passthrough import PassThrough
from llmgw.router.http.answers import Whole
from llmgw.router.http.routes import FastRoutes
from llmgw.router.http.server import FastServer
from llmgw.router.routing.affinity import RouteKey
from llmgw.runtime.httpserver import Edge, ServerLimits, openai_error
from llmgw.testing.forwarder import reply
from tests.unit.router_world import Answered, Pipe, World

KEY = "sk-alice"
AUTH = f"Bearer {KEY}"
DIGEST = hashlib.sha256(KEY.encode()).hexdigest()
ONE_RPM = f"api_keys: [{{name: alice, sha256: {DIGEST}, rpm: 1}}]\n"
MESSAGE = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def world(extra: str = "") -> World:
    """A router with one replica `r1` of model `m` that answers 200 to everything."""
    w = World("endpoints: [{id: r1, url: 'http://10.0.0.9:1', models: [m]}]\n" + extra)
    w.fake.script("r1", reply(200, b'{"id":"served"}'))
    return w


async def send(w: World, path: str, body: bytes, headers: dict[str, str] | None = None) -> Answered:
    """One request through the route table (passed-through routes included)."""
    routes = FastRoutes(w.proxy, PassThrough(w.proxy))
    edge = Edge(ServerLimits(decompress=False), openai_error, name="router")
    server = FastServer(edge, routes, max_body_bytes=w.router.cfg.max_body_bytes)
    hdrs = {"Host": "router", "Content-Type": "application/json", "Connection": "close"}
    hdrs.update(headers or {})
    hdrs["Content-Length"] = str(len(body))
    head = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
    conn = server.protocol()
    pipe = Pipe(conn)
    conn.connection_made(pipe)
    conn.data_received(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
    await pipe.closed
    return Answered(bytes(pipe.out))


def too_deep(doc: dict[str, Any], session: str | None) -> RouteKey:
    raise RecursionError("maximum recursion depth exceeded")


class TestTooDeepToKey:
    """A body the decoder took but too deep to key is refused, and costs its key nothing."""

    def test_refused_in_one_line_and_the_key_keeps_its_request(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """With 1 rpm, the 400 for a body too deep to key leaves the minute's request for
        the next one, which the engine serves; the refusal is one log line."""
        w = world(ONE_RPM)
        body = msgspec.json.encode(MESSAGE)
        auth = {"x-api-key": KEY}

        async def main() -> tuple[Answered, Answered]:
            with monkeypatch.context() as m:
                m.setattr(catalog.MESSAGES, "key", too_deep)
                deep = await send(w, "/v1/messages", body, auth)
            return deep, await send(w, "/v1/messages", body, auth)

        with caplog.at_level(logging.WARNING):
            deep, after = w.run(main)
        assert (deep.status, deep.json()["error"]["type"]) == (400, "invalid_request_error")
        assert "nested too deeply" in deep.json()["error"]["message"]
        assert (after.status, after.body) == (200, b'{"id":"served"}')
        lines = [r.getMessage() for r in caplog.records if "refused request" in r.getMessage()]
        assert len(lines) == 1, lines
        assert "json nested too deeply" in lines[0]


LLAMACPP_ADAPTER = (
    "endpoints: [{id: r1, url: 'http://10.0.0.9:1', models: [m, ad], lora_ids: [ad]}]\n"
)
FORM = (
    b'--BND\r\nContent-Disposition: form-data; name="model"\r\n\r\nad\r\n'
    b'--BND\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF\r\n'
    b"--BND--\r\n"
)


class TestUploadForAnAdapter:
    """An audio upload naming a llama.cpp replica's adapter goes to it as it came."""

    def test_the_form_is_forwarded_untouched(self) -> None:
        """The multipart body is not rewritten as JSON (there is no `lora` field to add
        to a form): the engine gets it byte for byte and its answer is relayed."""
        w = World(LLAMACPP_ADAPTER)
        w.fake.script("r1", reply(404, b'{"error":{"message":"File Not Found"}}'))
        ctype = {"Content-Type": "multipart/form-data; boundary=BND"}
        got = w.run(lambda: send(w, "/v1/audio/transcriptions", FORM, ctype))
        assert got.status == 404, got.body
        assert [c.body for c in w.fake.calls] == [FORM]


class TestMessagesRequestId:
    """A Messages answer carries its id as `request-id`, at no cost to the usual answer."""

    def test_a_whole_answer_has_it_without_its_head_being_read_back(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The engine's 200 carries `request-id` equal to `x-request-id`, put there as its
        head was made, not found by decoding the head's lines again per answer (the
        lookup `Whole.header` is for readers off the request path)."""
        w = world()
        read_back: list[str] = []
        real = Whole.header

        def counted(self: Whole, name: str) -> str | None:
            read_back.append(name)
            return real(self, name)

        monkeypatch.setattr(Whole, "header", counted)
        got = w.run(lambda: send(w, "/v1/messages", msgspec.json.encode(MESSAGE)))
        monkeypatch.undo()
        assert (got.status, got.body) == (200, b'{"id":"served"}')
        assert got.headers["request-id"] == got.headers["x-request-id"]
        assert read_back == []

    def test_an_error_has_it_too(self) -> None:
        """An engine's error, reshaped to Anthropic's, and the router's own refusal."""
        w = world()
        w.fake.script("r1", reply(400, b'{"error":{"message":"bad"}}'))
        got = w.run(lambda: send(w, "/v1/messages", msgspec.json.encode(MESSAGE)))
        assert got.status == 400
        assert got.headers["request-id"] == got.headers["x-request-id"]
        got = w.run(lambda: send(w, "/v1/messages", b'{"model": "nope", "max_tokens": 1}'))
        assert got.status == 404
        assert got.headers["request-id"] == got.headers["x-request-id"]
