"""`GET /openapi.json`: the controller's API as OpenAPI 3.1.

Schemas are generated from the wire types themselves (msgspec), so they cannot
drift from what the handlers decode and encode; the paths are written here,
one entry per route in api.routes() (a test checks that every route appears).
"""

from __future__ import annotations

import functools
import re
from typing import Any, get_args

import msgspec

from llmgw import __version__
from llmgw.controller.api.pages import KEY_NAMES, MODEL_NAMES, NameSet
from llmgw.controller.api.schemarules import edge_rules
from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.admin import (
    DEFAULT_PAGE_LIMIT,
    MAX_PAGE_LIMIT,
    DrainRequest,
    EngineKey,
    EventView,
    ModelView,
    NodeView,
    ReplicaState,
    ReplicaView,
    Summary,
    WeightRequest,
)
from llmgw.wire.agent import Heartbeat, HeartbeatReply
from llmgw.wire.endpoints import EndpointList
from llmgw.wire.errors import ErrorBody
from llmgw.wire.keys import KeyCreate, KeyCreated, KeyRevoked, KeyView
from llmgw.wire.leases import LeaseAnswer
from llmgw.wire.logs import DEFAULT_TAIL_LINES, MAX_RANK, MAX_TAIL_LINES, ReplicaLogs
from llmgw.wire.models import NAME_PATTERN, ModelSpec, ScaleRequest
from llmgw.wire.names import LABEL_PATTERN
from llmgw.wire.usage import (
    DEFAULT_SINCE_S,
    DEFAULT_USAGE_LIMIT,
    MAX_SINCE_S,
    MAX_USAGE_LIMIT,
    UsageAnswer,
    UsageReport,
)

_TYPES: tuple[Any, ...] = (
    Heartbeat,
    HeartbeatReply,
    EndpointList,
    UsageReport,
    Summary,
    NodeView,
    ModelView,
    ReplicaView,
    EventView,
    ModelSpec,
    AdapterSpec,
    ScaleRequest,
    DrainRequest,
    WeightRequest,
    EngineKey,
    ReplicaLogs,
    KeyCreate,
    KeyCreated,
    KeyView,
    KeyRevoked,
    UsageAnswer,
    LeaseAnswer,
    ErrorBody,
)
_REF = "#/components/schemas/{name}"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(name=name)}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _ok(schema: dict[str, Any] | None, what: str = "OK") -> dict[str, Any]:
    if schema is None:
        return {"204": {"description": what}}
    return {"200": {"description": what, **_json(schema)}}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "malformed body or query (message and param name the field)",
        401: "missing or wrong bearer token",
        403: "a valid token outside its scope (the read-only token may only GET what it may "
        "read; the engine key is the admin token's alone)",
        404: "unknown node, model or replica",
        409: "a name is taken: served by another model (apply), or a live node's, heartbeated "
        "from another address (heartbeat); the replica has no engine key yet (engine-key)",
        413: "the body is over the 16 MiB limit",
        422: "the body breaks a rule of its type (param is the field path)",
        503: "not_leader (a standby), the store refused the write, or too many long-polls",
        504: "the node's agent did not answer in time (logs)",
    }
    return {str(c): {"description": words[c], **_json(_ref("ErrorBody"))} for c in codes}


def _op(
    summary: str,
    ok: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    body_required: bool = True,
    errors: tuple[int, ...] = (401,),
    params: tuple[dict[str, Any], ...] = (),
    secure: bool = True,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {**ok, **_errors(*errors)}}
    if body is not None:
        op["requestBody"] = {"required": body_required, **_json(body)}
    if params:
        op["parameters"] = list(params)
    if not secure:
        op["security"] = []
    return op


def _path(name: str, what: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": what,
        "schema": {"type": "string"},
    }


def _query(name: str, schema: dict[str, Any], what: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": what, "schema": schema}


def _array(name: str) -> dict[str, Any]:
    return {"type": "array", "items": _ref(name)}


def _paged(summary: str, item: str, names: NameSet) -> dict[str, Any]:
    """A list answered in pages by name (api/pages.py): `after` and `limit` in, a Link
    to the next page out."""
    op = _op(
        f"{summary}; in pages by name: at most `limit` (default {DEFAULT_PAGE_LIMIT}), a "
        'Link rel="next" header when more follow',
        _ok(_array(item), "a page"),
        errors=(400, 401),
        params=(
            _query(
                "after",
                {"type": "string", "pattern": names.pattern.pattern},
                f"only those after this {names.what} (the last of the page before); it "
                "need not exist",
            ),
            _query(
                "limit",
                {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_PAGE_LIMIT,
                    "default": DEFAULT_PAGE_LIMIT,
                },
                "at most this many",
            ),
        ),
    )
    op["responses"]["200"]["headers"] = {
        "Link": {
            "description": 'present when more follow: `<PATH?after=NAME&limit=N>; rel="next"`',
            "schema": {"type": "string"},
        }
    }
    return op


@functools.cache
def query_names(method: str, template: str) -> frozenset[str] | None:
    """The query parameters this document lists for `method` on the route `template`
    (`/admin/models/{name}`, as aiohttp's resource names it); None: no such operation."""
    ops = msgspec.json.decode(document())["paths"].get(template)
    op = None if ops is None else ops.get("get" if method == "HEAD" else method.lower())
    if op is None:
        return None
    return frozenset(p["name"] for p in op.get("parameters", ()) if p["in"] == "query")


def allowed_methods(path: str) -> str | None:
    """The methods this document lists for `path` (an `Allow` header), or None if none match.

    Model names may hold "/", so /admin/models/a/scale also matches {name}; the
    template with the most literal text wins, as the routes are matched.
    """
    best: tuple[int, str] | None = None
    for template, methods in _templates():
        if template.fullmatch(path):
            literal = len(template.pattern) - template.pattern.count("(")
            if best is None or literal > best[0]:
                best = (literal, methods)
    return None if best is None else best[1]


@functools.cache
def _templates() -> tuple[tuple[re.Pattern[str], str], ...]:
    paths = msgspec.json.decode(document())["paths"]
    out = []
    for template, ops in paths.items():
        pattern = re.sub(
            r"\\\{(\w+)\\\}",
            lambda m: "(.+)" if m.group(1) == "name" else "([^/]+)",
            re.escape(template),
        )
        methods = sorted(m.upper() for m in ops)
        if "GET" in methods:
            methods.append("HEAD")
        out.append((re.compile(pattern), ", ".join(methods)))
    return tuple(out)


@functools.cache
def document() -> bytes:
    (_, components) = msgspec.json.schema_components(_TYPES, ref_template=_REF)
    edge_rules(components)
    node = _path("name", "node name")
    model = {
        **_path("name", "model name (may contain '/', never ends in '/scale')"),
        "schema": {"type": "string", "pattern": NAME_PATTERN},
    }
    rid = _path("id", "replica id")
    paths: dict[str, Any] = {
        "/healthz": {
            "get": _op(
                "liveness, leadership and version",
                _ok(
                    {
                        "type": "object",
                        "properties": {
                            "status": {"type": "string"},
                            "leader": {"type": "boolean"},
                            "version": {"type": "string"},
                        },
                        "required": ["status", "leader", "version"],
                    }
                ),
                errors=(),
                secure=False,
            )
        },
        "/openapi.json": {
            "get": _op("this document", _ok({"type": "object"}), errors=(), secure=False)
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics (docs/metrics.md); admin or read-only token",
                {"200": {"description": "text/plain; version=0.0.4"}},
                errors=(401,),
            )
        },
        "/status": {
            "get": _op(
                "the status page (docs/status-page.md); static, holds no data",
                {"200": {"description": "text/html"}},
                errors=(),
                secure=False,
            )
        },
        "/status/": {
            "get": _op(
                "the status page, same as /status",
                {"200": {"description": "text/html"}},
                errors=(),
                secure=False,
            )
        },
        "/status/static/{file}": {
            "get": _op(
                "the status page's script and style, shipped in the package",
                {"200": {"description": "text/javascript or text/css"}},
                errors=(404,),
                params=(_path("file", "status.js or status.css"),),
                secure=False,
            )
        },
        "/admin/status": {
            "get": _op(
                "the status page's data: the summary plus nodes, models, replicas and recent "
                "events as compact rows (docs/status-page.md); admin or read-only token",
                _ok({"type": "object"}),
                errors=(401,),
            )
        },
        "/v1/agents/{node}/heartbeat": {
            "post": _op(
                "agent heartbeat: inventory and shard status in, desired shards out (idempotent)",
                _ok(_ref("HeartbeatReply")),
                body=_ref("Heartbeat"),
                errors=(400, 401, 409, 413, 422, 503),
                params=(
                    {
                        **_path("node", "node name (must equal the body's node)"),
                        "schema": {"type": "string", "pattern": LABEL_PATTERN},
                    },
                ),
            )
        },
        "/v1/endpoints": {
            "get": _op(
                "EndpointSink long-poll: returns at once if the version differs from `after`, "
                "else when it changes or after timeout_s",
                _ok(_ref("EndpointList")),
                errors=(400, 401, 503),
                params=(
                    _query(
                        "after",
                        {"type": "integer", "minimum": -(2**62), "maximum": 2**62},
                        "the version the caller holds",
                    ),
                    _query(
                        "timeout_s",
                        {"type": "number", "default": 30, "minimum": 0},
                        "longest wait in seconds (above 60 waits 60; below 0 is refused)",
                    ),
                ),
            )
        },
        "/v1/usage": {
            "post": _op(
                "router usage report (last_used, in flight, demand, load, token totals, "
                "limited keys' demand); 200 with the router's shares of every limited key "
                "once its token rows are kept, 503 when the database refused them; a "
                "standby relays it to the leader and passes the leader's answer on (503 "
                "not_leader, rows kept, when the leader does not answer)",
                _ok(_ref("LeaseAnswer"), "accepted: this router's leases"),
                body=_ref("UsageReport"),
                errors=(400, 401, 413, 422, 503),
            )
        },
        "/admin/summary": {"get": _op("the fleet summary", _ok(_ref("Summary")))},
        "/admin/nodes": {"get": _op("every node, sorted by name", _ok(_array("NodeView")))},
        "/admin/nodes/{name}": {
            "get": _op("one node", _ok(_ref("NodeView")), errors=(401, 404), params=(node,))
        },
        "/admin/nodes/{name}/cordon": {
            "post": _op(
                "place nothing new on the node (no body, or `{}`)",
                _ok(_ref("NodeView")),
                errors=(400, 401, 404, 413, 422, 503),
                params=(node,),
            )
        },
        "/admin/nodes/{name}/uncordon": {
            "post": _op(
                "make the node placeable again (no body, or `{}`)",
                _ok(_ref("NodeView")),
                errors=(400, 401, 404, 413, 422, 503),
                params=(node,),
            )
        },
        "/admin/nodes/{name}/drain": {
            "post": _op(
                "move the node's replicas elsewhere (make-before-break), then leave it empty; "
                "a replica with no placeable replacement keeps serving (drain_waiting says "
                "why) unless force is set, or known-idle replicas of other models are evicted "
                "for it when evict_idle is set",
                _ok(_ref("NodeView")),
                body=_ref("DrainRequest"),
                body_required=False,
                errors=(400, 401, 404, 413, 422, 503),
                params=(node,),
            )
        },
        "/admin/models": {
            "get": _paged("models sorted by name", "ModelView", MODEL_NAMES),
            "post": _op(
                "apply one model spec or a list of them, all or nothing",
                _ok(_array("ModelView")),
                # An entry with `adapter_of` is a LoRA adapter's (AdapterSpec).
                body={
                    "oneOf": [
                        _ref("ModelSpec"),
                        _ref("AdapterSpec"),
                        {
                            "type": "array",
                            "items": {"oneOf": [_ref("ModelSpec"), _ref("AdapterSpec")]},
                            "minItems": 1,
                        },
                    ]
                },
                errors=(400, 401, 409, 413, 422, 503),
            ),
        },
        "/admin/models/{name}": {
            "get": _op("one model", _ok(_ref("ModelView")), errors=(401, 404), params=(model,)),
            "delete": _op(
                "delete the model (its replicas drain) or the LoRA adapter (no body, or `{}`)",
                _ok(
                    {
                        "type": "object",
                        "properties": {
                            "deleted": {"type": "string"},
                            # Present when the name was a LoRA adapter's: its base.
                            "adapter_of": {"type": "string"},
                        },
                        "required": ["deleted"],
                    }
                ),
                errors=(400, 401, 404, 409, 413, 422, 503),
                params=(model,),
            ),
        },
        "/admin/models/{name}/scale": {
            "post": _op(
                "change min and/or max replicas (400 if max < min after the merge, or if "
                "neither is given)",
                _ok(_ref("ModelView")),
                # At least one bound: an empty request would change nothing.
                body={"allOf": [_ref("ScaleRequest")], "minProperties": 1},
                errors=(400, 401, 404, 413, 422, 503),
                params=(model,),
            )
        },
        "/admin/replicas": {
            "get": _op(
                "replicas sorted by id (idle_seconds -1 when unknown)",
                _ok(_array("ReplicaView")),
                errors=(400, 401),
                params=(
                    _query("model", {"type": "string"}, "only this model's"),
                    _query(
                        "state",
                        {"enum": list(get_args(ReplicaState))},
                        "only replicas in this state",
                    ),
                ),
            )
        },
        "/admin/replicas/{id}": {
            "get": _op("one replica", _ok(_ref("ReplicaView")), errors=(401, 404), params=(rid,))
        },
        "/admin/replicas/{id}/weight": {
            "post": _op(
                "record the capacity weight `ctl bench` measured",
                _ok(_ref("ReplicaView")),
                body=_ref("WeightRequest"),
                errors=(400, 401, 404, 413, 422, 503),
                params=(rid,),
            )
        },
        "/admin/replicas/{id}/engine-key": {
            "post": _op(
                "the key the replica's engine requires (for `ctl bench`); admin token only, "
                "never the read-only one; 409 while no engine key is known",
                _ok(_ref("EngineKey")),
                errors=(400, 401, 403, 404, 409, 413, 422),
                params=(rid,),
            )
        },
        "/admin/replicas/{id}/logs": {
            "get": _op(
                "the last lines of a replica shard's engine log, asked of its node's agent "
                "(docs/controller.md#replica-logs); admin token only, never the read-only "
                "one; 404 also when the node no longer keeps the log, 503 when the node "
                "is unreachable, 504 when its agent does not answer",
                _ok(_ref("ReplicaLogs")),
                errors=(400, 401, 403, 404, 409, 503, 504),
                params=(
                    rid,
                    _query(
                        "tail",
                        {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_TAIL_LINES,
                            "default": DEFAULT_TAIL_LINES,
                        },
                        "how many lines, the newest",
                    ),
                    _query(
                        "rank",
                        {"type": "integer", "minimum": 0, "maximum": MAX_RANK, "default": 0},
                        "which shard of a multi-node replica",
                    ),
                ),
            )
        },
        "/admin/keys": {
            "get": _paged(
                "client keys sorted by name, with their limits; never a key or its hash",
                "KeyView",
                KEY_NAMES,
            ),
            "post": _op(
                "create a client key; the answer holds the key, shown this once "
                "(409 when the name is taken)",
                {"201": {"description": "created", **_json(_ref("KeyCreated"))}},
                body=_ref("KeyCreate"),
                errors=(400, 401, 403, 409, 413, 422, 503),
            ),
        },
        "/admin/keys/{name}": {
            "delete": _op(
                "revoke a client key: every router refuses it within seconds",
                _ok(_ref("KeyRevoked")),
                errors=(400, 401, 403, 404, 503),
                params=(
                    {
                        **_path("name", "key name"),
                        "schema": {"type": "string", "pattern": LABEL_PATTERN},
                    },
                ),
            )
        },
        "/admin/usage": {
            "get": _op(
                "token usage by hour and key, team or model (docs/tenants.md#usage); "
                "admin or read-only token",
                _ok(_ref("UsageAnswer")),
                errors=(400, 401, 503),
                params=(
                    _query(
                        "by",
                        {"type": "string", "enum": ["key", "team", "model"], "default": "key"},
                        "what the rows are grouped by",
                    ),
                    _query(
                        "since_s",
                        {
                            "type": "number",
                            "exclusiveMinimum": 0,
                            "maximum": MAX_SINCE_S,
                            "default": DEFAULT_SINCE_S,
                        },
                        "from the hour that holds the moment this many seconds ago",
                    ),
                    _query(
                        "limit",
                        {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_USAGE_LIMIT,
                            "default": DEFAULT_USAGE_LIMIT,
                        },
                        "at most this many rows: the newest whole hours that fit "
                        "(truncated says some were left out)",
                    ),
                ),
            )
        },
        "/admin/events": {
            "get": _op(
                "the event log, oldest first (the last `limit` matching); with `id`, 404 "
                "when no event has it, saying so when it aged out",
                _ok(_array("EventView")),
                errors=(400, 401, 404, 503),
                params=(
                    _query("model", {"type": "string"}, "events of this model"),
                    _query("replica", {"type": "string"}, "events about this replica"),
                    _query("node", {"type": "string"}, "events about this node"),
                    _query(
                        "id",
                        {"type": "integer", "minimum": 1, "maximum": 2**62},
                        "only the event with this id (`ctl events --detail ID`)",
                    ),
                    _query(
                        "limit",
                        {"type": "integer", "default": 200, "minimum": 1, "maximum": 10000},
                        "how many",
                    ),
                ),
            )
        },
    }
    # routes._errors refuses a query parameter an API route does not list: 400 on every one.
    for template, ops in paths.items():
        for op in ops.values() if template.startswith(("/admin/", "/v1/")) else ():
            op["responses"] = dict(sorted({**op["responses"], **_errors(400)}.items()))
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "llmgw controller", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        # Every route needs the token when one is configured, except those that
        # clear this with an empty list.
        "security": [{"bearer": []}],
    }
    return msgspec.json.encode(doc)
