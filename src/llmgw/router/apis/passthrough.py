"""The passed-through APIs' handler: Responses, Messages, tokenize, rerank, score, audio.

Each request gets the proxy's whole treatment (`Proxy._route`: the policy's
choice, prefix affinity, retries before the first byte, usage, metrics, the
access log, streams relayed unbuffered); what differs per route is read from
its `apis.Api`:

- the key: `Authorization`, or for `/v1/messages` also Anthropic's `x-api-key`;
- the body: JSON, or for the audio uploads a multipart form read whole under
  the same bounds (forms.py), its `model` and `stream` fields read from it;
- the model: the body's, or for the routes where vLLM lets it be left out the
  router's only model, when it has exactly one;
- the headers the engine gets: the body's Content-Type, and Anthropic's
  `anthropic-version` and `anthropic-beta` as the client sent them;
- the errors: OpenAI's shape, or Anthropic's for `/v1/messages` (anthropic.py),
  the router's own and an engine's alike.

A Responses request naming `previous_response_id` is refused (400): the
response it names is stored in one replica's memory (vLLM keeps it in process,
and only with its store turned on), which a restart, a scale to zero or a
move loses, and which another router, or another worker, could not find
(docs/router.md, "The routes").
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from llmgw.router.apis import anthropic
from llmgw.router.apis.catalog import ROUTES, Api
from llmgw.router.apis.forms import FormError, text_fields
from llmgw.router.errors import NoReplica
from llmgw.router.http.answers import JSON, Whole
from llmgw.router.http.connection import Answer, FastRequest
from llmgw.router.metrics import DISCONNECTED, REJECTED, UNAVAILABLE
from llmgw.router.request.intake import Intake, read_json
from llmgw.router.request.proxy import Proxy, request_id
from llmgw.router.request.refusals import bad_request, model_not_found, unauthorized, unavailable
from llmgw.router.request.tenants import Charge, Tenant
from llmgw.router.routing.affinity import NO_KEY, RouteKey

_FORM_FIELDS: Final = ("model", "stream")
PREVIOUS_RESPONSE = (
    "previous_response_id is not supported by this gateway: a stored response lives in "
    "one replica's memory, which a restart or a move loses. Send the conversation's "
    "earlier turns in `input` instead."
)


def _header_line(name: str, value: str) -> bytes:
    return f"{name}: {value}\r\n".encode("utf-8", "surrogateescape")


class PassThrough:
    """The handler of every route in `apis.ROUTES`."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    async def answer(self, request: FastRequest) -> Answer:
        api = ROUTES[request.path]
        resp = await self._answer(request, api)
        return _reshape(resp) if api.anthropic else resp

    async def _answer(self, request: FastRequest, api: Api) -> Answer:
        proxy = self.proxy
        st = proxy.state
        t0 = st.clock.monotonic()
        headers = request.headers
        rid = request_id(headers.get("x-request-id"))
        path = request.path
        given = anthropic.authorization(headers) if api.anthropic else headers.get("Authorization")
        tenant: Tenant | None = None
        if st.keys.enabled:
            tenant = st.keys.check(given)
            if tenant is None:
                return proxy._refused(unauthorized(), rid, path, t0)
        try:
            got = await read_json(request, st.cfg, proxy.budget, rid, decode=not api.form)
        except asyncio.CancelledError:
            proxy._done(rid, path, "", "", 499, DISCONNECTED, t0, None, None)
            raise
        if isinstance(got, Whole):
            return proxy._refused(got, rid, path, t0)
        try:
            return await self._routed(request, api, got, _Asked(rid, t0, tenant))
        finally:
            got.release()

    async def _routed(self, request: FastRequest, api: Api, got: Intake, asked: _Asked) -> Answer:
        """A read body's request: its model checked, then routed as the proxy routes."""
        proxy = self.proxy
        st = proxy.state
        rid, t0, tenant, path = asked.rid, asked.t0, asked.tenant, request.path
        headers = request.headers
        ctype = "application/json"
        doc = got.doc
        if api.form:
            ctype = headers.get("Content-Type") or ""
            try:
                fields = text_fields(got.body, ctype, _FORM_FIELDS)
            except FormError as exc:
                resp = bad_request(f"The request body is malformed: {exc}.")
                return proxy._refused(resp, rid, path, t0)
            doc = {"model": fields.get("model"), "stream": fields.get("stream") == "true"}
        model = self._model(api, doc)
        if isinstance(model, tuple):
            refusal, outcome = model
            return proxy._refused(refusal, rid, path, t0, outcome=outcome)
        charge: Charge | None = None
        if tenant is not None and tenant.guarded:
            admitted = st.tenants.admit(tenant, model, len(got.body))
            if isinstance(admitted, Whole):
                return proxy._refused(admitted, rid, path, t0, tenant=tenant)
            charge = admitted
        hashes: RouteKey = NO_KEY
        if st.policy.uses_prefix:
            try:
                hashes = api.key(doc, headers.get("x-session-id"))
            except RecursionError:
                why = "The JSON body of your request is nested too deeply."
                return proxy._refused(bad_request(why), rid, path, t0)
        head = _header_line("Content-Type", ctype) + _passed_on(api, headers)
        st.usage.started(model)
        try:
            streams = doc.get("stream") is True
            return await proxy._route(
                request, path, got.body, model, hashes, rid, t0, streams, head, api, charge, tenant
            )
        finally:
            st.usage.finished(model)

    def _model(self, api: Api, doc: dict[str, Any]) -> str | tuple[Whole, str]:
        """The model the request names (or the only one, where it may be left out), or
        the refusal and its outcome: none named, not known, a stored response asked for."""
        st = self.proxy.state
        model = doc.get("model")
        if model is None and api.model_optional and len(st.known_models) == 1:
            (model,) = st.known_models
        if type(model) is not str or not model:
            msg = "You must provide a model parameter."
            return bad_request(msg, param="model"), REJECTED
        if doc.get("previous_response_id") is not None and api.name == "responses":
            return bad_request(PREVIOUS_RESPONSE, param="previous_response_id"), REJECTED
        if model not in st.known_models:
            if st.awaiting_list:
                why = "the router has not received its endpoint list from the controller yet"
                return unavailable(NoReplica(model, why, retry_after_s=5)), UNAVAILABLE
            return model_not_found(model), REJECTED
        return model


class _Asked:
    """What a request's answer needs from before its body was read."""

    __slots__ = ("rid", "t0", "tenant")

    def __init__(self, rid: str, t0: float, tenant: Tenant | None) -> None:
        self.rid = rid
        self.t0 = t0
        self.tenant = tenant


def _passed_on(api: Api, headers: Any) -> bytes:
    out = b""
    for name in api.pass_headers:
        value = headers.get(name)
        if value and "\n" not in value and "\r" not in value:
            out += _header_line(name, value)
    return out


def _reshape(resp: Answer) -> Answer:
    """An error answer of the Messages route in Anthropic's shape (anthropic.py)."""
    status = resp.status
    if status < 400 or not isinstance(resp, Whole):
        return resp
    return resp.with_content_type(anthropic.reshape(status, resp.body), JSON)
