"""The scrape loop: every endpoint's /metrics, concurrently, every tick.

Each endpoint is scraped by its own coroutine under a shared concurrency bound,
with a timeout below the interval, and its result is applied the moment it
arrives: one slow or dead endpoint costs its own timeout and never delays the
figures of the others. A failed scrape is reported to the registry, which lets
the endpoint go stale (scored down) without touching its breaker: metrics can
be down while serving is fine.

A counter that went backwards means the engine restarted with an empty KV
cache, so the prefix index's entries for it are purged (`on_restart`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from llmgw.router.errors import MetricsParseError, UpstreamError
from llmgw.router.replicas.enginemetrics import parse
from llmgw.router.replicas.registry import Registry, Stats
from llmgw.router.upstream.aiohttp_client import Upstream
from llmgw.runtime.logs import kv
from llmgw.wire.endpoints import EndpointInfo

log = logging.getLogger(__name__)

# The most of an engine's /metrics answer read (a vLLM scrape is tens of KiB, TGI's over
# a hundred): past it the scrape fails, so an engine cannot fill the router's memory.
MAX_METRICS_BYTES = 4 * 1024 * 1024


class MetricsFetcher(Protocol):
    """Fetch one endpoint's metrics text; raise UpstreamError on any failure."""

    async def fetch_metrics(self, info: EndpointInfo, *, timeout_s: float) -> bytes: ...


class ScrapeFailed(UpstreamError):
    """The metrics endpoint answered with a non-200 status."""


class Scraper:
    """Feeds `Registry.observe` / `scrape_failed` from every endpoint's /metrics."""

    def __init__(
        self,
        *,
        registry: Registry,
        fetcher: MetricsFetcher,
        interval_s: float = 2.0,
        timeout_s: float = 1.5,
        concurrency: int = 64,
        on_restart: Callable[[str], None] = lambda _id: None,
        on_failure: Callable[[str], None] = lambda _id: None,
        on_stats: Callable[[str, Stats], None] = lambda _id, _stats: None,
    ) -> None:
        self.registry = registry
        self.fetcher = fetcher
        # Public: a config reload changes them; the next tick uses the new values.
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self._on_restart = on_restart
        self._on_failure = on_failure
        # Every successful scrape, after the registry has it (a supervisor passes
        # it on to its workers: supervisor.py).
        self._on_stats = on_stats
        # Endpoint id → last failure text, so a dead endpoint logs once, not every tick.
        self._failing: dict[str, str] = {}
        self.ticks = 0

    async def tick(self) -> None:
        """Scrape every registered endpoint once; returns when all have answered or timed out."""
        sem = asyncio.Semaphore(self.concurrency)
        infos = self.registry.infos()
        await asyncio.gather(*(self._one(info, sem) for info in infos))
        self.ticks += 1

    async def _one(self, info: EndpointInfo, sem: asyncio.Semaphore) -> None:
        async with sem:
            try:
                async with asyncio.timeout(self.timeout_s):
                    text = await self.fetcher.fetch_metrics(info, timeout_s=self.timeout_s)
                stats = parse(text, info.engine)
            except (UpstreamError, TimeoutError, MetricsParseError) as exc:
                self._failed(info.id, exc)
                return
            except Exception as exc:
                # A bug in reading one engine's answer: that scrape fails, with the
                # traceback. Raised on, it ended the loop, and no endpoint was scraped
                # again for the router's life (all of them stale).
                log.exception(kv("scrape failed unexpectedly", endpoint=info.id))
                self._failed(info.id, exc)
                return
        if self._failing.pop(info.id, None) is not None:
            log.info(kv("scrape recovered", endpoint=info.id))
        if self.registry.observe(info.id, stats):
            # Counters went backwards: a fresh engine, an empty KV cache.
            log.info(kv("engine restarted", endpoint=info.id))
            self._on_restart(info.id)
        self._on_stats(info.id, stats)

    def _failed(self, endpoint_id: str, exc: BaseException) -> None:
        self.registry.scrape_failed(endpoint_id)
        self._on_failure(endpoint_id)
        text = str(exc) or type(exc).__name__
        if self._failing.get(endpoint_id) != text:
            log.warning(kv("scrape failed", endpoint=endpoint_id, error=text))
        self._failing[endpoint_id] = text

    async def run(self) -> None:
        """Tick every `interval_s`, measured from the start of each tick."""
        while True:
            started = time.monotonic()
            await self.tick()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))


class HttpMetricsFetcher:
    """The real fetcher: GET {url}/metrics through the router's shared session."""

    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream

    async def fetch_metrics(self, info: EndpointInfo, *, timeout_s: float) -> bytes:
        # vLLM leaves /metrics open; llama-server wants its key there too.
        auth = {"Authorization": f"Bearer {info.api_key}"} if info.api_key else None
        status, body = await self._upstream.get(
            info.url + "/metrics",
            timeout_s=timeout_s,
            endpoint_id=info.id,
            headers=auth,
            max_bytes=MAX_METRICS_BYTES,
        )
        if status != 200:
            raise ScrapeFailed(info.id, f"metrics answered {status}")
        return body
