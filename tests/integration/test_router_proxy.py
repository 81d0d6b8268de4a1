"""The router's proxy and surface against real sim-engines: relay, headers, errors, openai."""

from __future__ import annotations

import urllib.error
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from llmgw.router.request.auth import hash_key
from llmgw.testing import Program

from .router_fixtures import (
    MODEL,
    base_config,
    chat_body,
    endpoint_entries,
    get_json,
    post,
    router,
    sim_engines,
    wait_until_scraped,
)

KEY = "sk-test-123"


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("router-proxy")


@pytest.fixture(scope="module")
def fleet(log_dir: Path) -> Iterator[tuple[Program, list[Program]]]:
    """Two fast sim-engines behind one router with one API key and a small body limit."""
    with sim_engines(log_dir, [50.0, 50.0]) as engines:
        cfg = base_config(
            endpoints=endpoint_entries(engines),
            models=["cold"],
            api_keys=[{"name": "tests", "sha256": hash_key(KEY)}],
            max_body_bytes=64 * 1024,
            hold_timeout_s=0.5,
        )
        with router(log_dir, cfg) as r:
            yield r, engines


@pytest.fixture
def url(fleet: tuple[Program, list[Program]]) -> str:
    return fleet[0].url


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


AUTH = {"Authorization": f"Bearer {KEY}"}


class TestRelay:
    """The router relays answers, streams and headers from real engines."""

    async def test_chat_non_streaming(self, url: str, session: aiohttp.ClientSession) -> None:
        """A chat completion comes back whole with the endpoint and request id headers."""
        r = await post(session, url, chat_body("hello"), headers={**AUTH, "x-request-id": "rq-1"})
        assert r.status == 200, r.body
        assert r.json()["object"] == "chat.completion"
        assert r.endpoint in {"e0", "e1"}
        assert r.headers["x-request-id"] == "rq-1"

    async def test_request_id_is_generated(self, url: str, session: aiohttp.ClientSession) -> None:
        """Without an x-request-id one is made up and echoed."""
        r = await post(session, url, chat_body("hello"), headers=AUTH)
        assert len(r.headers["x-request-id"]) >= 16

    async def test_streaming_ends_with_done(self, url: str, session: aiohttp.ClientSession) -> None:
        """A stream is relayed event by event and ends with [DONE]."""
        r = await post(session, url, chat_body("hi", stream=True, max_tokens=16), headers=AUTH)
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = r.events()
        assert events[-1] == "[DONE]"
        assert len(events) >= 3

    async def test_stream_tells_proxies_in_front_not_to_buffer(
        self, url: str, session: aiohttp.ClientSession
    ) -> None:
        """A relayed stream carries `X-Accel-Buffering: no`, or an nginx in front of the
        router (ingress-nginx buffers by default) holds the events back."""
        r = await post(session, url, chat_body("hi", stream=True, max_tokens=4), headers=AUTH)
        assert r.status == 200
        assert r.headers["x-accel-buffering"] == "no"
        assert r.headers["cache-control"] == "no-cache"

    async def test_completions_and_embeddings(
        self, url: str, session: aiohttp.ClientSession
    ) -> None:
        """/v1/completions and /v1/embeddings are routed too."""
        c = await post(
            session,
            url,
            {"model": MODEL, "prompt": "once upon", "max_tokens": 4},
            path="/v1/completions",
            headers=AUTH,
        )
        e = await post(
            session,
            url,
            {"model": MODEL, "input": "vector me"},
            path="/v1/embeddings",
            headers=AUTH,
        )
        assert (c.status, e.status) == (200, 200)
        assert e.json()["data"][0]["object"] == "embedding"

    async def test_debug_header_shows_scores(
        self, url: str, session: aiohttp.ClientSession
    ) -> None:
        """x-llmgw-debug: 1 adds the decision's scores to the answer."""
        r = await post(session, url, chat_body("why"), headers={**AUTH, "x-llmgw-debug": "1"})
        assert r.headers["x-llmgw-scores"]
        plain = await post(session, url, chat_body("why"), headers=AUTH)
        assert "x-llmgw-scores" not in plain.headers

    async def test_upstream_client_error_is_relayed(
        self, url: str, session: aiohttp.ClientSession
    ) -> None:
        """A 4xx the engine gives for the request itself reaches the client as is."""
        r = await post(session, url, {**chat_body("x"), "max_tokens": -1}, headers=AUTH)
        assert r.status == 400
        assert "error" in r.json()
        assert r.endpoint in {"e0", "e1"}

    def test_openai_package_streams(self, fleet: tuple[Program, list[Program]]) -> None:
        """The official client streams a chat completion through the router."""
        client = openai.OpenAI(base_url=fleet[0].url + "/v1", api_key=KEY, max_retries=0)
        try:
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "stream please"}],
                max_tokens=12,
                stream=True,
            )
            pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        finally:
            client.close()
        assert "".join(pieces)


def _error(r: Any) -> dict[str, Any]:
    body: dict[str, Any] = r.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return body


class TestBadInput:
    """Bad input and missing replicas get OpenAI-shaped refusals."""

    @pytest.mark.parametrize(
        ("body", "headers", "status", "etype"),
        [
            (b"{not json", AUTH, 400, "invalid_request_error"),
            (b'["a list"]', AUTH, 400, "invalid_request_error"),
            (b'{"messages": []}', AUTH, 400, "invalid_request_error"),
            (b'{"model": "nope", "messages": []}', AUTH, 404, "invalid_request_error"),
            (
                b'{"model": "m", "pad": "' + b"x" * 70_000 + b'"}',
                AUTH,
                413,
                "invalid_request_error",
            ),
            (b'{"model": "m", "messages": []}', {"Authorization": "Bearer wrong"}, 401, None),
            (b'{"model": "m", "messages": []}', {}, 401, None),
        ],
        ids=[
            "malformed",
            "not-object",
            "no-model",
            "unknown-model",
            "too-large",
            "bad-key",
            "no-key",
        ],
    )
    async def test_table(
        self,
        url: str,
        session: aiohttp.ClientSession,
        body: bytes,
        headers: dict[str, str],
        status: int,
        etype: str | None,
    ) -> None:
        """Each bad request gets its status and an OpenAI-shaped error body."""
        r = await post(session, url, body, headers=headers)
        assert status == r.status
        err = _error(r)
        assert err["message"]
        if etype is not None:
            assert etype == err["type"]
        assert r.headers["x-request-id"]

    async def test_known_model_without_replica_times_out_503(
        self, url: str, session: aiohttp.ClientSession
    ) -> None:
        """A configured model with no endpoint is held, then 503 with Retry-After."""
        r = await post(session, url, chat_body("x", model="cold"), headers=AUTH)
        assert r.status == 503
        assert int(r.headers["retry-after"]) >= 1
        assert _error(r)["type"] == "service_unavailable"


class TestSurface:
    """The router's models, health, metrics and admin routes."""

    def test_models_lists_known_models(self, url: str) -> None:
        """/v1/models is the union of endpoint and configured models, OpenAI's list shape."""
        doc = get_json(url + "/v1/models", headers=AUTH)
        assert doc["object"] == "list"
        assert [m["id"] for m in doc["data"]] == ["cold", MODEL]

    def test_model_retrieve(self, fleet: tuple[Program, list[Program]]) -> None:
        """GET /v1/models/{id} (the openai package's models.retrieve) answers the model's
        object, and an unknown one OpenAI's 404 model_not_found."""
        client = openai.OpenAI(base_url=fleet[0].url + "/v1", api_key=KEY, max_retries=0)
        try:
            got = client.models.retrieve(MODEL)
            with pytest.raises(openai.NotFoundError) as info:
                client.models.retrieve("org/nope")
        finally:
            client.close()
        assert (got.id, got.object) == (MODEL, "model")
        assert info.value.code == "model_not_found"

    @pytest.mark.parametrize(
        ("method", "path", "status"),
        [
            ("POST", "/v1/assistants", 404),
            ("GET", "/v1/responses", 405),
            ("GET", "/v1/nothing/here", 404),
            ("GET", "/v1/chat/completions", 405),
            ("DELETE", "/v1/models", 405),
        ],
    )
    async def test_unknown_route_or_method_is_openai_shaped(
        self, url: str, session: aiohttp.ClientSession, method: str, path: str, status: int
    ) -> None:
        """A route or method the router does not serve answers an OpenAI error body, not text."""
        async with session.request(method, url + path, headers=AUTH) as resp:
            assert resp.status == status
            doc = await resp.json()
        assert set(doc["error"]) == {"message", "type", "param", "code"}

    def test_models_needs_key(self, url: str) -> None:
        """/v1/models is behind the API key too."""
        with pytest.raises(urllib.error.HTTPError) as info:
            get_json(url + "/v1/models")
        info.value.close()
        assert info.value.code == 401

    async def test_health_ready_metrics(self, url: str, session: aiohttp.ClientSession) -> None:
        """healthz and readyz answer 200; /metrics carries the request counter."""
        await wait_until_scraped(url, ["e0", "e1"])
        await post(session, url, chat_body("count me"), headers=AUTH)
        assert get_json(url + "/healthz")["status"] == "ok"
        assert get_json(url + "/readyz")["ready"] is True
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
        assert any(
            line.startswith("llmgw_router_requests_total{") and 'code="200"' in line
            for line in text.splitlines()
        )
        assert "llmgw_router_breaker_state" in text
        assert "llmgw_router_scrape_age_seconds" in text

    def test_admin_views_on_loopback(self, url: str) -> None:
        """Admin views answer a loopback caller when no admin token is set."""
        eps = get_json(url + "/admin/endpoints")
        assert [s["info"]["id"] for s in eps["endpoints"]] == ["e0", "e1"]
        assert MODEL in eps["decisions"]
        usage = get_json(url + "/admin/usage")
        assert usage["router_id"]
        assert set(usage["last_used"]) <= {"e0", "e1"}
