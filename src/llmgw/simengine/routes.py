"""The sim-engine's routes beyond chat, completions and embeddings, as vLLM serves them.

`/v1/responses` (responses.py) and `/v1/messages` (messages.py) generate
through the same engine as chat, so they load its batch and KV cache alike;
`/tokenize`, `/detokenize`, `/rerank`, `/v1/rerank`, `/score`, `/v1/score`
(pooling.py) and the audio routes (audio.py) answer at once. Every refusal
is vLLM's error body, except `/v1/messages`, whose errors are Anthropic's.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web

from llmgw.simengine import api, audio, messages, pooling, responses

if TYPE_CHECKING:
    from llmgw.simengine.app import SimEngine

_ids = itertools.count(1)
_prefix = os.urandom(4).hex()


def _rid() -> str:
    return f"{_prefix}{next(_ids):016x}"


def _json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


def _refused(exc: api.SimApiError) -> web.Response:
    return _json(exc.body(), exc.status)


def _anthropic(resp: web.StreamResponse) -> web.StreamResponse:
    """An error answer of /v1/messages in Anthropic's shape (vLLM's body as it was written)."""
    if not isinstance(resp, web.Response) or resp.status < 400 or resp.prepared:
        return resp
    message = f"The engine answered {resp.status}."
    body = resp.body
    if isinstance(body, bytes):
        with contextlib.suppress(msgspec.DecodeError, KeyError, TypeError):
            message = msgspec.json.decode(body)["error"]["message"]
    out = _json(messages.error_body(resp.status, message), resp.status)
    for name in ("Retry-After",):
        if name in resp.headers:
            out.headers[name] = resp.headers[name]
    return out


def add_routes(app: web.Application, sim: SimEngine) -> None:
    from llmgw.simengine.app import read_request

    cfg = sim.cfg

    async def create_response(request: web.Request) -> web.StreamResponse:
        job = await read_request(request, responses.parse_responses, cfg)
        if isinstance(job, web.Response):
            return job
        return await sim._generate(request, job, "resp", responses.ResponsesEncoder)

    async def create_message(request: web.Request) -> web.StreamResponse:
        job = await read_request(request, messages.parse_messages, cfg)
        if isinstance(job, web.Response):
            return _anthropic(job)
        return _anthropic(await sim._generate(request, job, "msg", messages.MessagesEncoder))

    def pooled(
        answer: Callable[[bytes], bytes],
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            raw = await read_request(request, lambda raw, _cfg: raw, cfg)
            if isinstance(raw, web.Response):
                return raw
            try:
                return _json(answer(raw))
            except api.SimApiError as exc:
                return _refused(exc)
            except RecursionError:
                return _refused(api.SimApiError(400, "Malformed JSON body: nested too deeply"))

        return handler

    async def transcribe(request: web.Request) -> web.StreamResponse:
        try:
            form = await request.post()
        except ValueError as exc:
            return _refused(api.SimApiError(400, f"Malformed form body: {exc}"))
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        upload = form.get("file")
        data = upload.file.read() if isinstance(upload, web.FileField) else None
        try:
            body, ctype = audio.transcription(fields, data, cfg, _rid())
        except api.SimApiError as exc:
            return _refused(exc)
        return web.Response(body=body, headers={"Content-Type": ctype})

    async def speak(request: web.Request) -> web.StreamResponse:
        raw = await read_request(request, lambda raw, _cfg: raw, cfg)
        if isinstance(raw, web.Response):
            return raw
        try:
            body, ctype = audio.speech(raw, cfg)
        except api.SimApiError as exc:
            return _refused(exc)
        return web.Response(body=body, headers={"Content-Type": ctype})

    r = app.router
    r.add_post("/v1/responses", create_response)
    r.add_post("/v1/messages", create_message)
    count = pooled(lambda raw: messages.count_tokens(raw, cfg))

    async def count_tokens(request: web.Request) -> web.StreamResponse:
        return _anthropic(await count(request))

    r.add_post("/v1/messages/count_tokens", count_tokens)
    r.add_post("/tokenize", pooled(lambda raw: pooling.tokenize(raw, cfg)))
    r.add_post("/detokenize", pooled(lambda raw: pooling.detokenize(raw, cfg)))
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        r.add_post(path, pooled(lambda raw: pooling.rerank(raw, cfg, _rid())))
    for path in ("/score", "/v1/score"):
        r.add_post(path, pooled(lambda raw: pooling.score(raw, cfg, _rid())))
    r.add_post("/v1/audio/transcriptions", transcribe)
    r.add_post("/v1/audio/translations", transcribe)
    r.add_post("/v1/audio/speech", speak)
