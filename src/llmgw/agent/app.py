"""The agent's own small HTTP surface, loopback only.

    GET  /healthz                    {"status": "ok"}
    GET  /status                     service.AgentStatus (GPUs, shards, pids, controller)
    GET  /metrics                    Prometheus text (agent.metrics, docs/metrics.md)
    POST /gpus/{index}/unhealthy     {"reason": "..."} → the GPU (fake inventory only)
    POST /gpus/{index}/healthy       → the GPU (fake inventory only)

The server binds 127.0.0.1; a request from any other peer is refused with 403
all the same, so a misconfigured bind cannot expose fault injection. No token
guards it, so a web page in a browser on the node is refused too (403,
runtime/webpages.py): a write with a browser's `Origin` or `Sec-Fetch-Site`, and
any request whose `Host` is not an IP literal, localhost or one of
`allowed_hosts` (DNS rebinding). Fault routes answer 409 on real GPUs (NVML) and
404 for an unknown index.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
from aiohttp import web

from llmgw.agent.gpus.base import FaultInjectionUnsupported, UnknownGpu
from llmgw.agent.metrics import CONTENT_TYPE, AgentMetrics
from llmgw.agent.service import Agent
from llmgw.agent.statefile import refusal_in
from llmgw.runtime.logs import kv
from llmgw.runtime.netaddr import is_loopback
from llmgw.runtime.webpages import OwnNames, write_refusal

log = logging.getLogger(__name__)

AGENT_KEY: web.AppKey[Agent] = web.AppKey("agent", Agent)
METRICS_KEY: web.AppKey[AgentMetrics] = web.AppKey("metrics", AgentMetrics)
STOP_KEY: web.AppKey[asyncio.Event] = web.AppKey("stop", asyncio.Event)
NAMES_KEY: web.AppKey[OwnNames] = web.AppKey("names", OwnNames)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FaultRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: str = "marked unhealthy by an operator"


def _json(obj: object, status: int = 200) -> web.Response:
    body = msgspec.json.encode(obj)
    return web.Response(body=body, status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": {"message": message}}, status)


@web.middleware
async def loopback_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not is_loopback(request.remote):
        return _error(403, "the agent answers loopback clients only")
    why = write_refusal(request.method, request.headers)
    if why is None:
        why = request.app[NAMES_KEY].refusal(request.headers.get("Host"))
    if why is not None:
        log.warning(kv("refused request", status=403, path=request.path[:200], why=why[:160]))
        return _error(403, f"{request.method} {request.path}: {why}")
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # Unknown paths and methods in the agent's JSON shape, not aiohttp's text.
        resp = _error(exc.status, f"{request.method} {request.path}: {exc.reason}")
        if "Allow" in exc.headers:
            resp.headers["Allow"] = exc.headers["Allow"]
        return resp


async def healthz(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def status(request: web.Request) -> web.Response:
    return _json(request.app[AGENT_KEY].status())


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def _index(request: web.Request) -> int:
    try:
        return int(request.match_info["index"])
    except ValueError:
        raise web.HTTPNotFound() from None


async def gpu_unhealthy(request: web.Request) -> web.Response:
    index = _index(request)
    body = await request.read()
    try:
        req = msgspec.json.decode(body, type=FaultRequest) if body else FaultRequest()
    except (msgspec.DecodeError, RecursionError) as exc:
        # DecodeError covers ValidationError; RecursionError is JSON nested too deeply.
        why = str(exc) if isinstance(exc, msgspec.DecodeError) else "nested too deeply"
        log.warning(kv("refused request", status=400, path=request.path[:200], why=why[:120]))
        return _error(400, f"bad body: {why}")
    return _set_fault(request.app[AGENT_KEY], index, req.reason)


async def gpu_healthy(request: web.Request) -> web.Response:
    return _set_fault(request.app[AGENT_KEY], _index(request), None)


def _set_fault(agent: Agent, index: int, reason: str | None) -> web.Response:
    try:
        gpu = agent.inventory.set_fault(index, reason)
    except UnknownGpu as exc:
        return _error(404, str(exc))
    except FaultInjectionUnsupported as exc:
        return _error(409, str(exc))
    return _json(gpu)


def build_app(agent: Agent, *, stop: asyncio.Event | None = None) -> web.Application:
    """The app; its cleanup context runs the agent's loops for as long as it serves.

    If the loops die of an unexpected error, `stop` is set: an agent that no
    longer supervises must exit (and be restarted) rather than look alive.
    """
    app = web.Application(middlewares=[loopback_only])
    app[AGENT_KEY] = agent
    app[METRICS_KEY] = AgentMetrics(agent)
    app[STOP_KEY] = stop or asyncio.Event()
    # It binds 127.0.0.1 (main.py): no name of its own beyond those allowed.
    app[NAMES_KEY] = OwnNames(allowed=agent.config.allowed_hosts)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/gpus/{index}/unhealthy", gpu_unhealthy)
    app.router.add_post("/gpus/{index}/healthy", gpu_healthy)
    app.cleanup_ctx.append(_run_agent)
    return app


async def _run_agent(app: web.Application) -> AsyncIterator[None]:
    agent = app[AGENT_KEY]
    stop = app[STOP_KEY]
    task = asyncio.create_task(agent.run(), name="agent")

    def crashed(t: asyncio.Task[None]) -> None:
        if t.cancelled() or t.exception() is None:
            return
        refused = refusal_in(t.exception())
        if refused is not None:
            # A refusal, not a bug: one line, and main's exit 2 (no traceback).
            log.critical(kv("state folder refused, stopping", error=refused))
            agent.refusal = str(refused)
        else:
            log.critical("agent loops died", exc_info=t.exception())
            agent.crashed = True
        stop.set()

    task.add_done_callback(crashed)
    yield
    task.cancel()
    # The loops end by cancellation; anything else they raised is re-raised here, but a
    # refusal, which `crashed` reported in one line.
    try:
        await task
    except asyncio.CancelledError:
        pass
    except BaseException as exc:
        if refusal_in(exc) is None:
            raise
    await agent.close()
