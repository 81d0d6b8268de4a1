"""Where the router's configuration and endpoint list come from.

Two sources, one effect: the router's `apply_*` callbacks, which end in a
wholesale `Registry.replace()`; the scheduler and proxy cannot tell them apart.

- `ConfigWatcher`: the YAML file. Re-read on SIGHUP and when its mtime, size or
  inode changes; a file that fails validation is logged and the running
  configuration kept, so a typo never empties a router.
- `ControllerSource`: long-polls `GET {controller}/v1/endpoints?after=V`. When
  the controller is unreachable the last list stays in force and polling
  resumes with jittered exponential backoff: serving survives the control
  plane.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from llmgw.router.config import ControllerConfig, RouterConfig, load, restart_only_changes
from llmgw.router.control.listread import ListReader
from llmgw.router.control.reloadstatus import ReloadStatus, started
from llmgw.router.errors import (
    ControllerCallFailed,
    LeaseRefused,
    ReportRefused,
    RouterConfigError,
    UpstreamError,
)
from llmgw.router.upstream.aiohttp_client import Upstream
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.runtime.logs import kv
from llmgw.wire.endpoints import EndpointList
from llmgw.wire.leases import LeaseAnswer
from llmgw.wire.usage import UsageReport

log = logging.getLogger(__name__)

FileStamp = tuple[int, int, int]  # (mtime_ns, size, inode)
# A file seen changed is looked at again this soon (or at the next poll, if sooner)
# and read once it has not changed in between.
SETTLE_S = 0.25
# Shortest time between two polls that brought no change.
MIN_POLL_S = 1.0


class ConfigWatcher:
    """Reloads the configuration file when it changes or when asked (SIGHUP).

    `running`: the configuration the router started with, whose restart-only settings
    stay in force until it restarts (config.in_force); `status` says which of them
    the file sets otherwise (None: none are told apart)."""

    def __init__(
        self,
        path: str | Path,
        *,
        on_config: Callable[[RouterConfig], None],
        poll_s: float = 1.0,
        running: RouterConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.path = Path(path)
        self.poll_s = poll_s
        self._on_config = on_config
        self._running = running
        self._clock = clock
        # The last load's outcome, replaced whole (/admin/config, /metrics).
        self.status: ReloadStatus = started(clock.wall())
        self._stamp = self._read_stamp()
        self._wake = asyncio.Event()
        self._forced = False
        # Seen changed at the last look: read at the next if it has not changed again.
        self._settling = False
        self.reloads = 0
        self.last_error: str | None = None

    def _read_stamp(self) -> FileStamp | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def request_reload(self) -> None:
        """Reload on the next tick whether or not the file changed (the SIGHUP handler)."""
        self._forced = True
        self._wake.set()

    def tick(self) -> bool:
        """Reload if due; True when a new configuration was applied.

        A file is read only once it has held still from one look to the next: read as
        soon as it changed, it could be half written (its endpoints but not yet its
        keys), which is valid YAML and was put in force whole."""
        stamp = self._read_stamp()
        if stamp != self._stamp:
            self._stamp = stamp
            self._settling = True
            return False
        if not (self._forced or self._settling):
            return False
        self._forced = self._settling = False
        try:
            cfg = load(self.path, empty_ok=False)
        except RouterConfigError as exc:
            self.last_error = str(exc)
            self.status = self.status.refused(self._clock.wall(), self.last_error)
            log.error(kv("reload rejected, keeping the running config", error=exc))
            return False
        if self._read_stamp() != stamp:
            # Written while it was read: read again once it holds still.
            return self.tick()
        self.last_error = None
        self.reloads += 1
        # The file says how often to look at it: the next wait already takes it.
        self.poll_s = cfg.reload_poll_s
        try:
            self._on_config(cfg)
        except Exception as exc:
            # A defect of the router's, not of the file: said as a refused reload (the
            # gauge, /admin/config), and the watch goes on, for the next change.
            self.last_error = f"the router failed to apply it: {exc!r}"
            self.status = self.status.refused(self._clock.wall(), self.last_error)
            log.exception(kv("reload failed while applied", path=self.path))
            return False
        log.info(kv("config reloaded", path=self.path, endpoints=len(cfg.endpoints)))
        # Restart-only settings in force are the start's for as long as the router runs.
        pending = () if self._running is None else restart_only_changes(self._running, cfg)
        self.status = self.status.applied(self._clock.wall(), tuple(pending))
        return True

    async def run(self) -> None:
        while True:
            wait_s = min(self.poll_s, SETTLE_S) if self._settling else self.poll_s
            try:
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            self.tick()


class ControllerClient:
    """HTTP to the controller: the endpoint long-poll and the usage report."""

    def __init__(self, cfg: ControllerConfig, upstream: Upstream) -> None:
        self.cfg = cfg
        self._upstream = upstream
        self._base = cfg.url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {cfg.token}"} if cfg.token else {}
        self._lists = ListReader()

    async def endpoints(self, *, after: int | None) -> EndpointList | None:
        """The list when it is newer than `after` (None: no change before the poll ended)."""
        wait_s = self.cfg.poll_timeout_s
        url = f"{self._base}/v1/endpoints?timeout_s={wait_s:g}"
        if after is not None:
            url += f"&after={after}"
        try:
            status, body = await self._upstream.get(
                url, timeout_s=wait_s + 5.0, endpoint_id="controller", headers=self._headers
            )
        except UpstreamError as exc:
            raise ControllerCallFailed(str(exc)) from exc
        if status in (204, 304):
            return None
        if status != 200:
            raise ControllerCallFailed(f"GET /v1/endpoints answered {status}")
        try:
            return self._lists.read(body)
        except msgspec.DecodeError as exc:
            raise ControllerCallFailed(f"bad endpoint list: {exc}") from exc

    async def post_usage(self, report: UsageReport) -> LeaseAnswer | None:
        """Send a report; the shares it leases (None: the controller answered without)."""
        try:
            status, body = await self._upstream.post_json(
                f"{self._base}/v1/usage",
                msgspec.json.encode(report),
                timeout_s=5.0,
                endpoint_id="controller",
                headers=self._headers,
            )
        except UpstreamError as exc:
            raise ControllerCallFailed(str(exc)) from exc
        if 400 <= status < 500 and status not in (401, 403, 408, 429):
            # The body is wrong, not the moment: resending it would be refused forever.
            raise ReportRefused(f"POST /v1/usage answered {status}", status=status)
        if status >= 300:
            raise ControllerCallFailed(f"POST /v1/usage answered {status}")
        if status == 204 or not body:
            return None
        try:
            return msgspec.json.decode(body, type=LeaseAnswer)
        except msgspec.DecodeError as exc:
            # The rows were kept (a 2xx): only the lease is lost, and the last one holds.
            raise LeaseRefused(f"bad lease answer: {exc}") from exc


class ControllerSource:
    """Follows the controller's endpoint list; keeps the last one while it is away."""

    def __init__(
        self,
        client: ControllerClient,
        *,
        on_list: Callable[[EndpointList], None],
        backoff_s: float = 0.5,
        max_backoff_s: float = 15.0,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._on_list = on_list
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._rng = rng or random.Random()
        self.version: int | None = None
        self.failures = 0

    async def tick(self) -> bool:
        """One poll; True when a list arrived and was applied."""
        got = await self._client.endpoints(after=self.version)
        self.failures = 0
        if got is None or got.version == self.version:
            return False
        # A smaller version than ours means the controller's store was replaced:
        # its list is still the truth (wire.endpoints.EndpointList).
        self.version = got.version
        self._on_list(got)
        return True

    def next_backoff_s(self) -> float:
        """Full jitter: routers that lost the controller together do not return together."""
        cap = min(self._max_backoff_s, self._backoff_s * 2.0 ** min(self.failures, 16))
        return self._rng.uniform(self._backoff_s / 2.0, cap)

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                if not await self.tick() and time.monotonic() - started < MIN_POLL_S:
                    # A controller that answers at once without a change would
                    # otherwise be polled in a hot loop.
                    await asyncio.sleep(MIN_POLL_S)
            except ControllerCallFailed as exc:
                self.failures += 1
                if self.failures == 1:
                    log.warning(
                        kv("no endpoint list from the controller, keeping the last one", error=exc)
                    )
                await asyncio.sleep(self.next_backoff_s())
