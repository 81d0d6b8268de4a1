"""The router's route table and its own small routes: health, metrics, admin.

`FastRoutes` is the server's `Dispatch` (router/http/server.py): a request's
method and path pick its handler, the proxied POST routes first; every other
path or method gets an OpenAI-shaped 404 or 405, never a plain-text page.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

import msgspec

from llmgw.router.apis.catalog import ROUTES as API_ROUTES
from llmgw.router.apis.passthrough import PassThrough
from llmgw.router.control.sources import ConfigWatcher
from llmgw.router.http.answers import JSON, Whole, json_whole, whole
from llmgw.router.http.connection import Answer, Request
from llmgw.router.metrics import CONTENT_TYPE
from llmgw.router.request.auth import admin_allowed, bearer_matches
from llmgw.router.request.listing import MODEL_PREFIX, Listing, serves_get
from llmgw.router.request.proxy import POST_PATHS, Proxy
from llmgw.router.request.refusals import error_response
from llmgw.router.routing.scheduler import choose
from llmgw.router.wiring import Router
from llmgw.router.workers.ipc import ChannelClosed
from llmgw.router.workers.worker import WorkerLink
from llmgw.runtime.webpages import OwnNames, write_refusal

log = logging.getLogger(__name__)

Req = Request


class FastRoutes:
    """The router's routes (its server's `Dispatch`), matched by hand.

    The proxied POST routes first, then GET (and HEAD) ones, then the
    OpenAI-shaped 404/405 for anything else (never a plain-text page). `link`:
    in a worker (--workers N), its link to the supervisor, which answers
    /metrics, /admin/usage and /admin/config for all the workers together.
    `watcher`: the config file's, in a one-process router that watches one.
    `host`: the listen address (--host), a name the admin routes answer without a token.
    """

    def __init__(
        self,
        proxy: Proxy,
        passthrough: PassThrough,
        *,
        link: WorkerLink | None = None,
        watcher: ConfigWatcher | None = None,
        host: str | None = None,
    ) -> None:
        self.proxy = proxy
        self.passthrough = passthrough
        own = _Own(proxy.state, link, host, watcher)
        self.listing = Listing(proxy.state)
        self.gets = {
            "/v1/models": self.listing.models,
            "/health": health,
            "/healthz": own.healthz,
            "/readyz": own.readyz,
            "/metrics": own.metrics,
            "/admin/endpoints": own.admin_endpoints,
            "/admin/usage": own.admin_usage,
            "/admin/config": own.admin_config,
        }

    def __call__(self, request: Request) -> Awaitable[Answer]:
        # Not a coroutine itself: it hands back the handler's, which the server
        # awaits directly. An async wrapper here (this module is not compiled) was
        # an interpreted frame that every resumption of a proxied request passed
        # through (bench/router_overhead.py --instructions).
        path, method = request.path, request.method
        if method == "POST" and path in POST_PATHS:
            return self.proxy.answer(request)
        if method == "POST" and path in API_ROUTES:
            return self.passthrough.answer(request)
        if method == "GET" or method == "HEAD":
            handler = self.gets.get(path)
            if handler is not None:
                return handler(request)
            if serves_get(path):
                request.match_info["model"] = path[len(MODEL_PREFIX) :]
                return self.listing.model(request)
        if path.startswith("/v1/"):
            return self.listing.no_route(request)
        return no_route(request)


# The router's own GET routes outside /v1; any other method on them is a 405.
GET_PATHS = frozenset(
    {
        "/health",
        "/healthz",
        "/readyz",
        "/metrics",
        "/admin/endpoints",
        "/admin/usage",
        "/admin/config",
    }
)


async def no_route(request: Req) -> Whole:
    """A path the router does not serve: OpenAI's error object, like every other answer."""
    path, method = request.path, request.method
    if path in API_ROUTES:
        return error_response(
            405,
            f"Method {method} is not allowed on {path}; use POST.",
            type="invalid_request_error",
            code="method_not_allowed",
            headers={"Allow": "POST"},
        )
    if path in GET_PATHS:
        return error_response(
            405,
            f"Method {method} is not allowed on {path}; use GET.",
            type="invalid_request_error",
            code="method_not_allowed",
            headers={"Allow": "GET, HEAD"},
        )
    return error_response(
        404,
        f"Invalid URL ({method} {path}).",
        type="invalid_request_error",
        code="unknown_url",
    )


async def health(request: Req) -> Whole:
    """vLLM's and SGLang's liveness path, as they answer it: 200 and an empty body.

    Benchmark clients (guidellm) check it before they start; /healthz says more.
    """
    return whole(200)


def _without_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}"


class _Own:
    """The router's own routes that read its state: health, readiness, metrics, admin."""

    def __init__(
        self,
        state: Router,
        link: WorkerLink | None,
        host: str | None,
        watcher: ConfigWatcher | None,
    ) -> None:
        self.state = state
        self.link = link
        self.host = host
        self.watcher = watcher

    async def healthz(self, request: Req) -> Whole:
        # `program` and `controller` let `ctl --controller <this router>` say where to go.
        ctl = self.state.cfg.controller
        where = None if ctl is None else _without_userinfo(ctl.url)
        return json_whole({"status": "ok", "program": "router", "controller": where})

    async def readyz(self, request: Req) -> Whole:
        ready = self.state.ready()
        return json_whole({"ready": ready}, status=200 if ready else 503)

    async def metrics(self, request: Req) -> Whole:
        st = self.state
        token = st.cfg.metrics_token
        if token is not None and not bearer_matches(token, request.headers.get("Authorization")):
            return error_response(
                401,
                "/metrics needs `Authorization: Bearer <metrics_token>`.",
                type="invalid_request_error",
                code="invalid_metrics_token",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if self.link is None:
            body = st.metrics.render()
        else:
            try:
                # Every worker's figures and the host's, merged by the supervisor.
                body = await self.link.ask("metrics")
            except (ChannelClosed, TimeoutError):
                return _supervisor_away()
        return whole(200, body, content_type=CONTENT_TYPE)

    def _admin_denied(self, request: Req) -> Whole | None:
        """The answer that refuses an admin request, or None to serve it.

        Only the admin routes ask about web pages (runtime/webpages.py): a client
        reaches /v1 by any name, and that path pays nothing for the check.
        """
        cfg = self.state.cfg
        why = write_refusal(request.method, request.headers)
        if why is None and cfg.admin_token is None:
            # Tokenless, loopback is the guard, and a rebound name gets past it.
            names = OwnNames(bind=self.host, allowed=cfg.allowed_hosts)
            why = names.refusal(request.headers.get("Host"))
        if why is not None:
            return error_response(403, why, type="permission_error", code="web_page_refused")
        if admin_allowed(
            token=cfg.admin_token,
            authorization=request.headers.get("Authorization"),
            remote=request.remote,
        ):
            return None
        return error_response(
            403 if cfg.admin_token is None else 401,
            "Admin endpoints need the admin token (or a loopback caller when none is set).",
            type="invalid_request_error",
            code="admin_only",
        )

    async def admin_endpoints(self, request: Req) -> Whole:
        """The snapshots the scheduler sees, and what it would choose now for each model."""
        if (denied := self._admin_denied(request)) is not None:
            return denied
        st = self.state
        decisions = {}
        for model in sorted(st.known_models):
            d = choose(st.registry.snapshots(model))
            decisions[model] = {
                "endpoint_id": d.endpoint_id,
                "reason": d.reason,
                "header": d.header(),
                "scores": msgspec.to_builtins(d.scores),
            }
        return _json(
            {
                "router_id": st.router_id,
                # Which worker answered (--workers N); null for a one-process router.
                "worker": st.worker_index,
                "policy": st.policy.name,
                "endpoints": _without_keys([s.as_builtins() for s in st.registry.snapshots()]),
                "prefix_entries": st.prefix.entries_by_endpoint(),
                "decisions": decisions,
            }
        )

    async def admin_usage(self, request: Req) -> Whole:
        """The usage report this router would send now (last_used absent when unknown)."""
        if (denied := self._admin_denied(request)) is not None:
            return denied
        if self.link is None:
            return _json(self.state.usage_report(reset=False))
        try:
            # The report the supervisor would send for all the workers now.
            body = await self.link.ask("usage_peek")
        except (ChannelClosed, TimeoutError):
            return _supervisor_away()
        return whole(200, body, content_type=JSON)

    async def admin_config(self, request: Req) -> Whole:
        """What became of the config file's last load: whether it is in force, when the
        last one that was went in, the error of a refused one, the restart-only fields
        that wait for a restart (control/reloadstatus.py); null when no file is watched."""
        if (denied := self._admin_denied(request)) is not None:
            return denied
        if self.link is None:
            return _json(None if self.watcher is None else self.watcher.status)
        try:
            # The supervisor watches the file for all the workers.
            body = await self.link.ask("config")
        except (ChannelClosed, TimeoutError):
            return _supervisor_away()
        return whole(200, body, content_type=JSON)


def _supervisor_away() -> Whole:
    return error_response(
        503,
        "This router worker cannot reach its supervisor; retry shortly.",
        type="server_error",
        code="supervisor_unavailable",
        headers={"Retry-After": "1"},
    )


def _json(obj: Any) -> Whole:
    return whole(200, msgspec.json.encode(obj), content_type=JSON)


def _without_keys(snaps: list[dict[str, object]]) -> list[dict[str, object]]:
    """Snapshots as shown: an engine's key never leaves the router."""
    for snap in snaps:
        info = snap.get("info")
        if isinstance(info, dict):
            info.pop("api_key", None)
    return snaps
