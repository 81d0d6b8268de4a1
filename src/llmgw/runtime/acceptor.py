"""Accept every waiting connection each time the listening socket is readable.

`loop.create_server(sock=...)` under uvloop accepts one connection per turn of the
event loop, and a busy server's turn is long: a router saturated by 200 clients
turned its loop every 10–40 ms, so 56 clients that connected together waited up to
1.2 s for their first request to be read, while the ones already connected were
served in 60 ms (bench/router_overhead.py --chat, c=256: p99 1.3–1.6 s against a
p50 of 60–90 ms). The Rust routers accept on a task of their own and showed
2× there. Here the socket's readiness accepts everything waiting, up to `BATCH`
at a time, and hands each connection to the loop (`connect_accepted_socket`),
under uvloop and the default loop alike.

Out of descriptors (EMFILE, ENFILE) or kernel memory, accepting pauses for
`PAUSE_S` and the connections wait in the kernel's queue, instead of the loop
spinning on a socket that stays readable; the servers' own connection cap
(httpserver.connection_cap) keeps a reserve so that this is rare.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable

from llmgw.runtime.logs import kv

log = logging.getLogger(__name__)

BATCH = 1024  # connections accepted per readiness at most: then other work runs
PAUSE_S = 0.1
_SCARCE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Acceptor:
    """Serves `sock` with `factory`'s protocols until `close()`, which closes `sock`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], asyncio.BaseProtocol],
        *,
        name: str = "llmgw",
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._factory = factory
        self._name = name
        self._fd = sock.fileno()
        self._timer: asyncio.TimerHandle | None = None
        self._attaching: set[asyncio.Task[None]] = set()
        self._closed = False
        sock.setblocking(False)

    def start(self) -> None:
        self._timer = None
        if not self._closed:
            self._loop.add_reader(self._fd, self._ready)

    def close(self) -> None:
        """Stop accepting and close the listening socket (new connections are refused)."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._loop.remove_reader(self._fd)
        self._sock.close()

    def _ready(self) -> None:
        for _ in range(BATCH):
            try:
                conn, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _SCARCE:
                    self._pause(exc)
                    return
                continue  # that one connection failed (ECONNABORTED, …): the next
            conn.setblocking(False)
            task = self._loop.create_task(self._attach(conn))
            self._attaching.add(task)
            task.add_done_callback(self._attaching.discard)

    async def _attach(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError:
            conn.close()  # gone before its transport was made: nothing to serve

    def _pause(self, exc: OSError) -> None:
        log.warning(
            kv(
                "not accepting",
                server=self._name,
                why=exc.strerror or str(exc),
                retry_in_s=PAUSE_S,
            )
        )
        self._loop.remove_reader(self._fd)
        self._timer = self._loop.call_later(PAUSE_S, self.start)
