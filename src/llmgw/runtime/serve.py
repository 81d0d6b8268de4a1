"""One way to run a program's server (STYLE: app built apart from its runner).

The program is an aiohttp application, or a `Service` that serves its
connections with its own server (the router's). `serve_app(app, host, port)`
binds, prints a ready line, and on SIGTERM or SIGINT stops accepting, lets
in-flight requests finish within `grace_s`, runs the app's cleanup (a
`Service`'s `stop`), and returns so the process exits 0; `run()` runs it under
uvloop. Under systemd (`Type=notify`) it also sends READY=1, STOPPING=1 and the
watchdog's pings (sdnotify.py).

A port it cannot listen on (taken, privileged, out of range) is `ListenError`:
`run()` prints its one line and returns 1, before the app has started anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from aiohttp import web

from llmgw.runtime.acceptor import Acceptor
from llmgw.runtime.httpserver import (
    Edge,
    ErrorBody,
    ServerLimits,
    openai_error,
    protocol_factory,
    raise_nofile_limit,
)
from llmgw.runtime.sdnotify import Notifier

log = logging.getLogger(__name__)

# The line a parent process waits for (testing.procs, `llmgw up`). Printed once,
# after the socket is bound, so a reader that sees it can connect at once.
READY_PREFIX = "llmgw-ready"


class Connections(Protocol):
    """A program's own server for its connections, in place of aiohttp's (the router's)."""

    def protocol(self) -> asyncio.Protocol:
        """The protocol for one new connection."""
        ...

    async def shutdown(self, grace_s: float) -> None:
        """Close idle connections; give answers in progress up to `grace_s`, then close all."""
        ...


class Service(Protocol):
    """A program that serves with its own server: the work it starts before serving
    and stops after (background loops, clients), and its connections."""

    async def start(self) -> None:
        """Start the program's work; called once, before any connection is served."""
        ...

    async def stop(self) -> None:
        """Stop it (cancel and await its loops, close its clients); called once, last."""
        ...

    def connections(self, edge: Edge) -> Connections:
        """The server for the listening socket's connections, under `edge`'s limits."""
        ...


class ListenError(Exception):
    """The program cannot listen where it was told to; the message is one line for a person."""


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; Windows lacks it
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run an async main under uvloop; its exit code, or 1 (after one line) on ListenError."""
    install_uvloop()
    try:
        return asyncio.run(main())
    except ListenError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a listening socket; port 0 picks a free one (read it back with getsockname)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(4096)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def listen(host: str, port: int, name: str) -> socket.socket:
    """bind_socket, with its failures translated into ListenError."""
    where = f"llmgw {name}: cannot listen on {host}:{port}"
    try:
        return bind_socket(host, port)
    except OverflowError as exc:  # a port above 65535
        raise ListenError(f"{where}: ports are 0-65535") from exc
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            why = "the port is in use by another process (pick another --port)"
        else:
            why = (exc.strerror or str(exc)).lower()
        raise ListenError(f"{where}: {why}") from exc


async def serve_app(
    app: web.Application | Service,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    name: str = "llmgw",
    grace_s: float = 10.0,
    on_started: Callable[[int], Awaitable[None]] | None = None,
    stop_event: asyncio.Event | None = None,
    limits: ServerLimits | None = None,
    error_body: ErrorBody = openai_error,
    sock: socket.socket | None = None,
    announce: bool = True,
) -> int:
    """Serve until SIGTERM/SIGINT (or `stop_event`), then stop gracefully; returns 0.

    Graceful means: the listening socket closes first (new connections are
    refused, so a load balancer moves on), requests already being handled get
    up to `grace_s` to finish, then the app's on_shutdown/on_cleanup run.

    Connections are served by `httpserver.EdgeHandler` under `limits`: what the
    HTTP server answers before a handler runs is `error_body`'s JSON, and
    idle, slow and surplus connections are closed (httpserver's docstring).

    `sock`: serve this listening socket (bound by a parent, shared with sibling
    processes) instead of binding one; `announce=False` leaves the ready line, and
    systemd's notifications, to that parent.

    A `Service` serves its connections with its own server, made from the `Edge`
    (the router's: router/http/), instead of aiohttp's; it is started where an
    application's startup runs, and stopped where its cleanup runs.
    """
    # The soft open-file limit up to the hard one, before the client connections are
    # capped from it (httpserver.connection_cap): systemd's default soft limit (1,024)
    # held a controller to 448 connections, fewer than a large fleet keeps open.
    raise_nofile_limit()
    stop = stop_event or asyncio.Event()
    # Taken before the app starts anything: what it spawns must not inherit the socket.
    notifier = Notifier.take() if announce else Notifier(None)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    # Bound before the app starts up: a taken port must fail before the app's
    # startup runs its loops (an agent would heartbeat, even start engines, then die).
    if sock is None:
        sock = listen(host, port, name)
    edge = Edge(limits or ServerLimits(), error_body, name=name)
    runner: web.AppRunner | None = None
    own: Connections | None = None
    try:
        if isinstance(app, web.Application):
            runner = web.AppRunner(
                app, handle_signals=False, access_log=None, shutdown_timeout=grace_s
            )
            await runner.setup()
        else:
            await app.start()
            own = app.connections(edge)
    except BaseException:
        sock.close()
        raise
    bound_port = int(sock.getsockname()[1])
    factory: Callable[[], asyncio.Protocol]
    if runner is not None:
        assert runner.server is not None  # set by setup()
        factory = protocol_factory(runner.server, edge)
    else:
        assert own is not None
        factory = own.protocol
    # Not loop.create_server: under uvloop it accepts one connection per loop turn,
    # and clients arriving at a busy server waited seconds (acceptor.py).
    listener = Acceptor(loop, sock, factory, name=name)
    listener.start()
    if on_started is not None:
        await on_started(bound_port)
    if announce:
        print(f"{READY_PREFIX} {name} http://{host}:{bound_port}", flush=True)
        notifier.ready(f"serving on {host}:{bound_port}")
    watchdog = asyncio.create_task(notifier.keep_alive(), name="sd-watchdog")
    log.info(
        "serving name=%s host=%s port=%d max_connections=%d server=%s",
        name,
        host,
        bound_port,
        edge.max_connections,
        "aiohttp" if own is None else "own",
    )
    try:
        await stop.wait()
    finally:
        log.info("stopping name=%s grace_s=%s", name, grace_s)
        notifier.stopping()
        watchdog.cancel()
        # Its own cancellation comes back as a result; one of this coroutine still raises.
        await asyncio.gather(watchdog, return_exceptions=True)
        # No new connections first; then the idle ones close, handlers in flight get
        # up to `grace_s` (runner.cleanup(): shutdown_timeout), and the app's
        # cleanup runs (a Service's `stop`).
        listener.close()
        if runner is not None:
            await runner.cleanup()
        else:
            assert own is not None
            assert not isinstance(app, web.Application)
            await own.shutdown(grace_s)
            await app.stop()
    sys.stdout.flush()
    return 0
