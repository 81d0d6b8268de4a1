"""The router's own answers under /v1 that go to no engine: the model list, one
model, and OpenAI's 404 or 405 for any other request there (Anthropic's under
/v1/messages, `catalog.anthropic_path`).

The model routes take the key as /v1/messages does (`anthropic.authorization`:
`x-api-key`, else `Authorization`), and answer a request naming an
`anthropic-version` in Anthropic's Models API shape, its errors included
(apis/anthropicmodels.py); any other in OpenAI's. Every answer in Anthropic's shape
carries the request id also as `request-id` (accounting.tag), as /v1/messages does.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from llmgw.router.apis import anthropic, anthropicmodels
from llmgw.router.apis.catalog import ROUTES as API_ROUTES
from llmgw.router.apis.catalog import anthropic_path
from llmgw.router.http.answers import JSON, Whole, json_whole, whole
from llmgw.router.http.connection import Request
from llmgw.router.request.accounting import refused, tag
from llmgw.router.request.call import request_id
from llmgw.router.request.proxy import POST_PATHS
from llmgw.router.request.refusals import (
    bad_request,
    error_response,
    model_not_found,
    quoted_name,
    unauthorized,
)
from llmgw.router.wiring import Router

MODEL_PREFIX = "/v1/models/"
# A stored response's routes (retrieve, delete, cancel, input_items): never routed.
RESPONSES_PREFIX = "/v1/responses/"


def serves_get(path: str) -> bool:
    """Whether GET answers `path`: the model list or one model. Not `/v1/models/` (no
    model named), nor `/v1/modelsx`: a 405 there would ask a GET for a GET."""
    return path == "/v1/models" or (path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX))


class Listing:
    """Handlers for GET /v1/models, GET /v1/models/{model} and unknown /v1 requests;
    all state lives in Router."""

    def __init__(self, state: Router) -> None:
        self.state = state

    async def models(self, request: Request) -> Whole:
        """GET /v1/models: every known model the key may use, in OpenAI's list shape, or
        one page of them in Anthropic's."""
        st = self.state
        rid = request_id(request.headers.get("x-request-id"))
        shaped = anthropicmodels.asked(request.headers)
        names = st.known_models
        if st.keys.enabled:
            tenant = st.keys.check(anthropic.authorization(request.headers))
            if tenant is None:
                return self._refused(request, rid, unauthorized(), shaped=shaped)
            if tenant.models is not None:
                names = names & tenant.models
        if shaped:
            ask = anthropicmodels.read_ask(urlsplit(request.raw_path).query)
            if isinstance(ask, str):
                return self._refused(request, rid, bad_request(ask), shaped=shaped)
            body = anthropicmodels.encode(anthropicmodels.page(names, ask))
            return tag(whole(200, body, content_type=JSON), rid, anthropic=True)
        data: list[dict[str, Any]] = [_model_object(m) for m in sorted(names)]
        return tag(json_whole({"object": "list", "data": data}), rid)

    async def model(self, request: Request) -> Whole:
        """GET /v1/models/{model}: one known model (the openai and anthropic packages'
        models.retrieve), in the shape the request asks for, as the list."""
        st = self.state
        rid = request_id(request.headers.get("x-request-id"))
        shaped = anthropicmodels.asked(request.headers)
        allowed: frozenset[str] | None = None
        if st.keys.enabled:
            tenant = st.keys.check(anthropic.authorization(request.headers))
            if tenant is None:
                return self._refused(request, rid, unauthorized(), shaped=shaped)
            allowed = tenant.models
        model = request.match_info["model"]
        if model not in st.known_models or (allowed is not None and model not in allowed):
            return self._refused(request, rid, model_not_found(model), shaped=shaped)
        if shaped:
            body = anthropicmodels.encode(anthropicmodels.model_info(model))
            return tag(whole(200, body, content_type=JSON), rid, anthropic=True)
        return tag(json_whole(_model_object(model)), rid)

    def _refused(self, request: Request, rid: str, resp: Whole, *, shaped: bool) -> Whole:
        """A model route's refusal, counted, with the request's id `rid` on it; in
        Anthropic's error shape when `shaped`."""
        if shaped:
            resp = resp.with_content_type(anthropic.reshape(resp.status, resp.body), JSON)
        st = self.state
        return refused(st, resp, rid, request.path, st.clock.monotonic(), anthropic=shaped)

    async def no_route(self, request: Request) -> Whole:
        """Any other /v1 request: OpenAI's 404 (or 405 on a served path), not plain text;
        Anthropic's 404 or 405 under /v1/messages, whose clients read only that shape."""
        path, method = request.path, request.method
        t0 = self.state.clock.monotonic()
        rid = request_id(request.headers.get("x-request-id"))
        post = path in POST_PATHS or path in API_ROUTES
        # HEAD as well as GET: the server answers HEAD on every GET route.
        allowed = "POST" if post else "GET, HEAD" if serves_get(path) else ""
        if anthropic_path(path):
            # Anthropic's clients read errors in their API's shape (anthropic.py).
            if post:
                msg = f"Method {method} is not allowed on {path}; use POST."
                body = anthropic.error_body(405, msg)
                resp = whole(405, body, {"Allow": "POST"}, content_type=JSON)
            else:
                body = anthropic.error_body(404, f"Invalid URL ({method} {path}).")
                resp = whole(404, body, content_type=JSON)
        elif stored := _stored_id(path):
            resp = _not_stored(stored)
        elif allowed:
            resp = error_response(
                405,
                f"Method {method} is not allowed on {path}; use {allowed.partition(',')[0]}.",
                type="invalid_request_error",
                code="method_not_allowed",
                headers={"Allow": allowed},
            )
        else:
            resp = error_response(
                404,
                f"Invalid URL ({method} {path}).",
                type="invalid_request_error",
                code="unknown_url",
            )
        # `path` is the caller's: logged, never a label.
        return refused(self.state, resp, rid, path, t0, anthropic=anthropic_path(path))


def _model_object(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "llmgw"}


def _stored_id(path: str) -> str:
    """The response id a stored response's route names (`/v1/responses/{id}`, and its
    `/cancel`, `/input_items`), or "" when `path` is none of them."""
    if not path.startswith(RESPONSES_PREFIX):
        return ""
    return path[len(RESPONSES_PREFIX) :].partition("/")[0]


def _not_stored(response_id: str) -> Whole:
    """The 404 of a stored response's route (retrieve, delete, cancel, its input
    items): the router keeps none and routes none there, since a stored response lives
    in one replica's memory (apis/passthrough.py). It says so, rather than "Invalid
    URL", which sends a client looking for a wrong base URL."""
    return error_response(
        404,
        f"Response with id {quoted_name(response_id)!r} not found: this gateway keeps no "
        "stored responses (each would live in one replica's memory, which a restart or a "
        "move loses), so none can be retrieved, deleted or cancelled. Send a "
        "conversation's earlier turns in `input` instead.",
        type="invalid_request_error",
        code="response_not_found",
    )
