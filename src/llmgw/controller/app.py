"""The controller's aiohttp application, built apart from its runner (runtime.serve).

`build_app(config)` opens the store and the leadership lock, wires Fleet,
IdleTracker, Services and the control loop, and registers the routes. On
startup it runs the first leadership check before the ready line is printed,
so the first request already sees the stored fleet; the loop then runs as one
task that cleanup cancels and awaits (no orphan task), after which the lock is
released and the store closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from llmgw.controller.api import keys, logs, routes
from llmgw.controller.api import usage as usage_routes
from llmgw.controller.api.services import Services
from llmgw.controller.api.status import ControllerMetrics, StatusFiles
from llmgw.controller.config import ControllerConfig
from llmgw.controller.errors import NotLeading, StoreUnavailable
from llmgw.controller.fleet.live import Fleet
from llmgw.controller.fleet.spans import ActionSpans
from llmgw.controller.idle import IdleTracker
from llmgw.controller.store import FencedStore, Leadership, Store, open_leadership, open_store
from llmgw.controller.tick.loop import ControlLoop
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

LOOP = web.AppKey("control_loop", ControlLoop)


async def open_backends(config: ControllerConfig) -> tuple[Store, Leadership]:
    """Open the store (creating and migrating it) and its leadership lock; both block.

    Raises StoreError, UnreadableRow among them: the store is read once here, so a row
    this llmgw cannot read stops the start with its one-line message before anything
    serves, whether this controller is to lead or stand by (store/readrows.py).
    """
    store = await asyncio.to_thread(open_store, config.database, schema=config.schema)
    try:
        await asyncio.to_thread(store.load)
    except BaseException:
        await asyncio.to_thread(store.close)
        raise
    leadership = open_leadership(config.database, schema=config.schema)
    return store, leadership


def build_app(
    config: ControllerConfig,
    store: Store,
    leadership: Leadership,
    *,
    clock: Clock = SYSTEM_CLOCK,
    spans: ActionSpans | None = None,
) -> web.Application:
    """The controller for `config`; `spans` (tracing on) gets each committed action and
    is shut down, its last spans sent, when the app stops."""
    # Every write re-checks leadership first: a leader whose lock went away
    # between two ticks cannot write over its successor.
    fleet = Fleet(FencedStore(store, leadership), clock=clock, config=config)
    fleet.spans = spans
    usage = IdleTracker(clock=clock)
    services = Services(fleet, usage, config=config, clock=clock)
    loop = ControlLoop(fleet, leadership, usage, clock=clock, config=config, link=services.link)

    app = web.Application(middlewares=routes.middlewares(), client_max_size=16 * 1024 * 1024)
    app[routes.SERVICES] = services
    app[routes.METRICS] = ControllerMetrics(services)
    app[routes.STATUS_FILES] = StatusFiles()
    app[LOOP] = loop
    app.add_routes(routes.routes())
    app.add_routes(keys.routes())
    app.add_routes(logs.routes())
    app.add_routes(usage_routes.routes())

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await loop.check_leadership()
        task = asyncio.create_task(loop.run(), name="controller-loop")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            # A tick cancelled mid-write left its write running (Fleet.commit).
            await fleet.writes_settled()
            try:
                await loop.flush_heartbeats()
            except (StoreUnavailable, NotLeading) as exc:
                log.warning("heartbeat flush on stop failed: %s", exc.message)
            await services.link.close()
            await asyncio.to_thread(leadership.release)
            await asyncio.to_thread(store.close)
            if spans is not None:
                # Spans still batched are sent before the process ends.
                await asyncio.to_thread(spans.shutdown)

    async def wake_long_polls(app: web.Application) -> None:
        # Held long-polls would otherwise keep shutdown waiting up to a minute.
        fleet.sink.release_waiters()

    app.cleanup_ctx.append(lifecycle)
    app.on_shutdown.append(wake_long_polls)
    return app
