"""`llmgw router --config FILE [--port P] [--host H] [--workers N]`: the data plane."""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
from typing import TYPE_CHECKING

from llmgw.router import compiled
from llmgw.router.config import OTHER_ENV, RouterConfig, check_retired_env, load
from llmgw.router.errors import RouterConfigError
from llmgw.runtime import envflags, logs
from llmgw.runtime.cli import DefaultsFormatter
from llmgw.runtime.version import add_version_argument

if TYPE_CHECKING:
    from llmgw.runtime.httpserver import ServerLimits

DEFAULT_PORT = 8080


# Each worker is one event loop on one core: past a few per core they only take turns
# on the same CPUs. A typo (--workers 1000000) forked workers until the host ran out
# of memory, and a larger one failed with a traceback sizing the shared table.
MAX_WORKERS_PER_CORE = 4

# Young-generation threshold of the collector while serving (CPython's default: 700).
GC_GEN0 = 10_000


def settle_gc() -> None:
    """Before serving: everything alive now (modules, the app) lives as long as the
    process, so it goes out of the collector's sight (full collections stay short on
    the request path); and the young generation is collected after 10,000 net new
    objects instead of 700. The requests in flight keep their coroutines, futures and
    buffers alive: at c=64, 700 was reached every ~30 requests, and each young
    collection traversed them all (~5 us of CPU per request in all); at 10,000 it ran
    once every ~500 requests (docs/router.md, Cost per request)."""
    gc.collect()
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0, gen1, gen2)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw router", description=__doc__, formatter_class=DefaultsFormatter
    )
    p.add_argument("--config", required=True, help="YAML configuration file (reloaded on change)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="listen port; 0 picks one")
    p.add_argument("--host", default="127.0.0.1", help="listen address")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes serving the one port (default: the cores this process may use); "
        "1: a single process, no supervisor; at most 4 per core. With more, a supervisor "
        "scrapes, reloads and follows the controller once for all of them (docs/router.md, "
        "Workers)",
    )
    # Internal: how the supervisor starts a worker (router/workers/worker.py).
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--log-level", default=None, help="DEBUG shows every routing decision")
    logs.add_format_argument(p)
    add_version_argument(p, "router")
    return p


def _limits(cfg: RouterConfig) -> ServerLimits:
    from llmgw.runtime.httpserver import ServerLimits

    return ServerLimits(
        idle_timeout_s=cfg.idle_timeout_s,
        header_timeout_s=cfg.header_timeout_s,
        max_connections=cfg.max_client_connections,
        client_share=cfg.client_share,
        # OpenAI's API takes plain JSON; a small gzip body can inflate to gigabytes.
        decompress=False,
    )


def main(argv: list[str]) -> int:
    known = (*OTHER_ENV, compiled.ENV)
    args = envflags.parse(build_parser(), argv, "router", known=known)
    try:
        given = [] if args.log_format is None else [logs.FLAG, args.log_format]
        fmt, _ = logs.take_format(given)
    except logs.LogFormatError as exc:
        sys.stderr.write(f"llmgw router: {exc}\n")
        return 2
    logs.setup(args.log_level, fmt)
    try:
        # Before any hot module is imported: from here on they are the build's.
        compiled.load()
    except compiled.CompiledBuildError as exc:
        sys.stderr.write(f"llmgw router: {exc}\n")
        return 2
    from llmgw.runtime import serve

    if args.worker is not None:
        return _worker(args)
    workers = default_workers() if args.workers is None else args.workers
    if workers < 1:
        sys.stderr.write(f"llmgw router: --workers {workers}: at least 1\n")
        return 2
    cores = default_workers()
    if workers > MAX_WORKERS_PER_CORE * cores:
        sys.stderr.write(
            f"llmgw router: --workers {workers}: at most {MAX_WORKERS_PER_CORE * cores} "
            f"({MAX_WORKERS_PER_CORE} per core, {cores} cores)\n"
        )
        return 2
    try:
        cfg = load(args.config)
        # $LLMGW_ROUTER_SERVER=aiohttp or $LLMGW_ROUTER_UPSTREAM=aiohttp stops us here.
        check_retired_env(os.environ)
    except RouterConfigError as exc:
        sys.stderr.write(f"llmgw router: {exc}\n")
        return 2
    if cfg.tracing is not None:
        # Here, not in each worker: one line and exit 2, not a traceback per worker.
        from llmgw.runtime.tracing import TracingUnavailable, require_sdk

        try:
            require_sdk()
        except TracingUnavailable as exc:
            sys.stderr.write(f"llmgw router: {exc}\n")
            return 2

    async def run() -> int:
        # Imported here so `--help` and config errors stay fast.
        from llmgw.router.app import build_app
        from llmgw.runtime.httpserver import raise_nofile_limit

        # Idle client connections must never starve engine connections of descriptors:
        # the soft limit goes to the hard one, and serve_app caps client connections
        # at half of it (runtime.httpserver.connection_cap).
        raise_nofile_limit()
        app = build_app(cfg, config_path=args.config, host=args.host)
        settle_gc()
        return await serve.serve_app(
            app,
            host=args.host,
            port=args.port,
            name="router",
            limits=_limits(cfg),
        )

    if workers > 1:
        return _supervise(args, cfg, workers)
    return serve.run(run)


def default_workers() -> int:
    """The cores this process may run on (its affinity mask, a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _log_args(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    if args.log_level is not None:
        out += ["--log-level", args.log_level]
    if args.log_format is not None:
        out += ["--log-format", args.log_format]
    return out


def _supervise(args: argparse.Namespace, cfg: RouterConfig, workers: int) -> int:
    """Bind the port here, then run the workers on it (supervisor.py)."""

    from llmgw.runtime import serve

    async def run() -> int:
        from llmgw.router.workers.pool import Supervisor

        sock = serve.listen(args.host, args.port, "router")
        sup = Supervisor(
            cfg,
            config_path=args.config,
            workers=workers,
            sock=sock,
            worker_args=_log_args(args),
        )
        return await sup.run(host=args.host)

    return serve.run(run)


def _worker(args: argparse.Namespace) -> int:
    """One worker of a supervisor: its configuration comes from the supervisor, not the file."""
    # Workers run in their own process group (supervisor.py), so a terminal's signals
    # reach the supervisor only; one sent to a worker by hand must not end it while it
    # starts (the supervisor reloads and stops the workers itself; once serving, SIGINT
    # and SIGTERM stop a worker gracefully: serve.py).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from llmgw.router.workers.worker import WorkerSpec

    try:
        spec = WorkerSpec.parse(args.worker)
    except RouterConfigError as exc:
        sys.stderr.write(f"llmgw router: {exc}\n")
        return 2

    from llmgw.runtime import serve
    from llmgw.runtime.httpserver import raise_nofile_limit

    async def run() -> int:
        from llmgw.router.app import build_app
        from llmgw.router.workers.worker import connect

        raise_nofile_limit()
        link, sock = await connect(spec)
        cfg = link.setup.cfg
        app = build_app(cfg, link=link, host=args.host)
        settle_gc()

        async def started(_port: int) -> None:
            link.ready()

        return await serve.serve_app(
            app,
            host=args.host,
            name="router",
            limits=_limits(cfg),
            sock=sock,
            announce=False,
            on_started=started,
            stop_event=link.lost,
        )

    return serve.run(run)
