"""The passed-through APIs' handler: Responses, Messages, tokenize, rerank, score, audio.

Each request gets the proxy's whole treatment (`Proxy.route`: the policy's
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
(docs/router.md, "The routes"). One naming a `conversation` is refused too:
no engine keeps conversations (the Conversations API), and vLLM would answer
it without the conversation's turns.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from llmgw.router.apis import anthropic
from llmgw.router.apis.catalog import ROUTES, Api
from llmgw.router.apis.forms import FormError, text_fields
from llmgw.router.http.answers import JSON, Whole
from llmgw.router.http.connection import Answer, Request
from llmgw.router.metrics import DISCONNECTED
from llmgw.router.request import enginepriority
from llmgw.router.request.accounting import count, refused
from llmgw.router.request.admission import admit, unknown_model
from llmgw.router.request.call import Call, request_id
from llmgw.router.request.intake import Intake, read_json
from llmgw.router.request.intake import refused as logged_refusal
from llmgw.router.request.proxy import Proxy
from llmgw.router.request.refusals import bad_request, unauthorized
from llmgw.router.request.tenants import Charge, Tenant
from llmgw.router.request.usagebound import completion_bound_of
from llmgw.router.routing.affinity import NO_KEY, RouteKey
from llmgw.wire.formbool import form_bool

_FORM_FIELDS: Final = ("model", "stream")
PREVIOUS_RESPONSE = (
    "previous_response_id is not supported by this gateway: a stored response lives in "
    "one replica's memory, which a restart or a move loses. Send the conversation's "
    "earlier turns in `input` instead."
)

CONVERSATION = (
    "conversation is not supported by this gateway: no engine behind it keeps "
    "conversations. Send the conversation's earlier turns in `input` instead."
)


def _header_line(name: str, value: str) -> bytes:
    return f"{name}: {value}\r\n".encode("utf-8", "surrogateescape")


class PassThrough:
    """The handler of every route in `apis.ROUTES`."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    async def answer(self, request: Request) -> Answer:
        api = ROUTES[request.path]
        resp = await self._answer(request, api)
        return _reshape(resp) if api.anthropic else resp

    async def _answer(self, request: Request, api: Api) -> Answer:
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
                return refused(st, unauthorized(), rid, path, t0)
        try:
            got = await read_json(request, st.cfg, proxy.budget, rid, decode=not api.form)
        except asyncio.CancelledError:
            count(st, rid, path, t0, status=499, outcome=DISCONNECTED)
            raise
        if not isinstance(got, Intake):
            return refused(st, got, rid, path, t0)
        try:
            call = self._call(request, got, rid, t0, api=api, tenant=tenant)
            if not isinstance(call, Call):
                return call
            st.loads.started(call.model)
            try:
                return await proxy.route(call)
            finally:
                st.loads.finished(call.model)
        finally:
            got.release()

    def _call(
        self,
        request: Request,
        got: Intake,
        rid: str,
        t0: float,
        *,
        api: Api,
        tenant: Tenant | None,
    ) -> Call | Whole:
        """The request to route, or its refusal: the proxy's, a bad form, a stored response."""
        st = self.proxy.state
        path = request.path
        headers = request.headers
        ctype = "application/json"
        doc = got.doc
        if api.form:
            ctype = headers.get("Content-Type") or ""
            form = _form_doc(got.body, ctype)
            if isinstance(form, Whole):
                return refused(st, form, rid, path, t0)
            doc = form
        model = doc.get("model")
        if model is None and api.model_optional and len(st.known_models) == 1:
            (model,) = st.known_models
        if type(model) is not str or not model:
            msg = "You must provide a model parameter."
            return refused(st, bad_request(msg, param="model"), rid, path, t0)
        if api.name == "responses":
            stored = _stored_state(doc)
            if stored is not None:
                return refused(st, stored, rid, path, t0)
        if model not in st.known_models:
            return unknown_model(st, model, rid, path, t0)
        charge = admit(st, tenant, model, got, rid, t0=t0, path=path, metered=api.metered)
        if isinstance(charge, Whole):
            return charge
        hashes = self._key(request, doc, rid, api=api, charge=charge)
        if isinstance(hashes, Whole):
            return refused(st, hashes, rid, path, t0)
        return Call(
            request,
            rid=rid,
            path=path,
            t0=t0,
            model=model,
            body=got.body,
            hashes=hashes,
            streams=doc.get("stream") is True,
            head=_header_line("Content-Type", ctype) + _passed_on(api, headers),
            api=api,
            charge=charge,
            tenant=tenant,
            engine_priority=enginepriority.of(tenant, doc) if api.priority else None,
            completion_most=completion_bound_of(doc),
        )

    def _key(
        self,
        request: Request,
        doc: dict[str, Any],
        rid: str,
        *,
        api: Api,
        charge: Charge | None,
    ) -> RouteKey | Whole:
        """The request's route key (none where the policy reads none), or the logged
        refusal of a body the decoder took but too deep to key. The request was admitted
        already: its key's charge goes back, as on the proxy's own routes, or a limited
        key would pay an RPM and a token estimate for a request no engine saw."""
        if not self.proxy.state.policy.uses_prefix:
            return NO_KEY
        try:
            return api.key(doc, request.headers.get("x-session-id"))
        except RecursionError:
            if charge is not None:
                charge.refund()
            why = "The JSON body of your request is nested too deeply."
            return logged_refusal(bad_request(why), rid, "json nested too deeply", request)


def _stored_state(doc: dict[str, Any]) -> Whole | None:
    """The refusal of a Responses request that names state stored by an earlier one
    (the module docstring says why); None: it carries its whole conversation."""
    if doc.get("previous_response_id") is not None:
        return bad_request(PREVIOUS_RESPONSE, param="previous_response_id")
    if doc.get("conversation") is not None:
        # vLLM ignores the field it does not know: the reply would come without the
        # conversation's earlier turns, and nothing would tell the client.
        return bad_request(CONVERSATION, param="conversation")
    return None


def _form_doc(body: bytes, ctype: str) -> dict[str, Any] | Whole:
    """A multipart form's `model` and `stream` fields as a JSON body would hold them,
    or the refusal of a malformed one."""
    try:
        fields = text_fields(body, ctype, _FORM_FIELDS)
    except FormError as exc:
        return bad_request(f"The request body is malformed: {exc}.")
    return {"model": fields.get("model"), "stream": form_bool(fields.get("stream")) is True}


def _passed_on(api: Api, headers: Any) -> bytes:
    out = b""
    for name in api.pass_headers:
        value = headers.get(name)
        if value and "\n" not in value and "\r" not in value:
            out += _header_line(name, value)
    return out


def _reshape(resp: Answer) -> Answer:
    """An error answer of the Messages route as the anthropic package reads it: its
    request id also as `request-id`, in Anthropic's shape (anthropic.py). An engine's
    answer has `request-id` from the proxy already (`Proxy._whole`, `_out_headers`):
    read back here from the head's lines, it cost every answer a decode of them."""
    if not isinstance(resp, Whole):
        return resp
    status = resp.status
    if status < 400:
        return resp
    rid = resp.header("x-request-id")
    if rid is not None and resp.header("request-id") is None:
        # Else `request_id` of its errors is None, not the access log's id.
        resp = resp.with_header("request-id", rid)
    return resp.with_content_type(anthropic.reshape(status, resp.body), JSON)
