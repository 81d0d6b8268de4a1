"""The sleep-mode routes (sleep.py says what they answer) on the sim-engine's app.

Only added with VLLM_SERVER_DEV_MODE=1, as vLLM adds its dev-mode routes. With
`--api-key` set they need the key, as every route but three does (auth.py's
middleware), which vLLM's own middleware does not ask for on these paths: see
sleep.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web

from llmgw.runtime.logs import kv
from llmgw.simengine import api
from llmgw.simengine.sleep import PAUSE_MODES, SleepRefused

if TYPE_CHECKING:
    from llmgw.simengine.app import SimEngine

log = logging.getLogger(__name__)

DEV_ENV_VAR = "VLLM_SERVER_DEV_MODE"
PATHS = ("/sleep", "/wake_up", "/is_sleeping")
# How often a sleep in "wait" mode looks whether the running requests are done.
_WAIT_POLL_S = 0.01


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(body), status=status, content_type="application/json"
    )


def _error(status: int, message: str) -> web.Response:
    exc = api.SimApiError(status, message)
    return web.Response(body=exc.body(), status=status, content_type="application/json")


def add_routes(app: web.Application, sim: SimEngine) -> None:
    sleeper = sim.sleeper
    engine = sim.engine
    # One sleep or wake at a time: a second wake waits for the first and finds it awake.
    lock = asyncio.Lock()

    async def sleep(request: web.Request) -> web.StreamResponse:
        raw_level = request.query.get("level", "1")
        mode = request.query.get("mode", "abort")
        try:
            level = int(raw_level)
        except ValueError:
            return _error(400, f"level: {raw_level!r} is not an integer")
        if mode not in PAUSE_MODES:
            return _error(400, f"mode: {mode!r} is not one of {', '.join(PAUSE_MODES)}")
        async with lock:
            try:
                sleeper.sleep(level)
            except SleepRefused as exc:
                return _error(exc.status, exc.message)
            if mode == "abort":
                aborted = engine.abort_all()
            else:
                aborted = 0
                # Arrivals meanwhile queue for the wake, as in vLLM (batcher.py).
                sim.scheduler.admitting = False
                try:
                    # A poll, not an event: the scheduler signals no "drained" moment,
                    # and a sleep in "wait" mode is rare and short.
                    while mode == "wait" and sim.scheduler.num_running:  # noqa: ASYNC110
                        await asyncio.sleep(_WAIT_POLL_S)
                finally:
                    sim.scheduler.admitting = True
            engine.pause()
            if level >= 1:
                sim.kv.reset_prefix_cache()
                # The weights copied out (level 1) or freed (2): the answer waits for it.
                await asyncio.sleep(sleeper.settings.sleep_s / sleeper.speed)
        log.info(kv("asleep", level=level, mode=mode, aborted=aborted))
        return _json({"status": "sleeping", "level": level})

    async def wake_up(request: web.Request) -> web.StreamResponse:
        tags = request.query.getall("tags", []) or None
        async with lock:
            try:
                fully_awake, cost_s = sleeper.wake(tags)
            except SleepRefused as exc:
                return _error(exc.status, exc.message)
            await asyncio.sleep(cost_s)
            if fully_awake and engine.paused:
                cold = sleeper.settings.cold_factor if cost_s > 0 else 1.0
                engine.resume(cold_factor=cold)
        log.info(kv("wake", tags=",".join(tags or ["all"]), awake=fully_awake, took_s=cost_s))
        return _json({"status": "awake" if fully_awake else "sleeping", "tags": tags})

    async def is_sleeping(_request: web.Request) -> web.StreamResponse:
        return _json({"is_sleeping": sleeper.sleeping})

    app.router.add_post("/sleep", sleep)
    app.router.add_post("/wake_up", wake_up)
    app.router.add_get("/is_sleeping", is_sleeping)
