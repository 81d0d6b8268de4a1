"""The proxy's hot-path HTTP/1.1 client: keep-alive pools on asyncio protocols.

aiohttp's client builds a ClientRequest, a ClientResponse, a timer context, a
connection wrapper and a stream reader for every request; on one core that
machinery was a large share of the router's CPU (bench/RESULTS.md,
router_overhead.py). This client keeps per request only what the exchange needs:
the request head as one bytes object (the request line and Host prebuilt per URL,
`_Target`), a `FastResponse` and one future per wait; the deadlines of every
exchange in flight share one timer (`Watch`). The connection, its parser and the
exchange it carries are fastconn.py's; here: targets, pools, connecting, and the
one retry.

A pooled connection that dies before a single response byte came back was stale
(the engine closed it as we wrote): the request is sent once more on a fresh
connection. Only then: a fresh connection that fails is the engine's failure,
and the proxy decides about other replicas.

A host that goes silent (a firewall DROP, a dead switch port, a powered-off
machine) sends no reset: without more, a request written on a pooled connection
would wait for `stream_idle_timeout_s` or the request's whole deadline, minutes
by default, though another replica could answer. So each connection asks the
kernel to give up on it (`tune`): bytes sent but not acknowledged within the
connect timeout, or keepalive probes unanswered as long, end it. Only the peer's
kernel has to answer, never the engine, so a long generation is not cut. A
pooled connection ended so is not the stale kind: the proxy moves on at once.
That bound is never below `SILENT_FLOOR_S`, whatever the connect timeout: a lost
segment is sent again only after Linux's retransmission timeout (200 ms at
least, doubling), so a bound of a few hundred milliseconds ended healthy
connections on the first lost packet, where TCP would have recovered.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit

from llmgw.router.errors import UpstreamConnectError
from llmgw.router.upstream.base import (
    KEEPALIVE_S,
    Forwarder,
    HeaderLines,
    header_lines,
    translate,
)
from llmgw.router.upstream.fastconn import Conn, FastResponse, Headers, Pool, Watch

__all__ = ["FastResponse", "FastUpstream", "Headers"]

log: Final = logging.getLogger(__name__)

# URL → target cache bound; endpoints come and go with the controller's list.
MAX_TARGETS: Final = 4096
SWEEP_S: Final = 1.0
# A connection with nothing in flight for this long is probed (TCP keepalive), so a
# silent host is noticed during a long generation too, not only when we next write.
PROBE_IDLE_S: Final = 5
# The least time a peer may leave bytes or probes unacknowledged (TCP_USER_TIMEOUT):
# room for three retransmissions at Linux's least timeout (0.2 + 0.4 + 0.8 s), so a
# loss burst of about a second and a half costs a delay, not the connection.
SILENT_FLOOR_S: Final = 2.0


def tune(sock: socket.socket | None, *, silent_s: float) -> None:
    """The kernel ends the connection once its peer has been silent `silent_s`
    (never less than `SILENT_FLOOR_S`).

    TCP_USER_TIMEOUT bounds how long sent data (a request, a keepalive probe) may
    stay unacknowledged; without it Linux retransmits for about fifteen minutes.
    """
    if sock is None or not hasattr(socket, "TCP_USER_TIMEOUT"):
        return  # not Linux: the request's deadlines are the only bound
    user_timeout_ms = round(max(silent_s, SILENT_FLOOR_S) * 1000)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, user_timeout_ms)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, PROBE_IDLE_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)


class _Target:
    """One upstream URL: where to connect and the request line, prebuilt."""

    __slots__ = ("head", "host", "pool", "port", "tls")

    def __init__(self, head: bytes, host: str, port: int, tls: bool, pool: Pool) -> None:
        self.head = head
        self.host = host
        self.port = port
        self.tls = tls
        self.pool = pool


class FastUpstream(Forwarder):
    """The proxy's default `Forwarder`: `start()` in the loop, `close()` at exit.

    No cap on connections, like the aiohttp side: the pool must never become a
    hidden queue in front of the engines.
    """

    def __init__(self, *, connect_timeout_s: float = 3.0, keepalive_s: float = KEEPALIVE_S) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self._pools: dict[tuple[str, str, int], Pool] = {}
        self._targets: dict[str, _Target] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: Watch | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._tls: ssl.SSLContext | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._watch = Watch(self._loop)
        self._sweeper = asyncio.create_task(self.run(), name="upstream-sweep")

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None
        if self._watch is not None:
            self._watch.close()
        for pool in self._pools.values():
            for conn in pool.idle:
                conn.transport.close()
            pool.idle.clear()

    def tick(self, now: float) -> int:
        """Close connections idle too long (the engine would soon); how many were closed."""
        return sum(pool.expire(now) for pool in self._pools.values())

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_S)
            self.tick(loop.time())

    def idle_connections(self) -> int:
        """Pooled connections waiting for a request (tests and debugging)."""
        return sum(len(pool.idle) for pool in self._pools.values())

    async def _send(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout_s: float,
        endpoint_id: str,
        idle_timeout_s: float | None,
    ) -> FastResponse:
        loop = self._loop
        if loop is None:
            raise RuntimeError("FastUpstream.start() was not called")
        target = self._targets.get(url) or self._target(url)
        head = target.head + _fields(headers, len(body))
        now = loop.time()
        deadline = now + timeout_s
        conn = target.pool.take(now)
        fresh = conn is None
        while True:
            if conn is None:
                conn = await self._connect(target, endpoint_id, deadline)
            resp = FastResponse(conn, endpoint_id)
            conn.send(resp, head, body, deadline, idle_timeout_s)
            waiter = resp.head_waiter()
            if waiter is not None:
                try:
                    await waiter
                except asyncio.CancelledError:
                    # The client left before the head came: the engine must hear of it.
                    resp.close()
                    raise
            err = resp.error
            if err is None:
                return resp
            if (
                not fresh
                and not conn.got_bytes
                and not conn.peer_silent
                and isinstance(err, UpstreamConnectError)
            ):
                # A pooled connection the engine had closed as we wrote; nothing came
                # back, so nothing was answered: once more on a new connection.
                log.debug("stale pooled connection endpoint=%s: %s", endpoint_id, err.detail)
                fresh, conn = True, None
                continue
            raise err

    async def _connect(self, target: _Target, endpoint_id: str, deadline: float) -> Conn:
        loop = self._loop
        watch = self._watch
        assert loop is not None
        assert watch is not None
        limit = min(self.connect_timeout_s, deadline - loop.time())
        tls = self._tls_context() if target.tls else None
        try:
            async with asyncio.timeout(limit):
                _, conn = await loop.create_connection(
                    lambda: Conn(target.pool, loop, watch),
                    target.host,
                    target.port,
                    ssl=tls,
                    server_hostname=target.host if tls is not None else None,
                )
        except TimeoutError as exc:
            if limit < self.connect_timeout_s:
                raise translate(
                    exc, endpoint_id, started=False, timeout="no connection before the deadline"
                ) from exc
            # The connect bound, not the request's deadline: the engine is not answering.
            raise UpstreamConnectError(endpoint_id, f"connect timed out ({limit:g}s)") from exc
        except OSError as exc:
            raise translate(exc, endpoint_id, started=False, timeout="") from exc
        tune(conn.transport.get_extra_info("socket"), silent_s=self.connect_timeout_s)
        return conn

    def _target(self, url: str) -> _Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        key = (parts.scheme, parts.hostname, port)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = Pool(self.keepalive_s)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rpartition("@")[2]
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\n".encode()
        if len(self._targets) >= MAX_TARGETS:
            self._targets.clear()
        target = self._targets[url] = _Target(head, parts.hostname, port, tls, pool)
        return target

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls


def _fields(headers: Mapping[str, str], length: int) -> bytes:
    """The header lines after Host, ending the head: lines the caller wrote (and
    vouched for, `HeaderLines`) as they are, a mapping's made by `header_lines`."""
    lines = headers.lines if type(headers) is HeaderLines else header_lines(headers)
    return b"".join((lines, b"Content-Length: ", str(length).encode("ascii"), b"\r\n\r\n"))
