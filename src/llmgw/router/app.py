"""The router's aiohttp application: routes, admin surface, background loops.

`build_app(cfg, config_path=...)` builds it; `main.py` serves it with the one
shared runner (`runtime.serve`). Background loops (scrape, usage report,
config watcher, controller long-poll) start with the app and are cancelled
and awaited when it stops: no orphan tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Coroutine
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from llmgw.router import compiled
from llmgw.router.apis.catalog import ROUTES as API_ROUTES
from llmgw.router.apis.passthrough import PassThrough
from llmgw.router.config import RouterConfig
from llmgw.router.control.sources import ConfigWatcher, ControllerClient, ControllerSource
from llmgw.router.control.usagereports import UsageReporter
from llmgw.router.errors import error_response
from llmgw.router.metrics import CONTENT_TYPE
from llmgw.router.replicas.scrape import HttpMetricsFetcher, Scraper
from llmgw.router.request.auth import admin_allowed, bearer_matches
from llmgw.router.request.proxy import POST_PATHS, Proxy
from llmgw.router.request.tracing import Tracing
from llmgw.router.routing.kvfollow import KVEventFollower
from llmgw.router.routing.scheduler import choose
from llmgw.router.wiring import Router
from llmgw.router.workers.ipc import ChannelClosed
from llmgw.router.workers.worker import WorkerLink
from llmgw.runtime.fastserver import Answer, FastRequest
from llmgw.runtime.logs import kv

log = logging.getLogger(__name__)

ROUTER = web.AppKey("router", Router)
SCRAPER = web.AppKey("scraper", Scraper)
REPORTER = web.AppKey("reporter", UsageReporter)
LINK = web.AppKey("link", WorkerLink)

Req = web.Request | FastRequest


class FastRoutes:
    """The app's routes for the protocol-level server (`http_server: fast`), by hand.

    The same table as the aiohttp router's below, matched the same way: the
    proxied POST routes first, then GET (and HEAD) ones, then the OpenAI-shaped
    404/405 for anything else.
    """

    def __init__(self, proxy: Proxy, passthrough: PassThrough) -> None:
        self.proxy = proxy
        self.passthrough = passthrough
        self.gets = {
            "/v1/models": proxy.models,
            "/health": health,
            "/healthz": healthz,
            "/readyz": readyz,
            "/metrics": metrics,
            "/admin/endpoints": admin_endpoints,
            "/admin/usage": admin_usage,
        }

    def __call__(self, request: FastRequest) -> Awaitable[Answer]:
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
            if path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX):
                request.match_info["model"] = path[len(MODEL_PREFIX) :]
                return self.proxy.model(request)
        if path.startswith("/v1/"):
            return self.proxy.no_route(request)
        return no_route(request)


MODEL_PREFIX = "/v1/models/"
FAST = web.AppKey("fast", FastRoutes)


def build_app(
    cfg: RouterConfig,
    *,
    config_path: str | Path | None = None,
    link: WorkerLink | None = None,
) -> web.Application:
    """The router application for `cfg`; with `config_path`, the file is watched for reloads.

    With `link` it is one worker of several (worker.py): the supervisor at the
    other end scrapes, reloads, follows the controller and reports usage for the
    host, and answers /metrics and /admin/usage for all the workers together.
    """
    built = compiled.STATUS
    if built.modules:
        log.info(kv("compiled modules", modules=",".join(built.modules), build=built.detail))
    else:
        log.info(kv("python modules", reason=built.detail))
    if link is not None:
        state = Router(cfg, shared=link.shared, router_id=link.setup.router_id)
        link.attach(state)
    else:
        state = Router(cfg)
    if cfg.tracing is not None:
        state.tracing = Tracing(cfg.tracing)
    proxy = Proxy(state)
    passthrough = PassThrough(proxy)
    app = web.Application(
        client_max_size=cfg.max_body_bytes,
        # A client that disconnects cancels its handler, which closes the upstream
        # connection and so aborts the engine's work on it. aiohttp's
        # default since 3.9 is to let the handler run on, generating for no one.
        handler_args={"handler_cancellation": True},
    )
    app[ROUTER] = state
    app[FAST] = FastRoutes(proxy, passthrough)
    loops: list[Coroutine[Any, Any, None]]
    watcher: ConfigWatcher | None = None
    if link is not None:
        app[LINK] = link
        loops = [link.run()]
    else:
        loops, watcher = _host_loops(app, state, cfg, config_path)
    # Every worker follows the engines' KV events itself: each keeps its own
    # prefix index, so each needs the exact block sets (docs/routing.md).
    loops.append(KVEventFollower(state.kv_events).run())

    async def background(app: web.Application) -> AsyncIterator[None]:
        await state.start_clients()
        tasks = [asyncio.create_task(c) for c in loops]
        for t in tasks:
            t.add_done_callback(_log_crash)
        loop = asyncio.get_running_loop()
        if watcher is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGHUP, watcher.request_reload)
        try:
            yield
        finally:
            if watcher is not None:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(signal.SIGHUP)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            reporter = app.get(REPORTER)
            if reporter is not None:
                # The requests answered since the last report: their token usage would
                # be lost with the process. The controller may be away; wait little.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reporter.tick(), timeout=2.0)
            await state.close_clients()
            if state.tracing is not None:
                # Spans still batched are sent before the process ends.
                await asyncio.to_thread(state.tracing.shutdown)

    app.cleanup_ctx.append(background)
    app.router.add_post("/v1/chat/completions", proxy.handle)
    app.router.add_post("/v1/completions", proxy.handle)
    app.router.add_post("/v1/embeddings", proxy.handle)
    for path in API_ROUTES:
        app.router.add_post(path, passthrough.handle)
    app.router.add_get("/v1/models", proxy.models)
    app.router.add_get("/v1/models/{model:.+}", proxy.model)
    # Last: every other /v1 path or method gets an OpenAI-shaped 404/405.
    app.router.add_route("*", "/v1/{tail:.*}", proxy.no_route)
    app.router.add_get("/health", health)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/endpoints", admin_endpoints)
    app.router.add_get("/admin/usage", admin_usage)
    # Very last: anything else is OpenAI's 404 (or 405), never aiohttp's text.
    app.router.add_route("*", "/{tail:.*}", no_route)
    return app


def _host_loops(
    app: web.Application, state: Router, cfg: RouterConfig, config_path: str | Path | None
) -> tuple[list[Coroutine[Any, Any, None]], ConfigWatcher | None]:
    """A one-process router's own chores: scrape, report usage, watch the file, follow
    the controller (with workers, the supervisor's: supervisor.py)."""
    scraper = Scraper(
        registry=state.registry,
        fetcher=HttpMetricsFetcher(state.upstream),
        interval_s=cfg.scrape_interval_s,
        timeout_s=cfg.scrape_timeout_s,
        concurrency=cfg.scrape_concurrency,
        on_restart=state.engine_restarted,
        on_failure=state.metrics.scrape_failed,
    )
    app[SCRAPER] = scraper
    controller = (
        None if cfg.controller is None else ControllerClient(cfg.controller, state.upstream)
    )
    reporter = UsageReporter(
        build=state.usage_report,
        sink=controller,
        interval_s=cfg.report_interval_s,
        drain=state.token_counts.drain,
        leased=state.leased,
        expire=state.lease_expire,
        clock=state.clock,
    )
    app[REPORTER] = reporter
    state.want_lease = reporter.wake

    def on_config(new: RouterConfig) -> None:
        scraper.interval_s = new.scrape_interval_s
        scraper.timeout_s = new.scrape_timeout_s
        scraper.concurrency = new.scrape_concurrency
        reporter.interval_s = new.report_interval_s

    state.on_config.append(on_config)

    loops: list[Coroutine[Any, Any, None]] = [scraper.run(), reporter.run()]
    watcher = None
    if config_path is not None:
        watcher = ConfigWatcher(config_path, on_config=state.apply_config, poll_s=cfg.reload_poll_s)
        loops.append(watcher.run())
    if controller is not None:
        loops.append(ControllerSource(controller, on_list=state.apply_list).run())
    return loops, watcher


# The router's own GET routes outside /v1; any other method on them is a 405.
GET_PATHS = frozenset(
    {"/health", "/healthz", "/readyz", "/metrics", "/admin/endpoints", "/admin/usage"}
)


async def no_route(request: Req) -> web.Response:
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


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error(kv("background loop crashed", task=task.get_name()), exc_info=task.exception())


async def health(request: Req) -> web.Response:
    """vLLM's and SGLang's liveness path, as they answer it: 200 and an empty body.

    Benchmark clients (guidellm) check it before they start; /healthz says more.
    """
    return web.Response(status=200)


async def healthz(request: Req) -> web.Response:
    # `program` and `controller` let `ctl --controller <this router>` say where to go.
    ctl = request.app[ROUTER].cfg.controller
    where = None if ctl is None else _without_userinfo(ctl.url)
    return web.json_response({"status": "ok", "program": "router", "controller": where})


def _without_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}"


async def readyz(request: Req) -> web.Response:
    ready = request.app[ROUTER].ready()
    return web.json_response({"ready": ready}, status=200 if ready else 503)


async def metrics(request: Req) -> web.Response:
    st = request.app[ROUTER]
    token = st.cfg.metrics_token
    if token is not None and not bearer_matches(token, request.headers.get("Authorization")):
        return error_response(
            401,
            "/metrics needs `Authorization: Bearer <metrics_token>`.",
            type="invalid_request_error",
            code="invalid_metrics_token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    link = request.app.get(LINK)
    if link is None:
        body = st.metrics.render()
    else:
        try:
            # Every worker's figures and the host's, merged by the supervisor.
            body = await link.ask("metrics")
        except (ChannelClosed, TimeoutError):
            return _supervisor_away()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def _supervisor_away() -> web.Response:
    return error_response(
        503,
        "This router worker cannot reach its supervisor; retry shortly.",
        type="server_error",
        code="supervisor_unavailable",
        headers={"Retry-After": "1"},
    )


def _admin_denied(request: Req) -> web.Response | None:
    st = request.app[ROUTER]
    if admin_allowed(
        token=st.cfg.admin_token,
        authorization=request.headers.get("Authorization"),
        remote=request.remote,
    ):
        return None
    return error_response(
        403 if st.cfg.admin_token is None else 401,
        "Admin endpoints need the admin token (or a loopback caller when none is set).",
        type="invalid_request_error",
        code="admin_only",
    )


def _json(obj: Any) -> web.Response:
    return web.Response(body=msgspec.json.encode(obj), content_type="application/json")


async def admin_endpoints(request: Req) -> web.Response:
    """The snapshots the scheduler sees, and what it would choose now for each model."""
    if (denied := _admin_denied(request)) is not None:
        return denied
    st = request.app[ROUTER]
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
            "upstream_client": st.upstream_client,
            "endpoints": _without_keys([s.as_builtins() for s in st.registry.snapshots()]),
            "prefix_entries": st.prefix.entries_by_endpoint(),
            "decisions": decisions,
        }
    )


def _without_keys(snaps: list[dict[str, object]]) -> list[dict[str, object]]:
    """Snapshots as shown: an engine's key never leaves the router."""
    for snap in snaps:
        info = snap.get("info")
        if isinstance(info, dict):
            info.pop("api_key", None)
    return snaps


async def admin_usage(request: Req) -> web.Response:
    """The usage report this router would send now (last_used absent when unknown)."""
    if (denied := _admin_denied(request)) is not None:
        return denied
    link = request.app.get(LINK)
    if link is None:
        return _json(request.app[ROUTER].usage_report(reset=False))
    try:
        # The report the supervisor would send for all the workers now.
        body = await link.ask("usage_peek")
    except (ChannelClosed, TimeoutError):
        return _supervisor_away()
    return web.Response(body=body, content_type="application/json")
