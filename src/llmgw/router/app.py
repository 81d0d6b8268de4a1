"""The router program: its live state, its route table, its background loops.

`build_app(cfg, config_path=...)` builds a `RouterApp`; `main.py` serves it with
the one shared runner (`runtime.serve`, as a `Service`): its connections on the
router's own server (router/http/) answering through the route table
(http/routes.py). `start()` starts the clients and the background loops (scrape,
usage report, config watcher, controller long-poll); `stop()` cancels and awaits
them and closes the clients: no orphan tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from llmgw.router import compiled
from llmgw.router.apis import catalog
from llmgw.router.apis.passthrough import PassThrough
from llmgw.router.config import RouterConfig
from llmgw.router.control.reloadstatus import ReloadMetrics
from llmgw.router.control.sources import ConfigWatcher, ControllerClient, ControllerSource
from llmgw.router.control.usagereports import UsageReporter
from llmgw.router.http.routes import FastRoutes
from llmgw.router.http.server import FastServer
from llmgw.router.replicas.scrape import HttpMetricsFetcher, Scraper
from llmgw.router.request.proxy import Proxy
from llmgw.router.request.tracing import Tracing
from llmgw.router.routing.kvfollow import KVEventFollower
from llmgw.router.wiring import Router
from llmgw.router.workers.worker import WorkerLink
from llmgw.runtime.httpserver import Edge
from llmgw.runtime.logs import kv

log = logging.getLogger(__name__)

Loop = Coroutine[Any, Any, None]


class RouterApp:
    """One router process's live parts, started and stopped once (`runtime.serve.Service`).

    `state` is everything a request or a loop touches (wiring.py); `routes` the
    server's dispatch; `loops` the background coroutines `start` runs as tasks;
    `watcher` the config file's (SIGHUP reloads it), `reporter` the usage
    reporter, which `stop` asks for one last report; both None in a worker,
    whose supervisor does that work for all the workers.
    """

    def __init__(
        self,
        state: Router,
        routes: FastRoutes,
        loops: list[Loop],
        *,
        watcher: ConfigWatcher | None = None,
        reporter: UsageReporter | None = None,
    ) -> None:
        self.state = state
        self.routes = routes
        self._loops = loops
        self._watcher = watcher
        self._reporter = reporter
        self._tasks: list[asyncio.Task[None]] = []

    def connections(self, edge: Edge) -> FastServer:
        """The router's own server for the listening socket, answering through `routes`."""
        return FastServer(
            edge,
            self.routes,
            max_body_bytes=self.state.cfg.max_body_bytes,
            errors=catalog.EDGE_ERRORS,
            upload_paths=catalog.UPLOAD_PATHS,
            max_upload_bytes=self.state.cfg.upload_limit(),
        )

    async def start(self) -> None:
        await self.state.start_clients()
        self._tasks = [asyncio.create_task(c) for c in self._loops]
        self._loops = []
        for t in self._tasks:
            t.add_done_callback(_log_crash)
        if self._watcher is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                asyncio.get_running_loop().add_signal_handler(
                    signal.SIGHUP, self._watcher.request_reload
                )

    async def stop(self) -> None:
        state = self.state
        if self._watcher is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._reporter is not None:
            # The requests answered since the last report: their token usage would
            # be lost with the process. The controller may be away; wait little.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reporter.tick(), timeout=2.0)
        await state.close_clients()
        if state.tracing is not None:
            # Spans still batched are sent before the process ends.
            await asyncio.to_thread(state.tracing.shutdown)


def build_app(
    cfg: RouterConfig,
    *,
    config_path: str | Path | None = None,
    link: WorkerLink | None = None,
    host: str | None = None,
) -> RouterApp:
    """The router for `cfg`; with `config_path`, the file is watched for reloads.

    With `link` it is one worker of several (worker.py): the supervisor at the
    other end scrapes, reloads, follows the controller and reports usage for the
    host, and answers /metrics, /admin/usage and /admin/config for all the workers
    together.
    `host`: the listen address, a name the admin routes answer without a token.
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
        state.metrics.span_losses = state.tracing.losses
    proxy = Proxy(state)
    # Every worker follows the engines' KV events itself: each keeps its own
    # prefix index, so each needs the exact block sets (docs/routing.md).
    follow = KVEventFollower(state.kv_events).run()
    if link is not None:
        routes = FastRoutes(proxy, PassThrough(proxy), link=link, host=host)
        return RouterApp(state, routes, [link.run(), follow])
    loops, watcher, reporter = _host_loops(state, cfg, config_path)
    routes = FastRoutes(proxy, PassThrough(proxy), watcher=watcher, host=host)
    return RouterApp(state, routes, [*loops, follow], watcher=watcher, reporter=reporter)


def _host_loops(
    state: Router, cfg: RouterConfig, config_path: str | Path | None
) -> tuple[list[Loop], ConfigWatcher | None, UsageReporter]:
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
        on_stats=lambda eid, _stats: state.observed(eid),
    )
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
    state.want_lease = reporter.wake

    def on_config(new: RouterConfig) -> None:
        scraper.interval_s = new.scrape_interval_s
        scraper.timeout_s = new.scrape_timeout_s
        scraper.concurrency = new.scrape_concurrency
        reporter.interval_s = new.report_interval_s

    state.on_config.append(on_config)

    loops: list[Loop] = [scraper.run(), reporter.run()]
    watcher = None
    if config_path is not None:
        watcher = ConfigWatcher(
            config_path,
            on_config=state.apply_config,
            poll_s=cfg.reload_poll_s,
            running=cfg,
            clock=state.clock,
        )
        state.metrics.registry.register(ReloadMetrics(lambda: watcher.status))
        loops.append(watcher.run())
    if controller is not None:
        loops.append(ControllerSource(controller, on_list=state.apply_list).run())
    return loops, watcher, reporter


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error(kv("background loop crashed", task=task.get_name()), exc_info=task.exception())
