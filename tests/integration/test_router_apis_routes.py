"""The passed-through routes beside Responses and Messages, through a real router.

tokenize, detokenize, rerank, score and the audio routes against real
sim-engines: their answers, their bad inputs (status and shape), retries
before the first byte, and one conversation keeping its replica as it moves
between chat, Responses and Messages.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest

from llmgw.testing import Program

from .hostile import assert_openai_error, raw_request
from .router_fixtures import (
    MODEL,
    base_config,
    chat_body,
    endpoint_entries,
    post,
    router,
    sim_engines,
    snapshot,
    wait_until_scraped,
)
from .test_router_stream_faults import set_faults

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Program, list[Program]]]:
    """Three fast sim-engines behind one router with a small body limit."""
    log_dir = tmp_path_factory.mktemp("router-apis-routes")
    with sim_engines(log_dir, [100.0, 100.0, 100.0]) as engines:
        cfg = base_config(
            endpoints=endpoint_entries(engines),
            max_body_bytes=64 * 1024,
            max_upload_bytes=64 * 1024,
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


class TestTokenize:
    """/tokenize and /detokenize through the router."""

    async def test_tokenize_and_back(self, url: str, session: aiohttp.ClientSession) -> None:
        """/tokenize answers vLLM's shape (the model may be left out: the router's only
        one), and /detokenize takes the tokens back."""
        tok = await post(session, url, {"prompt": "hello world"}, path="/tokenize")
        assert tok.status == 200, tok.body
        doc = tok.json()
        assert doc["count"] == len(doc["tokens"]) > 0
        assert doc["max_model_len"] > 0
        back = await post(session, url, {"model": MODEL, "tokens": [1, 2]}, path="/detokenize")
        assert back.status == 200, back.body
        assert isinstance(back.json()["prompt"], str)

    async def test_bad_inputs(self, url: str, session: aiohttp.ClientSession) -> None:
        """Bad bodies are OpenAI-shaped 4xx: not JSON, an unknown model, the engine's own
        refusal, and a GET on a POST route."""
        not_json = await post(session, url, b"{nope", path="/tokenize")
        assert not_json.status == 400
        assert not_json.json()["error"]["type"] == "invalid_request_error"
        unknown = await post(session, url, {"model": "nope", "prompt": "x"}, path="/tokenize")
        assert unknown.status == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
        engine = await post(session, url, {"model": MODEL}, path="/tokenize")
        assert engine.status == 400
        assert "prompt" in engine.json()["error"]["message"]
        async with session.get(url + "/tokenize") as resp:
            assert resp.status == 405
            assert resp.headers["Allow"] == "POST"


class TestBadInputEachRoute:
    """Bad input to each route is refused in its API's shape."""

    @pytest.mark.parametrize(
        ("path", "body", "status", "param"),
        [
            ("/v1/responses", {"model": MODEL, "input": 5}, 400, "input"),
            ("/v1/responses", {"input": "x"}, 400, "model"),
            ("/tokenize", {"model": MODEL, "prompt": 5}, 400, None),
            ("/detokenize", {"model": MODEL, "tokens": [-1]}, 400, "tokens"),
            ("/v1/rerank", {"model": MODEL, "query": "q", "documents": []}, 400, "documents"),
            ("/rerank", {"model": MODEL, "documents": ["d"]}, 400, None),
            ("/v1/score", {"model": "nope", "text_1": "a", "text_2": "b"}, 404, "model"),
            ("/v1/audio/speech", {"model": MODEL, "input": ""}, 400, "input"),
            ("/v1/audio/speech", {"input": "hi"}, 400, "model"),
        ],
    )
    async def test_openai_shaped_refusal(
        self,
        url: str,
        session: aiohttp.ClientSession,
        path: str,
        body: dict[str, object],
        status: int,
        param: str | None,
    ) -> None:
        """Each route's bad body is refused with its status and OpenAI's error object,
        whether the router or the engine refuses it."""
        got = await post(session, url, body, path=path)
        assert got.status == status, got.body
        error = got.json()["error"]
        assert error["message"]
        if param is not None:
            assert error["param"] == param

    async def test_messages_refusals_are_anthropic_shaped(
        self, url: str, session: aiohttp.ClientSession
    ) -> None:
        """/v1/messages refuses bad JSON, a missing model and a missing max_tokens in
        Anthropic's shape."""
        user = [{"role": "user", "content": "x"}]
        for body in (
            b"{nope",
            {"messages": user, "max_tokens": 2},
            {"model": MODEL, "messages": user},
        ):
            got = await post(session, url, body, path="/v1/messages")
            assert got.status == 400, got.body
            doc = got.json()
            assert doc["type"] == "error"
            assert doc["error"]["type"] == "invalid_request_error"

    @pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/rerank"])
    async def test_a_long_unknown_model_is_quoted_in_part(
        self, url: str, session: aiohttp.ClientSession, path: str
    ) -> None:
        """A 60 kB unknown model name is a 404 quoting its first 256 characters and an
        ellipsis, in the route's API's shape."""
        name = "m" * 256 + "x" * 60_000
        body = {"model": name, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        got = await post(session, url, {**body, "query": "q", "documents": ["d"]}, path=path)
        assert got.status == 404, got.body[:300]
        assert len(got.body) < 1024
        assert "m" * 256 + "…" in got.json()["error"]["message"]

    @pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
    async def test_messages_wrong_method_anthropic_shaped(
        self, url: str, session: aiohttp.ClientSession, path: str
    ) -> None:
        """A GET on a Messages path is a 405 in Anthropic's shape, naming POST."""
        async with session.get(url + path) as resp:
            assert (resp.status, resp.headers["Allow"]) == (405, "POST")
            doc = await resp.json()
        assert doc["type"] == "error"
        assert doc["error"]["type"] == "invalid_request_error"
        assert "use POST" in doc["error"]["message"]


class TestRefusedBeforeTheHandler:
    """What the server refuses before any handler is in the shape of the path's API."""

    @pytest.mark.parametrize(
        "header",
        [b"x-bad: a\x01b", b"anthropic-beta: " + b"b" * 9000],
        ids=["control character", "header line too long"],
    )
    @pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
    def test_messages_paths_answer_in_anthropic_s_shape(
        self, fleet: tuple[Program, list[Program]], path: str, header: bytes
    ) -> None:
        """A head the server cannot take on a Messages path is a 400 in Anthropic's error
        shape (the anthropic package reads it so), and on chat's path in OpenAI's."""
        r, _ = fleet
        for where, shape in ((path, "anthropic"), ("/v1/chat/completions", "openai")):
            data = f"POST {where} HTTP/1.1\r\nHost: r\r\n".encode() + header + b"\r\n"
            ans = raw_request(r.port, data + b"Content-Length: 2\r\n\r\n{}")
            assert ans.status == 400, ans.body
            if shape == "openai":
                assert_openai_error(ans, 400)
                continue
            doc = ans.json()
            assert doc["type"] == "error", doc
            assert doc["error"]["type"] == "invalid_request_error"
            assert doc["error"]["message"].startswith("Bad HTTP request")


class TestRerankAndScore:
    """Rerank and score through the router."""

    @pytest.mark.parametrize("path", ["/rerank", "/v1/rerank"])
    async def test_rerank(self, url: str, session: aiohttp.ClientSession, path: str) -> None:
        """Rerank answers every document's relevance, best first, with usage."""
        body = {"model": MODEL, "query": "a cat", "documents": ["cats", "dogs", "stars"]}
        got = await post(session, url, body, path=path)
        assert got.status == 200, got.body
        results = got.json()["results"]
        assert sorted(r["index"] for r in results) == [0, 1, 2]
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True)
        assert got.json()["usage"]["total_tokens"] > 0

    @pytest.mark.parametrize("path", ["/score", "/v1/score"])
    async def test_score(self, url: str, session: aiohttp.ClientSession, path: str) -> None:
        """Score answers one score per pair; a missing field is the engine's 400."""
        body = {"model": MODEL, "text_1": "a cat", "text_2": ["cats", "dogs"]}
        got = await post(session, url, body, path=path)
        assert got.status == 200, got.body
        assert [d["index"] for d in got.json()["data"]] == [0, 1]
        bad = await post(session, url, {"model": MODEL, "text_1": "x"}, path=path)
        assert bad.status == 400
        assert bad.json()["error"]["code"] == 400


class TestAudio:
    """Audio routes through the router."""

    def test_transcription_translation_and_speech(self, url: str) -> None:
        """The openai package's audio calls work through the router: multipart uploads
        routed by their form's model, and speech's binary answer."""
        with openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as client:
            audio = io.BytesIO(b"RIFF" + bytes(4000))
            audio.name = "clip.wav"
            text = client.audio.transcriptions.create(model=MODEL, file=audio)
            assert text.text
            speech = client.audio.speech.create(
                model=MODEL,
                input="hello",
                voice="alloy",
                response_format="wav",
            )
            assert speech.content.startswith(b"RIFF")

    async def test_translation_streamed(self, url: str, session: aiohttp.ClientSession) -> None:
        """A translation upload asking to stream is relayed as vLLM's chunks and [DONE]."""
        form = aiohttp.FormData()
        form.add_field("model", MODEL)
        form.add_field("stream", "true")
        form.add_field("file", b"RIFF" + bytes(2000), filename="a.wav")
        async with session.post(url + "/v1/audio/translations", data=form) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            body = await resp.read()
        assert body.endswith(b"data: [DONE]\n\n")
        assert b"transcription.chunk" in body

    async def test_bad_uploads(self, url: str, session: aiohttp.ClientSession) -> None:
        """A form without a model is a 400, a body that is no form a 400, and an upload
        over max_body_bytes a 413."""
        form = aiohttp.FormData()
        form.add_field("file", b"RIFF" + bytes(100), filename="a.wav")
        async with session.post(url + "/v1/audio/transcriptions", data=form) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == "model"
        async with session.post(
            url + "/v1/audio/transcriptions",
            data=b"x",
            headers={"Content-Type": "multipart/form-data"},
        ) as resp:
            assert resp.status == 400
            assert "boundary" in (await resp.json())["error"]["message"]
        big = aiohttp.FormData()
        big.add_field("model", MODEL)
        big.add_field("file", bytes(128 * 1024), filename="a.wav")
        async with session.post(url + "/v1/audio/transcriptions", data=big) as resp:
            assert resp.status == 413


class TestRetries:
    """Messages are retried before the first byte."""

    async def test_messages_retried_before_the_first_byte(
        self, fleet: tuple[Program, list[Program]], session: aiohttp.ClientSession
    ) -> None:
        """A replica failing every request (500) is retried elsewhere for /v1/messages."""
        r, engines = fleet
        await wait_until_scraped(r.url, ["e0", "e1", "e2"])
        await set_faults(engines[0].url, fail_rate=1.0)
        try:
            body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": ""}]}
            for i in range(6):
                body["messages"][0]["content"] = f"retry {i}"  # type: ignore[index]
                got = await post(session, r.url, body, path="/v1/messages")
                assert got.status == 200, got.body
                assert got.endpoint != "e0"
        finally:
            await set_faults(engines[0].url, fail_rate=0.0)


class TestConversationAffinity:
    """One conversation keeps its replica."""

    async def test_one_conversation_keeps_its_replica(
        self, fleet: tuple[Program, list[Program]], session: aiohttp.ClientSession
    ) -> None:
        """The same conversation sent as chat, Responses and Messages lands on one replica."""
        r, _ = fleet
        await wait_until_scraped(r.url, ["e0", "e1", "e2"])
        homes = set()
        for n in range(6):
            system = f"conversation {n}: " + "shared preamble words " * 40
            turns = [
                {"role": "user", "content": f"first question of {n}"},
                {"role": "assistant", "content": "an answer"},
                {"role": "user", "content": "and a follow-up"},
            ]
            chat = chat_body([{"role": "system", "content": system}, *turns], max_tokens=2)
            responses: dict[str, object] = {"model": MODEL, "instructions": system}
            responses.update(input=turns, max_output_tokens=2)
            messages = {"model": MODEL, "system": system, "messages": turns, "max_tokens": 2}
            got = [
                await post(session, r.url, chat),
                await post(session, r.url, responses, path="/v1/responses"),
                await post(session, r.url, messages, path="/v1/messages"),
            ]
            assert [g.status for g in got] == [200, 200, 200], [g.body for g in got]
            assert len({g.endpoint for g in got}) == 1, [g.endpoint for g in got]
            homes.add(got[0].endpoint)
        # Different conversations still spread: routing is by conversation, not pinned.
        assert len(homes) > 1


class TestMessagesErrorEvent:
    """A Messages error event counts against the endpoint."""

    async def test_counts_against_the_endpoint(self, tmp_path: Path) -> None:
        """A Messages stream carrying the engine's `event: error` is relayed as is and
        counted as the endpoint's failure: enough of them open its breaker."""
        with sim_engines(tmp_path, [50.0], extra=["--error-after-tokens", "2"]) as engines:
            cfg = base_config(
                endpoints=endpoint_entries(engines),
                breaker={"failure_threshold": 2, "cooldown_s": 30.0, "max_cooldown_s": 60.0},
            )
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0"])
                user = [{"role": "user", "content": "fail"}]
                body = {"model": MODEL, "max_tokens": 8, "messages": user, "stream": True}
                async with aiohttp.ClientSession() as s:
                    replies = [await post(s, r.url, body, path="/v1/messages") for _ in "ab"]
                snap = await asyncio.to_thread(snapshot, r.url, "e0")
        for reply in replies:
            assert reply.status == 200
            assert b"event: error" in reply.body
        assert snap["breaker"] == "open"


class TestResponsesErrorEvent:
    """A Responses error event counts against the endpoint."""

    async def test_counts_against_the_endpoint(self, tmp_path: Path) -> None:
        """A Responses stream carrying the engine's `error` event (code server_error) is
        relayed as is and counted as the endpoint's failure: enough of them open its
        breaker, as for chat's and Messages' error events."""
        with sim_engines(tmp_path, [50.0], extra=["--error-after-tokens", "2"]) as engines:
            cfg = base_config(
                endpoints=endpoint_entries(engines),
                breaker={"failure_threshold": 2, "cooldown_s": 30.0, "max_cooldown_s": 60.0},
            )
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0"])
                body = {"model": MODEL, "max_output_tokens": 8, "input": "fail", "stream": True}
                async with aiohttp.ClientSession() as s:
                    replies = [await post(s, r.url, body, path="/v1/responses") for _ in "ab"]
                snap = await asyncio.to_thread(snapshot, r.url, "e0")
        for reply in replies:
            assert reply.status == 200
            assert b'"type":"error","code":"server_error"' in reply.body
        assert snap["breaker"] == "open"


class TestUploadModelIsTheEngines:
    """An upload is routed, admitted and served for one model, the form's only one."""

    async def test_a_second_model_field_is_refused(self, tmp_path: Path) -> None:
        """A key allowed only `m`, on an engine also serving `other`, cannot have `other`
        served by naming `m` first and `other` last (the engine reads the last): the
        router's 400, the engine never asked."""
        key = "sk-only-m"
        digest = hashlib.sha256(key.encode()).hexdigest()
        extra = ["--served-model-name", MODEL, "other"]
        with sim_engines(tmp_path, [100.0], extra=extra) as engines:
            endpoints = endpoint_entries(engines)
            endpoints[0]["models"] = [MODEL, "other"]
            keys = [{"name": "alice", "sha256": digest, "models": [MODEL]}]
            with router(tmp_path, base_config(endpoints=endpoints, api_keys=keys)) as r:
                form = aiohttp.FormData()
                form.add_field("model", MODEL)
                form.add_field("stream", "true")
                form.add_field("model", "other")
                form.add_field("file", b"RIFF" + bytes(2000), filename="a.wav")
                auth = {"Authorization": f"Bearer {key}"}
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(r.url + "/v1/audio/transcriptions", data=form, headers=auth) as resp,
                ):
                    status, body = resp.status, await resp.read()
                    endpoint = resp.headers.get("x-llmgw-endpoint")
        assert (status, endpoint) == (400, None), body
        assert "more than one `model` field" in json.loads(body)["error"]["message"]
