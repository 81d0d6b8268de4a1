"""The router's application: its live state, its route table, its background loops.

`build_app(cfg, config_path=...)` builds it; `main.py` serves it with the one
shared runner (`runtime.serve`), its connections on the router's own server
(router/http/) answering through `app[FAST]`, the route table (http/routes.py). The aiohttp
application holds the live state and runs the background loops (scrape,
usage report, config watcher, controller long-poll): they start with it and
are cancelled and awaited when it stops: no orphan tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from llmgw.router import compiled
from llmgw.router.apis.passthrough import PassThrough
from llmgw.router.config import RouterConfig
from llmgw.router.control.sources import ConfigWatcher, ControllerClient, ControllerSource
from llmgw.router.control.usagereports import UsageReporter
from llmgw.router.http.routes import FastRoutes
from llmgw.router.replicas.scrape import HttpMetricsFetcher, Scraper
from llmgw.router.request.proxy import Proxy
from llmgw.router.request.tracing import Tracing
from llmgw.router.routing.kvfollow import KVEventFollower
from llmgw.router.wiring import Router
from llmgw.router.workers.worker import WorkerLink
from llmgw.runtime.logs import kv

log = logging.getLogger(__name__)

# The route table the router's server answers through (main.py).
FAST = web.AppKey("fast", FastRoutes)
SCRAPER = web.AppKey("scraper", Scraper)
REPORTER = web.AppKey("reporter", UsageReporter)


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
    # Serves no request itself (router/http/ does): it holds the state and the loops.
    app = web.Application()
    app[FAST] = FastRoutes(proxy, passthrough, link=link)
    loops: list[Coroutine[Any, Any, None]]
    watcher: ConfigWatcher | None = None
    if link is not None:
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


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error(kv("background loop crashed", task=task.get_name()), exc_info=task.exception())
