"""HTTP routes: the handlers, the route table, and the one way errors leave.

Handlers never decide anything themselves: they turn a request into values
(decode.py), call fleet/commands.py / fleet/agents.py through the Fleet (which
writes the store before memory), and encode the answer. Every request is
authorized (auth.py) and every error leaves through `_errors`, in the OpenAI
error shape (wire.errors.error_body), and nowhere else.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, get_args

import msgspec
from aiohttp import web

from llmgw import __version__
from llmgw.controller.api import pages
from llmgw.controller.api.auth import authorize
from llmgw.controller.api.decode import (
    decode,
    decode_drain,
    decode_specs,
    no_body,
    only_known_query,
    query,
    query_int,
    query_name,
)
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
from llmgw.controller.api.validate import check_heartbeat
from llmgw.controller.api.views import model_view, model_views, node_views, replica_view
from llmgw.controller.errors import Conflict, ControllerRefusal, InvalidRequest
from llmgw.controller.fleet import commands
from llmgw.controller.fleet.records import OperatorState
from llmgw.runtime.logs import kv
from llmgw.wire.admin import DrainRequest, EngineKey, EventView, ReplicaState, WeightRequest
from llmgw.wire.agent import Heartbeat
from llmgw.wire.errors import error_body
from llmgw.wire.models import ScaleRequest

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SERVICES = web.AppKey("services", Services)
METRICS = web.AppKey("metrics", ControllerMetrics)
STATUS_FILES = web.AppKey("status_files", StatusFiles)
REPLICA_STATES = frozenset(get_args(ReplicaState))
_encoder = msgspec.json.Encoder()


def json_response(
    value: object, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=_encoder.encode(value), status=status, content_type="application/json", headers=headers
    )


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        services = request.app[SERVICES]
        cfg = services.config
        authorize(
            request,
            cfg.token,
            cfg.read_token,
            cfg.metrics_token,
            scoped=cfg,
            names=cfg.own_names,
        )
        _check_query_names(request)
        return await handler(request)
    except ControllerRefusal as exc:
        status, kind = http_status(exc)
        if status < 500:
            # One line per refused request, whatever it sent (never a traceback).
            log.warning(
                kv(
                    "refused request",
                    status=status,
                    method=request.method,
                    path=request.path[:200],
                    why=exc.message[:160],
                )
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
        log.exception(kv("handler crashed", path=request.path[:200]))
        body = error_body("internal error; see the controller's log", type="server_error")
        return web.Response(body=body, status=500, content_type="application/json")


def _check_query_names(request: web.Request) -> None:
    """The API's routes (/admin, /v1) take only the query parameters /openapi.json lists."""
    resource = request.match_info.route.resource
    if not request.query or resource is None or not request.path.startswith(("/admin/", "/v1/")):
        return
    from llmgw.controller.api.openapi import query_names

    known = query_names(request.method, resource.canonical)
    if known is not None:
        only_known_query(request, known)


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
    reply = await s.fleet.heartbeat(hb)
    # Only once the heartbeat is accepted: a claimant of another's name answers nothing.
    s.log_asks.answered(node, hb.log_answers)
    asks = s.log_asks.pending(node)
    return json_response(msgspec.structs.replace(reply, log_asks=asks) if asks else reply)


async def endpoints(request: web.Request) -> web.Response:
    s = _svc(request)
    after = query_int(request, "after", None, -(2**62), 2**62)
    given = query(request, "timeout_s")
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
    out.flow_queued = s.usage.flow_queued()
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
    """A page of models by name (pages.py): views are built for its models alone."""
    s = _svc(request)
    at = pages.cursor(request, pages.MODEL_NAMES)
    state = s.fleet.state
    shown, more = pages.page(sorted(state.models), at)
    views = model_views(state, s.unplaceable(), names=shown)
    return json_response(views, headers=pages.next_link(request, shown, at, more=more))


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
    model = query_name(request, "model")
    state = query(request, "state")
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
    limit = query_int(request, "limit", 200, 1, 10_000) or 200
    found = await s.events(
        model=query_name(request, "model"),
        replica=query_name(request, "replica"),
        node=query_name(request, "node"),
        limit=limit,
        event_id=query_int(request, "id", None, 1, 2**62),
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
            await no_body(request, f"{'cordon' if to == 'cordoned' else 'uncordon'} request")
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
    await no_body(request, "delete request")
    base = await s.delete_model(name)
    if base is not None:
        return json_response({"deleted": name, "adapter_of": base})
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
    await no_body(request, "engine-key request")
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
    resp = web.Response(body=encode(doc), content_type="application/json")
    # Every open page fetches the whole fleet every few seconds: at 500 nodes and 3,000
    # replicas ~300 KB of JSON with long runs of repeated names, which gzip cuts ~10×.
    # Compressed off the event loop (aiohttp hands bodies over 4 KiB to an executor).
    resp.enable_compression()
    return resp


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
