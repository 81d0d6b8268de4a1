"""HTTP routes: parse and validate at the edge, then call pure code.

Handlers never decide anything themselves: they turn a request into values,
call fleet/commands.py / fleet/agents.py through the Fleet (which writes the store before
memory), and encode the answer. Every error leaves through `_errors`, in the
OpenAI error shape (wire.errors.error_body), and nowhere else.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, get_args

import msgspec
from aiohttp import web

from llmgw import __version__
from llmgw.controller.api.http import http_status, retry_after
from llmgw.controller.api.services import Services
from llmgw.controller.api.status import (
    CONTENT_TYPE,
    ControllerMetrics,
    StatusFiles,
    encode,
    status_data,
)
from llmgw.controller.api.summary import summarize
from llmgw.controller.api.validate import check_heartbeat, check_spec
from llmgw.controller.api.views import model_view, model_views, node_views, replica_view
from llmgw.controller.config import ControllerConfig
from llmgw.controller.errors import (
    Conflict,
    ControllerRefusal,
    Forbidden,
    InvalidRequest,
    InvalidSpec,
    TokenRejected,
)
from llmgw.controller.fleet import commands
from llmgw.controller.fleet.records import OperatorState
from llmgw.wire.adapters import AdapterSpec, is_adapter
from llmgw.wire.admin import DrainRequest, EngineKey, EventView, ReplicaState, WeightRequest
from llmgw.wire.agent import Heartbeat
from llmgw.wire.errors import error_body
from llmgw.wire.models import ModelSpec, ScaleRequest, env_from_problem

log = logging.getLogger(__name__)

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SERVICES = web.AppKey("services", Services)
METRICS = web.AppKey("metrics", ControllerMetrics)
STATUS_FILES = web.AppKey("status_files", StatusFiles)
# Routes a client may call without the token: liveness, the API's own description, and
# the status page's static files (no data in them; the page fetches its data with a token).
OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/status", "/status/"})
OPEN_PREFIXES = ("/status/static/",)
# What the read-only token may GET (a read token on anything else is 403).
READ_PATHS = frozenset(
    {
        "/metrics",
        "/admin/summary",
        "/admin/status",
        "/admin/events",
        "/admin/keys",
        "/admin/usage",
    }
)
READ_PREFIXES = ("/admin/nodes", "/admin/models", "/admin/replicas")
REPLICA_STATES = frozenset(get_args(ReplicaState))
# Known __post_init__ messages of ModelSpec → the field they are about.
_POST_INIT_FIELDS = (
    ("max_replicas", "max_replicas"),
    ("aliases", "aliases"),
    ("env_from", "env_from"),
)
_encoder = msgspec.json.Encoder()


def json_response(value: object, *, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(value), status=status, content_type="application/json")


def validation_param(message: str) -> str | None:
    """The field path a msgspec validation message names (`$[1].x` → `[1].x`)."""
    path = None
    m = re.search(r" - at `\$(.*)`$", message)
    if m:
        path = m.group(1).lstrip(".")
    f = re.search(r"field `([^`]+)`", message)
    if f:
        path = f"{path}.{f.group(1)}" if path else f.group(1)
    if path is None:
        for needle, field in _POST_INIT_FIELDS:
            if message.startswith(needle):
                return field
    return path or None


TOO_DEEP = "the JSON body is nested too deeply"


def integral_floats_as_ints(value: Any) -> Any:
    """`value` with every float that has no fraction (1039.0) as an int.

    JSON Schema's `integer` (what /openapi.json publishes) includes 1039.0, which
    msgspec's int refuses; a float field takes an int as is. RecursionError on a
    tree deeper than the stack: the caller's "nested too deeply".
    """
    if type(value) is float:
        return int(value) if value.is_integer() and abs(value) < 2**63 else value
    if type(value) is list:
        return [integral_floats_as_ints(v) for v in value]
    if type(value) is dict:
        return {k: integral_floats_as_ints(v) for k, v in value.items()}
    return value


def decode(body: bytes, type_: type[T], *, what: str) -> T:
    """The one way an API body comes in: 400 when it is not JSON (or too deep), 422 when
    it breaks its type; never a traceback."""
    if not body.strip():
        raise InvalidRequest(f"{what}: the request body is empty; a JSON object is required")
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        failed = exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"{what}: body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise InvalidRequest(f"{what}: {TOO_DEEP}") from None
    # Refused by type: once more with integral floats as ints (the schema's integers).
    try:
        return msgspec.convert(integral_floats_as_ints(msgspec.json.decode(body)), type_)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        # msgspec stops at the first type error: a body refused by type may be
        # malformed further on, or too deep; the type error is what it is told.
        raise InvalidSpec(f"{what}: {msg}", param=validation_param(msg)) from failed


def decode_specs(body: bytes) -> list[ModelSpec | AdapterSpec]:
    """One spec or a list of them; any invalid one refuses the whole request. An entry
    with `adapter_of` is a LoRA adapter's (wire.adapters)."""
    try:
        raw: Any = integral_floats_as_ints(msgspec.json.decode(body)) if body.strip() else None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise InvalidRequest(TOO_DEEP) from None
    single = isinstance(raw, dict)
    items = [raw] if single else raw
    if not isinstance(items, list) or not items:
        raise InvalidRequest("body must be a model spec object or a non-empty list of them")
    specs: list[ModelSpec | AdapterSpec] = []
    for i, item in enumerate(items):
        where = "" if single else f"models[{i}]"
        name = item.get("name") if isinstance(item, dict) else None
        label = f"{where} ({name!r})" if name is not None and where else (where or repr(name))
        if not isinstance(item, dict):
            raise InvalidSpec(f"{where}: a model spec must be a JSON object", param=f"[{i}]")
        if is_adapter(item):
            specs.append(_decode_adapter(item, label, i, single=single))
            continue
        refs = env_from_problem(item)
        if refs is not None:
            ref_field, ref_why = refs
            raise InvalidSpec(
                f"model spec {label}: {ref_field}: {ref_why}; nothing was applied",
                param=ref_field if single else f"[{i}].{ref_field}",
            )
        try:
            spec = msgspec.convert(item, ModelSpec)
        except msgspec.ValidationError as exc:
            msg = str(exc)
            field = validation_param(msg)
            param = field if single else (f"[{i}].{field}" if field else f"[{i}]")
            raise InvalidSpec(
                f"model spec {label}: {msg}; nothing was applied", param=param
            ) from exc
        wrong = check_spec(spec)
        if wrong is not None:
            field, why = wrong
            raise InvalidSpec(
                f"model spec {label}: {field}: {why}; nothing was applied",
                param=field if single else f"[{i}].{field}",
            )
        specs.append(spec)
    return specs


def _decode_adapter(item: Any, label: str, i: int, *, single: bool) -> AdapterSpec:
    try:
        return msgspec.convert(item, AdapterSpec)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        if msg.startswith("adapter_of must"):
            field: str | None = "adapter_of"
        elif "Object contains unknown field" in msg:
            # Engine, GPUs and replicas are the base's: say so rather than just "unknown".
            field = validation_param(msg)
            msg += " (an adapter takes only name, adapter_of and source: the rest is its base's)"
        else:
            field = validation_param(msg)
        param = field if single else (f"[{i}].{field}" if field else f"[{i}]")
        raise InvalidSpec(f"adapter spec {label}: {msg}; nothing was applied", param=param) from exc


def decode_drain(body: bytes) -> DrainRequest:
    """A drain request (an empty body: the defaults; grace UNSET: the controller's)."""
    if not body.strip():
        return DrainRequest()
    req = decode(body, DrainRequest, what="drain request")
    if isinstance(req.grace_s, msgspec.UnsetType):
        return req
    if not math.isfinite(req.grace_s) or req.grace_s < 0:
        raise InvalidSpec(
            f"grace_s must be a finite number of seconds >= 0, got {req.grace_s}",
            param="grace_s",
        )
    return req


class _NoBody(msgspec.Struct, forbid_unknown_fields=True):
    """Commands that take no body accept none, or `{}`; anything else is refused."""


async def _no_body(request: web.Request, what: str) -> None:
    body = await request.read()
    if body.strip():
        decode(body, _NoBody, what=f"{what} (takes no body)")


def _query(request: web.Request, name: str) -> str | None:
    """A query parameter given at most once (the schema's scalar); None when absent."""
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise InvalidRequest(f"query parameter {name} is given {len(values)} times", param=name)
    return values[0] if values else None


def _query_int(
    request: web.Request, name: str, default: int | None, lo: int, hi: int
) -> int | None:
    text = _query(request, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        # "1039.0" is an integer to JSON Schema (what /openapi.json publishes).
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number.is_integer()):
            raise InvalidRequest(
                f"query parameter {name} must be an integer, got {text!r}", param=name
            ) from None
        value = int(number)
    if not lo <= value <= hi:
        raise InvalidRequest(
            f"query parameter {name} must be in {lo}..{hi}, got {value}", param=name
        )
    return value


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        services = request.app[SERVICES]
        cfg = services.config
        _authorize(request, cfg.token, cfg.read_token, cfg.metrics_token, scoped=cfg)
        return await handler(request)
    except ControllerRefusal as exc:
        status, kind = http_status(exc)
        if status < 500:
            # One line per refused request, whatever it sent (never a traceback).
            log.warning(
                "refused request status=%d method=%s path=%s why=%s",
                status,
                request.method,
                request.path[:200],
                exc.message[:160],
            )
        body = error_body(exc.message, type=kind, param=exc.param)
        return web.Response(
            body=body, status=status, content_type="application/json", headers=retry_after(status)
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(
            exc.status, "invalid_request_error"
        )
        body = error_body(f"{request.method} {request.path}: {exc.reason}", type=kind)
        allow = None
        if exc.status == 405:
            # What the path takes (RFC 9110), as /openapi.json lists it: aiohttp's own
            # list also has {name:.+}'s methods on /admin/models/<m>/scale.
            from llmgw.controller.api.openapi import allowed_methods

            allow = allowed_methods(request.path) or exc.headers.get("Allow")
        return web.Response(
            body=body,
            status=exc.status,
            content_type="application/json",
            headers={"Allow": allow} if allow is not None else None,
        )
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception:
        log.exception("handler crashed path=%s", request.path)
        body = error_body("internal error; see the controller's log", type="server_error")
        return web.Response(body=body, status=500, content_type="application/json")


# What the router token may call (method, path).
ROUTER_ROUTES = frozenset({("GET", "/v1/endpoints"), ("POST", "/v1/usage")})


def _heartbeat_node(request: web.Request) -> str | None:
    """The node of a heartbeat route, or None for any other route."""
    parts = request.path.split("/")
    # "", "v1", "agents", NODE, "heartbeat"
    if request.method == "POST" and len(parts) == 5 and parts[1:3] == ["v1", "agents"]:
        return parts[3] if parts[4] == "heartbeat" else None
    return None


def _scoped(request: web.Request, given: bytes, cfg: ControllerConfig) -> bool:
    """True if a scoped token allows this request; Forbidden if it is one, but not here."""

    def same(token: str | None) -> bool:
        return token is not None and hmac.compare_digest(given, f"Bearer {token}".encode())

    node = _heartbeat_node(request)
    if same(cfg.agent_token):
        if node is not None:
            return True
        raise Forbidden(f"the agent token may only heartbeat, not {request.method} {request.path}")
    for name, tok in cfg.node_tokens.items():
        if same(tok):
            if node == name:
                return True
            raise Forbidden(
                f"the token of node {name!r} may only heartbeat as {name!r}, "
                f"not {request.method} {request.path}"
            )
    if same(cfg.router_token):
        if (request.method, request.path) in ROUTER_ROUTES:
            return True
        raise Forbidden(
            "the router token may only read /v1/endpoints and post /v1/usage, "
            f"not {request.method} {request.path}"
        )
    return False


def _authorize(
    request: web.Request,
    token: str | None,
    read_token: str | None,
    metrics_token: str | None = None,
    *,
    scoped: ControllerConfig | None = None,
) -> None:
    """The admin token may do anything; the read token may GET what READ_PATHS name;
    the metrics token may GET /metrics, which then needs a token even without `token`."""
    path = request.path
    # aiohttp passes header bytes that are not UTF-8 on as surrogate escapes: back to
    # the bytes sent (a wrong token), never a UnicodeEncodeError (a 500 anyone can cause).
    given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
    if path == "/metrics" and metrics_token is not None:
        if hmac.compare_digest(given, f"Bearer {metrics_token}".encode()):
            return
        if token is None:
            raise TokenRejected(
                "/metrics needs the metrics token" if given else "a bearer token is required"
            )
    if token is None or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
        return
    if hmac.compare_digest(given, f"Bearer {token}".encode()):
        return
    if metrics_token is not None and hmac.compare_digest(given, f"Bearer {metrics_token}".encode()):
        # A valid token in the wrong place, as the other scoped tokens answer.
        raise Forbidden(f"the metrics token may only GET /metrics, not {request.method} {path}")
    if read_token is not None and hmac.compare_digest(given, f"Bearer {read_token}".encode()):
        readable = path in READ_PATHS or path.startswith(READ_PREFIXES)
        if request.method in ("GET", "HEAD") and readable:
            return
        raise Forbidden(f"the read-only token may not {request.method} {path}")
    if scoped is not None and _scoped(request, given, scoped):
        return
    raise TokenRejected("missing or wrong bearer token" if given else "a bearer token is required")


def _svc(request: web.Request) -> Services:
    return request.app[SERVICES]


# -- health, agents, routers ---------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    s = _svc(request)
    return json_response({"status": "ok", "leader": s.fleet.leading, "version": __version__})


async def heartbeat(request: web.Request) -> web.Response:
    s = _svc(request)
    node = request.match_info["node"]
    hb = decode(await request.read(), Heartbeat, what="heartbeat")
    check_heartbeat(hb)
    if hb.node != node:
        raise InvalidRequest(
            f"heartbeat for {hb.node!r} posted to the URL of {node!r}", param="node"
        )
    return json_response(await s.fleet.heartbeat(hb))


async def endpoints(request: web.Request) -> web.Response:
    s = _svc(request)
    after = _query_int(request, "after", None, -(2**62), 2**62)
    given = _query(request, "timeout_s")
    # Absent: 30 s. Present but empty is not a number (the schema says number).
    text = "30" if given is None else given
    try:
        asked = float(text)
    except ValueError:
        asked = math.nan
    if not math.isfinite(asked) or asked < 0:
        raise InvalidRequest(
            f"timeout_s must be a number of seconds >= 0, got {text!r}", param="timeout_s"
        )
    # Above 60 clamped rather than refused (the schema says so): a long-poll that
    # waits less than asked is still correct.
    timeout_s = min(60.0, asked)
    await s.fleet.sink.wait_changed(after, timeout_s=timeout_s)
    return json_response(s.fleet.endpoints())


# -- admin: reads --------------------------------------------------------------


async def summary(request: web.Request) -> web.Response:
    s = _svc(request)
    now = s.clock.wall()
    out = summarize(
        s.fleet.state,
        now=now,
        heartbeat_timeout_s=s.config.heartbeat_timeout_s,
        idle_for=s.idle_for(now),
        unplaceable=s.unplaceable(),
    )
    out.waiting_unplaceable = s.waiting_unplaceable()
    return json_response(out)


async def list_nodes(request: web.Request) -> web.Response:
    s = _svc(request)
    views = node_views(
        s.fleet.state,
        now=s.clock.wall(),
        heartbeat_timeout_s=s.config.heartbeat_timeout_s,
        unplaceable=s.unplaceable(),
    )
    return json_response(views)


async def get_node(request: web.Request) -> web.Response:
    s = _svc(request)
    node = commands.require_node(s.fleet.state, request.match_info["name"])
    return json_response(s.node_view(node))


async def list_models(request: web.Request) -> web.Response:
    s = _svc(request)
    return json_response(model_views(s.fleet.state, s.unplaceable()))


def _not_scale(request: web.Request) -> None:
    """/admin/models/<m>/scale takes POST only ({name:.+} would match it too)."""
    if request.match_info["name"].endswith("/scale"):
        raise web.HTTPMethodNotAllowed(request.method, ["POST"])


async def get_model(request: web.Request) -> web.Response:
    s = _svc(request)
    _not_scale(request)
    name = request.match_info["name"]
    adapter = s.fleet.state.adapters.get(name)
    # An adapter is shown by its base, which lists it.
    model = commands.require_model(s.fleet.state, adapter.base if adapter else name)
    return json_response(model_view(model, s.fleet.state, s.unplaceable().get(model.name)))


async def list_replicas(request: web.Request) -> web.Response:
    s = _svc(request)
    model = _query(request, "model") or None
    state = _query(request, "state")
    if state is not None and state not in REPLICA_STATES:
        allowed = ", ".join(sorted(REPLICA_STATES))
        raise InvalidRequest(f"state must be one of {allowed}; got {state!r}", param="state")
    fleet = s.fleet
    ids = fleet.index.of_model(model) if model is not None else fleet.state.replicas.keys()
    idle_for = s.idle_for(s.clock.wall())
    out = []
    for rid in sorted(ids):
        r = fleet.state.replicas[rid]
        if state is None or r.state == state:
            out.append(replica_view(r, idle_for))
    return json_response(out)


async def get_replica(request: web.Request) -> web.Response:
    s = _svc(request)
    r = commands.require_replica(s.fleet.state, request.match_info["id"])
    return json_response(replica_view(r, s.idle_for(s.clock.wall())))


async def events(request: web.Request) -> web.Response:
    s = _svc(request)
    limit = _query_int(request, "limit", 200, 1, 10_000) or 200
    found = await s.events(
        model=_query(request, "model") or None,
        replica=_query(request, "replica") or None,
        node=_query(request, "node") or None,
        limit=limit,
        event_id=_query_int(request, "id", None, 1, 2**62),
    )
    views = [
        EventView(
            id=e.id,
            at=e.at,
            kind=e.kind,
            subject=e.subject,
            subject_id=e.subject_id,
            model=e.model,
            message=e.message,
        )
        for e in found
    ]
    return json_response(views)


# -- admin: commands -----------------------------------------------------------


def _node_command(to: OperatorState) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        s = _svc(request)
        name = request.match_info["name"]
        req = DrainRequest()
        if to == "draining":
            req = decode_drain(await request.read())
        else:
            await _no_body(request, f"{'cordon' if to == 'cordoned' else 'uncordon'} request")
        grace_s = None if isinstance(req.grace_s, msgspec.UnsetType) else req.grace_s
        node = await s.operator_state(
            name, to, grace_s=grace_s, force=req.force, evict_idle=req.evict_idle
        )
        return json_response(s.node_view(node))

    return handler


async def apply_models(request: web.Request) -> web.Response:
    s = _svc(request)
    specs = decode_specs(await request.read())
    models = await s.apply_models(specs)
    return json_response(
        [model_view(m, s.fleet.state, s.unplaceable().get(m.name)) for m in models]
    )


async def delete_model(request: web.Request) -> web.Response:
    s = _svc(request)
    _not_scale(request)
    name = request.match_info["name"]
    await _no_body(request, "delete request")
    adapter = s.fleet.state.adapters.get(name)
    await s.delete_model(name)
    if adapter is not None:
        return json_response({"deleted": name, "adapter_of": adapter.base})
    return json_response({"deleted": name})


async def scale_model(request: web.Request) -> web.Response:
    s = _svc(request)
    name = request.match_info["name"]
    req = decode(await request.read(), ScaleRequest, what="scale request")
    if isinstance(req.min_replicas, msgspec.UnsetType) and isinstance(
        req.max_replicas, msgspec.UnsetType
    ):
        raise InvalidRequest(
            "scale request: give min_replicas, max_replicas or both; an empty request changes "
            "nothing"
        )
    model = await s.scale_model(name, req)
    return json_response(model_view(model, s.fleet.state, s.unplaceable().get(model.name)))


async def set_weight(request: web.Request) -> web.Response:
    s = _svc(request)
    rid = request.match_info["id"]
    req = decode(await request.read(), WeightRequest, what="weight request")
    r = await s.set_weight(rid, req.weight, capacity_tok_s=req.capacity_tok_s)
    return json_response(replica_view(r, s.idle_for(s.clock.wall())))


async def engine_key(request: web.Request) -> web.Response:
    """The key the replica's engine requires, for `ctl bench` (admin token only).

    POST, never GET: the read-only token may GET anything under /admin/replicas, and
    must never reach this. No write and no event: only the answer carries the key.
    """
    s = _svc(request)
    r = commands.require_replica(s.fleet.state, request.match_info["id"])
    await _no_body(request, "engine-key request")
    key = r.shards[0].api_key if r.shards else ""
    if not key:
        raise Conflict(
            f"replica {r.id} has no engine key (state {r.state}): its engine has not been "
            "reported started with one yet, or it runs without a key",
            param="id",
        )
    return json_response(EngineKey(replica=r.id, api_key=key))


async def openapi(request: web.Request) -> web.Response:
    from llmgw.controller.api.openapi import document

    return web.Response(body=document(), content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def status_page(request: web.Request) -> web.Response:
    return request.app[STATUS_FILES].response("index.html")


async def status_static(request: web.Request) -> web.Response:
    return request.app[STATUS_FILES].response(request.match_info["file"])


async def admin_status(request: web.Request) -> web.Response:
    """The status page's data: summary, nodes, models, replicas, events (compact rows)."""
    doc = await status_data(_svc(request))
    return web.Response(body=encode(doc), content_type="application/json")


def routes() -> list[web.RouteDef]:
    return [
        web.get("/healthz", healthz),
        web.get("/metrics", metrics),
        web.get("/status", status_page),
        web.get("/status/", status_page),
        web.get("/status/static/{file}", status_static),
        web.get("/admin/status", admin_status),
        web.get("/openapi.json", openapi),
        web.post("/v1/agents/{node}/heartbeat", heartbeat),
        web.get("/v1/endpoints", endpoints),
        web.get("/admin/summary", summary),
        web.get("/admin/nodes", list_nodes),
        web.get("/admin/nodes/{name}", get_node),
        web.post("/admin/nodes/{name}/cordon", _node_command("cordoned")),
        web.post("/admin/nodes/{name}/uncordon", _node_command("active")),
        web.post("/admin/nodes/{name}/drain", _node_command("draining")),
        web.get("/admin/models", list_models),
        web.post("/admin/models", apply_models),
        # Model names may hold "/" (e.g. "meta-llama/Llama-3.1-8B"); scale is matched first.
        web.post("/admin/models/{name:.+}/scale", scale_model),
        web.get("/admin/models/{name:.+}", get_model),
        web.delete("/admin/models/{name:.+}", delete_model),
        web.get("/admin/replicas", list_replicas),
        web.get("/admin/replicas/{id}", get_replica),
        web.post("/admin/replicas/{id}/weight", set_weight),
        web.post("/admin/replicas/{id}/engine-key", engine_key),
        web.get("/admin/events", events),
    ]


def middlewares() -> list[Callable[..., Any]]:
    return [_errors]
