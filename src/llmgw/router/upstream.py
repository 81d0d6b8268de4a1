"""How the router talks to engines: the seam, and its aiohttp side (DESIGN §2.7).

Two clients sit behind one seam (`Forwarder`, answering `UpstreamReply`): this
module's aiohttp session, and `fastupstream.FastUpstream`, the lean HTTP/1.1
pool the proxy's hot path uses by default (config `upstream_client`). The
scrape loop and the controller client always use this module's session: they
are not on a request's path, and `get`/`post_json` live only here.

One `ClientSession` with one tuned connector for the whole process: a session
per request would pay a TCP handshake per request and defeat keep-alive, which
is most of what a proxy can save. aiohttp's exceptions are translated here,
once, into the router's tree (`errors`); nothing above this module sees them.

TCP_NODELAY: aiohttp's BaseProtocol sets it on every connection it makes, on
the client side here and on the server side of the router's own listener,
which is what keeps Nagle plus delayed ACKs from holding a small SSE event for
up to 40 ms on a reused connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

import aiohttp
from multidict import CIMultiDictProxy

from llmgw.router.errors import UpstreamBroken, UpstreamConnectError, UpstreamTimeout

# Below uvicorn's default keep-alive (5 s, what vLLM runs): a pooled connection the
# engine is about to close is dropped by us first instead of failing a request.
KEEPALIVE_S = 4.0


class UpstreamReply(Protocol):
    """An engine's answer whose head has arrived; the body is read through it.

    Release semantics, the same for every client: a body read to its end gives
    the connection back to the pool by itself; `close()` on a reply that is not
    finished drops the connection (which is how an engine learns to abort), and
    is a no-op on a finished one, so the proxy calls it in every `finally`.
    """

    endpoint_id: str
    status: int

    @property
    def headers(self) -> Mapping[str, str]:
        """Response headers, case-insensitive."""
        ...

    @property
    def content_type(self) -> str: ...

    @property
    def is_event_stream(self) -> bool: ...

    async def read(self) -> bytes:
        """The whole body."""
        ...

    async def chunk(self) -> bytes:
        """Whatever body bytes have arrived (waiting for at least one); b"" at the end."""
        ...

    def close(self) -> None: ...

    def release(self) -> None: ...


class Forwarder(Protocol):
    """The proxy's client: one request out, the reply once its head is in."""

    connect_timeout_s: float

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout_s: float,
        endpoint_id: str,
        idle_timeout_s: float | None = None,
    ) -> UpstreamReply:
        """Send one request and wait for the response head (not the body).

        `timeout_s` bounds the whole exchange, body included; `idle_timeout_s`
        (None: no bound) the silence between body bytes once the head is in, so
        a stalled stream ends long before the request's deadline.
        """
        ...


class UpstreamResponse:
    """An engine's answer whose headers have arrived; the body is read through here."""

    __slots__ = ("_idle_s", "_resp", "endpoint_id", "headers", "status")

    def __init__(
        self, resp: aiohttp.ClientResponse, endpoint_id: str, idle_s: float | None = None
    ) -> None:
        self._resp = resp
        self._idle_s = idle_s
        self.endpoint_id = endpoint_id
        self.status = resp.status
        self.headers: CIMultiDictProxy[str] = resp.headers

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "application/json")

    @property
    def is_event_stream(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool."""
        try:
            return await self._resp.read()
        except TimeoutError as exc:
            raise UpstreamTimeout(self.endpoint_id, "body timed out") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamBroken(self.endpoint_id, _describe(exc)) from exc

    async def chunk(self) -> bytes:
        """Whatever bytes have arrived (waiting for at least one); b"" at the end."""
        content = self._resp.content
        try:
            if self._idle_s is None:
                return await content.readany()
            # A timer per read: this client is the reference, not the fast path.
            async with asyncio.timeout(self._idle_s) as idle:
                return await content.readany()
        except TimeoutError as exc:
            if self._idle_s is not None and idle.expired():
                raise UpstreamTimeout(self.endpoint_id, f"no data for {self._idle_s:g}s") from exc
            raise UpstreamTimeout(self.endpoint_id, "stream timed out") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamBroken(self.endpoint_id, _describe(exc)) from exc

    def close(self) -> None:
        """Drop the connection: an engine reading a dropped socket aborts the request."""
        self._resp.close()

    def release(self) -> None:
        """Return a fully read connection to the pool."""
        self._resp.release()


class Upstream:
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

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout_s: float,
        endpoint_id: str,
        idle_timeout_s: float | None = None,
    ) -> UpstreamResponse:
        """Send one request and wait for the response headers (not the body)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self.connect_timeout_s)
        try:
            resp = await self.session.post(url, data=body, headers=headers, timeout=timeout)
        except TimeoutError as exc:
            raise UpstreamTimeout(endpoint_id, "no response in time") from exc
        except aiohttp.ClientError as exc:
            # Refused, reset, or a pooled connection closed under us: the engine has
            # produced nothing for this request, so another replica may take it.
            raise UpstreamConnectError(endpoint_id, _describe(exc)) from exc
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
        except TimeoutError as exc:
            raise UpstreamTimeout(endpoint_id, "timed out") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamConnectError(endpoint_id, _describe(exc)) from exc

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
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self.connect_timeout_s)
        try:
            async with self.session.post(url, data=body, headers=hdrs, timeout=timeout) as resp:
                return resp.status, await resp.read()
        except TimeoutError as exc:
            raise UpstreamTimeout(endpoint_id, "timed out") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamConnectError(endpoint_id, _describe(exc)) from exc


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:200]
