"""Loopback-only debug routes, for benchmarks and tests (any other peer gets a 403).

- `GET /sim/cache`: every cached KV block (id, hash as hex, reference count)
  and the recipe to compute a prompt's block hashes (kvcache.py), so an oracle
  can know each engine's cache exactly.
- `GET /sim/state`: running and waiting requests, free and cached blocks,
  steps, preemptions, evictions, timeline slips, current faults, the W3C
  trace context (`traceparent`, `tracestate`) of the last request that had one
  (bytes that are not UTF-8 escaped as `\\xff`),
  and the sleeps, wakes and `/wake_up` calls answered (sleep.py).
- `POST /sim/faults`: change the faults at run time (faults.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw.runtime.logs import kv
from llmgw.runtime.netaddr import is_loopback
from llmgw.simengine import api
from llmgw.simengine.conn import header_text
from llmgw.simengine.faults import FaultPatch
from llmgw.simengine.kvcache import HASH_RECIPE, NONE_HASH

if TYPE_CHECKING:
    from llmgw.simengine.app import SimEngine

log = logging.getLogger(__name__)

PREFIX = "/sim/"


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(body), status=status, content_type="application/json"
    )


def _error(exc: api.SimApiError) -> web.Response:
    return web.Response(body=exc.body(), status=exc.status, content_type="application/json")


@web.middleware
async def loopback_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith(PREFIX) and not is_loopback(request.remote):
        return _error(api.SimApiError(403, "the /sim/ routes answer loopback peers only"))
    return await handler(request)


def trace_recorder(sim: SimEngine) -> Middleware:
    """Keeps the trace context of the last request that carried one (`last_trace`), so a
    test sees what reached the engine; bytes that are not UTF-8 escaped (header_text),
    so /sim/state can always answer it."""

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        tp = request.headers.get("traceparent")
        if tp is not None:
            sim.last_trace = {"traceparent": header_text(tp)}
            ts = request.headers.get("tracestate")
            if ts is not None:
                sim.last_trace["tracestate"] = header_text(ts)
        return await handler(request)

    return record


def add_routes(app: web.Application, sim: SimEngine) -> None:
    async def cache(_request: web.Request) -> web.StreamResponse:
        blocks = [
            {"block_id": b.block_id, "hash": b.hash.hex(), "ref_cnt": b.ref_cnt}
            for b in sim.kv.snapshot()
        ]
        return _json(
            {
                "block_size": sim.kv.block_size,
                "num_gpu_blocks": sim.kv.num_gpu_blocks,
                "hash_recipe": HASH_RECIPE,
                "none_hash": NONE_HASH.hex(),
                "num_cached_blocks": len(blocks),
                "blocks": blocks,
            }
        )

    async def state(_request: web.Request) -> web.StreamResponse:
        s, kv = sim.scheduler, sim.kv
        return _json(
            {
                "running": s.num_running,
                "waiting": s.num_waiting,
                "running_ids": s.running_snapshot(),
                "waiting_ids": s.waiting_snapshot(),
                "num_gpu_blocks": kv.num_gpu_blocks,
                "free_blocks": kv.num_free_blocks,
                "cached_blocks": kv.num_cached_blocks,
                "kv_usage": kv.usage,
                "evictions": kv.evictions,
                "steps": sim.stats.steps,
                "preemptions": sim.stats.preemptions,
                "lag_resets": sim.engine.lag_resets,
                "faults": msgspec.to_builtins(sim.faults.config),
                "last_trace": sim.last_trace,
                "sleeps": sim.sleeper.sleeps,
                "wakes": sim.sleeper.wakes,
                "wake_calls": sim.sleeper.wake_calls,
            }
        )

    def _refused(exc: api.SimApiError) -> web.Response:
        log.warning(
            kv("refused request", status=exc.status, path="/sim/faults", why=exc.message[:120])
        )
        return _error(exc)

    async def faults(request: web.Request) -> web.StreamResponse:
        try:
            patch = msgspec.json.decode(await request.read(), type=FaultPatch)
            config = sim.faults.update(patch)
        except (msgspec.DecodeError, ValueError) as exc:
            return _refused(api.SimApiError(400, f"bad faults: {exc}"))
        except RecursionError:
            return _refused(api.SimApiError(400, "bad faults: nested too deeply"))
        log.info("faults changed %s", msgspec.to_builtins(config))
        return _json(config)

    async def reset_prefix_cache(_request: web.Request) -> web.StreamResponse:
        # vLLM's dev-mode route (VLLM_SERVER_DEV_MODE=1): 200 either way, the refusal
        # while requests run only logged; here the answer says which it was.
        done = sim.kv.reset_prefix_cache()
        if sim.kv_events is not None:
            sim.kv_events.flush()  # AllBlocksCleared goes out now, not at the next step
        if not done:
            log.warning("reset_prefix_cache refused: requests still hold blocks")
        return _json({"reset": done})

    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_get(PREFIX + "cache", cache)
    app.router.add_get(PREFIX + "state", state)
    app.router.add_post(PREFIX + "faults", faults)
