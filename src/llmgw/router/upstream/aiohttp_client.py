"""The aiohttp client: the reference `Forwarder`, and the session used off the request path.

The scrape loop and the controller client always use this session (`get`,
`post_json` live only here); the proxy uses it when `upstream_client: aiohttp`.

One `ClientSession` with one tuned connector for the whole process: a session
per request would pay a TCP handshake per request and defeat keep-alive, which
is most of what a proxy can save. aiohttp's exceptions leave this module only
as the router's own (`base.translate`).

TCP_NODELAY: aiohttp's BaseProtocol sets it on every connection it makes, on
the client side here and on the server side of the router's own listener,
which is what keeps Nagle plus delayed ACKs from holding a small SSE event for
up to 40 ms on a reused connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp
from multidict import CIMultiDictProxy

from llmgw.router.upstream.base import JSON, KEEPALIVE_S, Forwarder, ReplyHead, translate

# What aiohttp (and asyncio under it) raise; caught here, translated in `base`.
_ERRORS = (TimeoutError, aiohttp.ClientError)


class UpstreamResponse(ReplyHead):
    """An engine's answer whose headers have arrived; the body is read through here."""

    __slots__ = ("_headers", "_idle_s", "_resp")

    def __init__(
        self, resp: aiohttp.ClientResponse, endpoint_id: str, idle_s: float | None = None
    ) -> None:
        self._resp = resp
        self._idle_s = idle_s
        self._content_type = None
        self.endpoint_id = endpoint_id
        self.status = resp.status
        self._headers: CIMultiDictProxy[str] = resp.headers

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._headers

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool."""
        try:
            return await self._resp.read()
        except _ERRORS as exc:
            raise translate(exc, self.endpoint_id, started=True, timeout="body timed out") from exc

    async def chunk(self) -> bytes:
        """Whatever bytes have arrived (waiting for at least one); b"" at the end."""
        content = self._resp.content
        idle_s = self._idle_s
        try:
            if idle_s is None:
                return await content.readany()
            # A timer per read: this client is the reference, not the fast path.
            async with asyncio.timeout(idle_s) as idle:
                return await content.readany()
        except _ERRORS as exc:
            quiet = idle_s is not None and idle.expired()
            timeout = f"no data for {idle_s:g}s" if quiet else "stream timed out"
            raise translate(exc, self.endpoint_id, started=True, timeout=timeout) from exc

    def close(self) -> None:
        """Drop the connection: an engine reading a dropped socket aborts the request."""
        self._resp.close()

    def release(self) -> None:
        """Return a fully read connection to the pool."""
        self._resp.release()


class Upstream(Forwarder):
    """The process's shared client session. `start()` inside the event loop, `close()` at exit."""

    def __init__(self, *, connect_timeout_s: float = 3.0, max_connections: int = 0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            # 0 = no cap: the pool must never become a hidden queue in front of the
            # engines (aiohttp's default is 100 connections in total).
            limit=self._max_connections,
            limit_per_host=0,
            keepalive_timeout=KEEPALIVE_S,
            ttl_dns_cache=300,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            # Bytes are relayed as the engine sent them; never re-encoded.
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Upstream.start() was not called")
        return self._session

    async def _send(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout_s: float,
        endpoint_id: str,
        idle_timeout_s: float | None,
    ) -> UpstreamResponse:
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self.connect_timeout_s)
        try:
            resp = await self.session.post(url, data=body, headers=headers, timeout=timeout)
        except _ERRORS as exc:
            raise translate(exc, endpoint_id, started=False, timeout="no response in time") from exc
        return UpstreamResponse(resp, endpoint_id, idle_timeout_s)

    async def get(
        self,
        url: str,
        *,
        timeout_s: float,
        endpoint_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """A small GET read whole (metrics, controller), errors translated like `post`."""
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self.connect_timeout_s)
        try:
            async with self.session.get(url, headers=headers, timeout=timeout) as resp:
                return resp.status, await resp.read()
        except _ERRORS as exc:
            raise translate(exc, endpoint_id, started=False, timeout="timed out") from exc

    async def post_json(
        self,
        url: str,
        body: bytes,
        *,
        timeout_s: float,
        endpoint_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """A small POST read whole (usage reports), errors translated like `post`."""
        hdrs = {"Content-Type": JSON, **(headers or {})}
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self.connect_timeout_s)
        try:
            async with self.session.post(url, data=body, headers=hdrs, timeout=timeout) as resp:
                return resp.status, await resp.read()
        except _ERRORS as exc:
            raise translate(exc, endpoint_id, started=False, timeout="timed out") from exc
