"""`llmgw router --workers N`, N > 1: one listening port, N worker processes.

The supervisor binds the port once and starts N workers (worker.py), each a
fresh `llmgw router` process that inherits the listening socket and serves it
with the one-process router's app; the kernel hands each new connection to
whichever worker accepts first. One socket shared, rather than one per worker
with SO_REUSEPORT: a connection waiting in the queue when a worker dies is
accepted by another worker instead of being reset with the dead one's queue,
and a port that is taken fails once, before any worker starts.

What is done once for the host, here, and sent to the workers (ipc.py):

- the configuration: loaded, validated and watched here (file change or SIGHUP),
  then sent whole to every worker, which applies it as a reload;
- the controller's endpoint list: one long-poll per host, forwarded;
- engine metrics: one scrape per endpoint per tick for the host, each result
  forwarded as it arrives;
- usage reports: every worker's report gathered and summed into one, so the
  controller sees one router and nothing twice; the workers' token counts go into
  one ledger of running totals here (tokenusage.py), which outlives any worker;
- /metrics: whichever worker is asked gets the page from here, every worker's
  figures merged (metricsmerge.py) with the host's own (scrape failures).

In-flight counts are shared in memory, not sent (shared.py). Prefix indexes are
per worker: a prefix's rendezvous home is the same function of the request in
every worker, so workers agree on where an unseen prefix goes.

A worker that exits is started again (with backoff if it keeps dying early);
the others keep serving, their connections untouched. SIGTERM or SIGINT stops
all workers gracefully and then the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from llmgw.router.config import RouterConfig, in_force
from llmgw.router.control.reloadstatus import ReloadMetrics
from llmgw.router.control.sources import ConfigWatcher, ControllerClient, ControllerSource
from llmgw.router.control.tokenusage import TokenLedger
from llmgw.router.control.usagereports import deliver, report_failures
from llmgw.router.replicas.registry import Registry, Stats
from llmgw.router.replicas.scrape import HttpMetricsFetcher, Scraper
from llmgw.router.upstream.aiohttp_client import Upstream
from llmgw.router.workers.ipc import (
    Ask,
    AskReply,
    AskWhat,
    Channel,
    ChannelClosed,
    Learned,
    Leased,
    Listed,
    Message,
    Observed,
    Ready,
    Reload,
    Setup,
    WorkerUsage,
    frame,
)
from llmgw.router.workers.metricsmerge import Merger, parse
from llmgw.router.workers.reportmerge import merge_reports
from llmgw.router.workers.shared import SharedInflight, SlotTable
from llmgw.router.workers.worker import WorkerSpec
from llmgw.runtime.clock import SYSTEM_CLOCK
from llmgw.runtime.logs import kv
from llmgw.runtime.procmetrics import register_process_metrics
from llmgw.runtime.sdnotify import Notifier
from llmgw.runtime.serve import READY_PREFIX, ListenError
from llmgw.wire.endpoints import EndpointInfo, EndpointList
from llmgw.wire.leases import LeaseAnswer
from llmgw.wire.usage import TokenUsage, UsageReport

log = logging.getLogger(__name__)

# How long the supervisor waits for every worker's answer to an ask.
ASK_TIMEOUT_S = 2.0
# How long all workers get to start serving.
START_TIMEOUT_S = 60.0
# A worker that lived less than this before exiting is restarted after a backoff.
EARLY_EXIT_S = 5.0
MAX_RESTART_DELAY_S = 10.0
# Workers' metrics are also gathered this often, so a worker that dies loses at
# most this much of its counts from the totals (metricsmerge.Merger.retire).
METRICS_GATHER_S = 5.0
# A worker that stops reading its channel (SIGSTOP, a loop that never yields) would
# have every broadcast kept for it without end; past this much it is killed, and
# started again like any worker that exits.
MAX_BACKLOG_BYTES = 64 * 1024 * 1024
WATCH_S = 0.2


class _Worker:
    """One worker process and the supervisor's end of its channel."""

    def __init__(self, index: int, proc: subprocess.Popen[bytes], channel: Channel) -> None:
        self.index = index
        self.proc = proc
        self.channel = channel
        self.ready = asyncio.Event()
        self.started = time.monotonic()
        self.task: asyncio.Task[None] | None = None


class WorkerFailed(Exception):
    """A worker could not start; the message is one line for a person."""


class WorkerMetrics:
    """The supervisor's own figures on the merged /metrics: how many workers serve,
    and how often one had to be started again (a crash, an OOM kill, a SIGKILL)."""

    def __init__(self, registry: CollectorRegistry, serving: Callable[[], int]) -> None:
        self.registry = registry
        self.restarts = Counter(
            "llmgw_router_worker_restarts",
            "Worker processes started again after they exited.",
            registry=registry,
        )
        self.workers = Gauge(
            "llmgw_router_workers", "Worker processes serving now.", registry=registry
        )
        self.workers.set_function(lambda: float(serving()))


class Supervisor:
    """Starts, feeds, restarts and stops the workers; does the host's chores once."""

    def __init__(
        self,
        cfg: RouterConfig,
        *,
        config_path: str | Path,
        workers: int,
        sock: socket.socket,
        worker_args: Sequence[str] = (),
    ) -> None:
        self.cfg = cfg
        self.config_path = str(config_path)
        self.n = workers
        self.sock = sock
        self.worker_args = list(worker_args)
        self.router_id = cfg.router_id or f"router-{os.urandom(4).hex()}"
        self.table = SharedInflight.create(workers)
        self.slot_table = SlotTable(self.table.capacity)
        self.slots: dict[str, int] = {}
        # The endpoints scraped here; the workers keep their own registries.
        self.registry = Registry(stale_after_s=cfg.stale_after_s)
        self.follows_controller = cfg.controller is not None
        self.listed: EndpointList | None = None
        # The controller's last lease answer, for a worker that starts later, and the
        # number of the report it answered; reports are numbered from 1 (keytable.py).
        self.lease: LeaseAnswer | None = None
        self.lease_report = self.reports = 0
        self.stats: dict[str, Stats] = {}
        self.upstream = Upstream(connect_timeout_s=cfg.connect_timeout_s)
        self.workers: dict[int, _Worker] = {}
        self.restarts = 0
        self.hash_seed = str(secrets.randbelow(2**32 - 1) + 1)
        self._early_exits: dict[int, int] = {}
        self._restarting: set[asyncio.Task[None]] = set()
        self.stopping = False
        # systemd notify (sdnotify.py); the real one is taken in run(), before any worker.
        self.notifier = Notifier(None)
        self.merger = Merger()
        self.ledger = TokenLedger(clock=SYSTEM_CLOCK)
        self._report_failures = report_failures(log)
        self.host_metrics = CollectorRegistry()
        self._scrape_failures = Counter(
            "llmgw_router_scrape_failures",
            "Failed metric scrapes per endpoint.",
            ["endpoint"],
            registry=self.host_metrics,
        )
        register_process_metrics(self.host_metrics)
        self.worker_metrics = WorkerMetrics(
            self.host_metrics,
            lambda: sum(1 for w in self.workers.values() if w.ready.is_set()),
        )
        self.scraper = Scraper(
            registry=self.registry,
            fetcher=HttpMetricsFetcher(self.upstream),
            interval_s=cfg.scrape_interval_s,
            timeout_s=cfg.scrape_timeout_s,
            concurrency=cfg.scrape_concurrency,
            on_failure=lambda eid: self._scrape_failures.labels(eid).inc(),
            on_stats=self._observed,
        )
        self.controller = (
            None if cfg.controller is None else ControllerClient(cfg.controller, self.upstream)
        )
        # The file is watched here alone: its reloads' figures are the host's.
        self.watcher = ConfigWatcher(
            self.config_path, on_config=self._reloaded, poll_s=cfg.reload_poll_s, running=cfg
        )
        self.host_metrics.register(ReloadMetrics(lambda: self.watcher.status))
        if not self.follows_controller:
            self._endpoints(cfg.endpoint_infos())

    # -- what the host learns, passed on -------------------------------------------

    def _endpoints(self, infos: Sequence[EndpointInfo]) -> None:
        removed = self.registry.replace(infos)
        for eid in removed:
            self.stats.pop(eid, None)
            # As a one-process router drops a removed endpoint's series (metrics.forget).
            with contextlib.suppress(KeyError):
                self._scrape_failures.remove(eid)
        self.merger.forget_endpoints(removed)
        self.slots = self.slot_table.assign(self.registry.ids())
        missing = self.slot_table.unslotted(self.registry.ids())
        if missing:
            log.warning(
                kv(
                    "endpoints counted per worker only",
                    table_full=len(missing),
                    capacity=self.table.capacity,
                )
            )

    def _observed(self, eid: str, stats: Stats) -> None:
        self.stats[eid] = stats
        self._broadcast(Observed(id=eid, stats=stats))

    def _reloaded(self, loaded: RouterConfig) -> None:
        # What is sent is what is in force: a worker started again later is set up with
        # it, and the workers log no restart-only change a second time.
        cfg = self.cfg = in_force(self.cfg, loaded)
        self.scraper.interval_s = cfg.scrape_interval_s
        self.scraper.timeout_s = cfg.scrape_timeout_s
        self.scraper.concurrency = cfg.scrape_concurrency
        self.upstream.connect_timeout_s = cfg.connect_timeout_s
        if not self.follows_controller:
            self._endpoints(cfg.endpoint_infos())
        self._broadcast(Reload(cfg=cfg, slots=self.slots))

    def _listed(self, lst: EndpointList) -> None:
        self.listed = lst
        self._endpoints(lst.endpoints)
        self._broadcast(Listed(listed=lst, slots=self.slots))

    def _broadcast(self, msg: Message) -> None:
        for w in self.workers.values():
            w.channel.send(msg)
            if w.channel.backlog() > MAX_BACKLOG_BYTES and w.proc.poll() is None:
                log.error(
                    kv(
                        "worker not reading from the supervisor, killing",
                        worker=w.index,
                        pid=w.proc.pid,
                        backlog=w.channel.backlog(),
                    )
                )
                w.proc.kill()

    # -- workers -----------------------------------------------------------------

    async def _spawn(self, index: int) -> _Worker:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.table.clear_row(index)
        spec = WorkerSpec(index, self.sock.fileno(), child.fileno(), self.table.fd)
        argv = [
            sys.executable,
            "-m",
            "llmgw",
            "router",
            "--config",
            self.config_path,
            "--worker",
            spec.arg(),
            *self.worker_args,
        ]
        try:
            # A fork and exec, milliseconds, at start and on a restart only; asyncio's
            # own subprocesses are not needed (the watch loop polls).
            fds = (spec.listen_fd, spec.channel_fd, spec.table_fd)
            # Its own process group: a terminal's Ctrl-C (or a SIGHUP to the group) goes
            # to the supervisor alone, which stops or reloads every worker itself; sent
            # to a starting worker it ended it with a KeyboardInterrupt traceback from
            # inside the interpreter's start-up. A worker whose supervisor dies (even
            # by SIGKILL to its group) sees its channel close and stops by itself.
            # One string-hash seed for all the workers (drawn per supervisor, so still
            # random per router): prefix chains hash content with Python's hash(), and
            # the chains a worker shares (Learned) must mean the same in every worker.
            env = {**os.environ, "PYTHONHASHSEED": self.hash_seed}
            proc = subprocess.Popen(  # noqa: ASYNC220
                argv, pass_fds=fds, process_group=0, env=env
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        channel = await Channel.open(parent)
        w = _Worker(index, proc, channel)
        channel.send(
            Setup(
                index=index,
                workers=self.n,
                capacity=self.table.capacity,
                router_id=self.router_id,
                # In force, not the file as it is (`in_force`): restart-only changes
                # its siblings wait on (a new `controller`: a list nobody sends) wait here too.
                cfg=self.cfg,
                listed=self.listed,
                slots=self.slots,
                stats=dict(self.stats),
                lease=self.lease,
                lease_report=self.lease_report,
            )
        )
        w.task = asyncio.create_task(self._serve(w))
        self.workers[index] = w
        log.info(kv("worker started", worker=index, pid=proc.pid))
        return w

    async def _serve(self, w: _Worker) -> None:
        with contextlib.suppress(ChannelClosed):
            await w.channel.serve(lambda msg: self._from_worker(w, msg))

    def _from_worker(self, w: _Worker, msg: Message) -> None:
        if isinstance(msg, Ready):
            w.ready.set()
        elif isinstance(msg, Learned):
            # Encoded once for all the other workers, not once per worker.
            data = frame(msg)
            for other in self.workers.values():
                if other is not w:
                    other.channel.send_frame(data)
        elif isinstance(msg, Ask):
            task = asyncio.create_task(self._answer(w, msg))
            task.add_done_callback(_log_crash)

    async def _answer(self, w: _Worker, ask: Ask) -> None:
        if ask.what == "metrics":
            body = await self.metrics_page()
        elif ask.what == "config":
            body = msgspec.json.encode(self.watcher.status)
        else:
            report, _ = await self.usage(reset=False)
            body = msgspec.json.encode(report)
        w.channel.send(AskReply(seq=ask.seq, body=body))

    async def _ask_all(self, what: AskWhat) -> dict[int, bytes]:
        live = [w for w in self.workers.values() if w.ready.is_set() and not w.channel.closed]

        async def one(w: _Worker) -> tuple[int, bytes | None]:
            try:
                body = await w.channel.ask(what, timeout_s=ASK_TIMEOUT_S, report=self.reports)
                return w.index, body
            except (ChannelClosed, TimeoutError):
                return w.index, None

        got = await asyncio.gather(*(one(w) for w in live))
        # Only workers still serving: one that died while the others were being asked
        # is retired (its counts kept by Merger.retire), and a new worker may already
        # have its index; the dead one's answer would count it twice.
        return {
            i: body
            for (i, body), w in zip(got, live, strict=True)
            if body is not None and self.workers.get(i) is w
        }

    async def metrics_page(self) -> bytes:
        """The whole router's /metrics: every worker's page merged, plus the host's."""
        for index, text in (await self._ask_all("metrics")).items():
            self.merger.update(index, text)
        return self.merger.render([parse(generate_latest(self.host_metrics).decode())])

    async def usage(self, *, reset: bool) -> tuple[UsageReport, list[TokenUsage]]:
        """The workers' usage reports as one, and their token counts since the last
        reset; `reset` starts every worker's new interval (and hands its counts over)."""
        bodies = await self._ask_all("usage" if reset else "usage_peek")
        got = [msgspec.msgpack.decode(b, type=WorkerUsage) for b in bodies.values()]
        report = merge_reports(self.router_id, time.time(), [r for r, _ in got])
        return report, [t for _, counted in got for t in counted]

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.report_interval_s)
            self.reports += 1
            report, counted = await self.usage(reset=True)
            if self.controller is None:
                continue
            try:
                _, answer = await deliver(self.controller, self.ledger, report, counted)
            except Exception as exc:  # noqa: BLE001 - the next report carries its token rows again
                self._report_failures.failed(str(exc), now=time.monotonic())
                self._broadcast(Leased(delivered=False))
            else:
                self._report_failures.worked()
                self.lease, self.lease_report = answer, self.reports
                self._broadcast(Leased(delivered=True, answer=answer, report=self.reports))

    async def _gather_metrics_loop(self) -> None:
        while True:
            await asyncio.sleep(METRICS_GATHER_S)
            await self.metrics_page()

    async def _watch_loop(self) -> None:
        """Restart workers that exit, unless the router is stopping."""
        while not self.stopping:
            await asyncio.sleep(WATCH_S)
            for w in list(self.workers.values()):
                code = w.proc.poll()
                if code is None or self.stopping:
                    continue
                # A task: one worker's backoff must not delay noticing another's exit.
                task = asyncio.create_task(self._restart(w, code))
                self._restarting.add(task)
                task.add_done_callback(self._restarting.discard)
                task.add_done_callback(_log_crash)

    async def _restart(self, w: _Worker, code: int) -> None:
        lived = time.monotonic() - w.started
        log.warning(kv("worker exited, restarting", worker=w.index, pid=w.proc.pid, code=code))
        del self.workers[w.index]
        w.channel.close()
        if w.task is not None:
            w.task.cancel()
        self.merger.retire(w.index)
        self.table.clear_row(w.index)
        early = self._early_exits.get(w.index, 0) + 1 if lived < EARLY_EXIT_S else 0
        self._early_exits[w.index] = early
        if early:
            await asyncio.sleep(min(MAX_RESTART_DELAY_S, 0.25 * 2**early))
        if self.stopping:
            return
        self.restarts += 1
        self.worker_metrics.restarts.inc()
        while not self.stopping:
            try:
                await self._spawn(w.index)
                return
            except OSError as exc:
                # Out of processes or descriptors, say: the index must not stay empty
                # (nothing else would ever start it again), so try again shortly.
                log.error(kv("worker could not be started, retrying", worker=w.index, error=exc))
                await asyncio.sleep(MAX_RESTART_DELAY_S)

    async def _start_all(self, stop: asyncio.Event) -> bool:
        """Start every worker and wait until all serve; False if `stop` is set meanwhile
        (SIGTERM or SIGINT while starting: stop now, not once the workers serve)."""
        for i in range(self.n):
            await self._spawn(i)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(w.ready.is_set() for w in self.workers.values()):
            if stop.is_set():
                return False
            for w in self.workers.values():
                if w.proc.poll() is not None:
                    raise WorkerFailed(
                        f"llmgw router: worker {w.index} exited with {w.proc.returncode} "
                        "before serving (its log is above)"
                    )
            if time.monotonic() > deadline:
                raise WorkerFailed(f"llmgw router: workers not serving after {START_TIMEOUT_S:g}s")
            await asyncio.sleep(0.05)
        return True

    async def _stop_all(self, grace_s: float) -> None:
        self.stopping = True
        for w in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s + 5.0
        while any(w.proc.poll() is None for w in self.workers.values()):
            if time.monotonic() > deadline:
                for w in self.workers.values():
                    if w.proc.poll() is None:
                        log.warning(kv("worker did not stop, killing", worker=w.index))
                        w.proc.kill()
                        w.proc.wait()
                break
            await asyncio.sleep(0.05)
        for w in self.workers.values():
            w.channel.close()
            if w.task is not None:
                w.task.cancel()

    def _serve_host(self, host: str) -> list[asyncio.Task[None]]:
        """Every worker serves: say so, and start the host's chores."""
        port = int(self.sock.getsockname()[1])
        print(f"{READY_PREFIX} router http://{host}:{port}", flush=True)
        self.notifier.ready(f"serving on {host}:{port} with {self.n} workers")
        log.info(kv("serving", name="router", host=host, port=port, workers=self.n))
        loops = [
            self.scraper.run(),
            self.watcher.run(),
            self._report_loop(),
            self._gather_metrics_loop(),
            self._watch_loop(),
            self.notifier.keep_alive(),
        ]
        if self.controller is not None:
            loops.append(ControllerSource(self.controller, on_list=self._listed).run())
        tasks = [asyncio.create_task(c) for c in loops]
        for t in tasks:
            t.add_done_callback(_log_crash)
        return tasks

    async def run(self, *, host: str, grace_s: float = 10.0) -> int:
        """Serve until SIGTERM/SIGINT; 0 after a graceful stop, 1 if workers cannot start."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self.watcher.request_reload)
        # Before any worker starts: the supervisor alone speaks to systemd.
        self.notifier = Notifier.take()
        await self.upstream.start()
        tasks: list[asyncio.Task[None]] = []
        try:
            try:
                started = await self._start_all(stop)
            except WorkerFailed as exc:
                raise ListenError(str(exc)) from exc
            if started:
                tasks = self._serve_host(host)
                await stop.wait()
            log.info(kv("stopping", name="router", workers=len(self.workers), grace_s=grace_s))
        finally:
            self.stopping = True
            self.notifier.stopping()
            # New connections are refused from here, as by a one-process router: each
            # worker closes its copy of the socket as it stops, but this one kept it
            # listening through the drain, so a client that came meanwhile was taken
            # into the queue, left waiting and reset when the drain ended.
            self.sock.close()
            tasks += self._restarting
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._stop_all(grace_s)
            await self.upstream.close()
        sys.stdout.flush()
        return 0


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error(kv("supervisor task crashed", task=task.get_name()), exc_info=task.exception())
