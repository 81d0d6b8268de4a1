"""The aiohttp session the router uses off the request path: the /metrics scrape
and the controller link (`get`, `post_json`: small requests read whole).

Not a `Forwarder`: the proxy relays with its own client only (fast.py). The
`upstream_client: aiohttp` setting that made this session relay requests too is
retired (config.py): the lean client covers what the proxy needs of it (http and
https engines over TCP, keep-alive, timeouts, streams), and it relays a
redirect as the engine sent it where aiohttp's `post` follows one; two relaying
clients were one fault behaviour written twice. Here aiohttp still earns its
place: GETs and JSON POSTs to many hosts, with DNS caching, for which the
proxy's client (POST only, shaped for relaying) was never built.

One `ClientSession` with one tuned connector for the whole process: a session
per request would pay a TCP handshake per request and defeat keep-alive.
aiohttp's exceptions leave this module only as the router's own
(`base.translate`).
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp

from llmgw.router.errors import AnswerTooLarge
from llmgw.router.upstream.base import JSON, KEEPALIVE_S, translate

# What aiohttp (and asyncio under it) raise; caught here, translated in `base`.
_ERRORS = (TimeoutError, aiohttp.ClientError)


class Upstream:
    """The process's shared session for scrapes and the controller. `start()` inside
    the event loop, `close()` at exit."""

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
            # Nothing asks for a compressed answer (no Accept-Encoding), nothing is decoded.
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

    async def get(
        self,
        url: str,
        *,
        timeout_s: float,
        endpoint_id: str,
        headers: Mapping[str, str] | None = None,
        max_bytes: int | None = None,
    ) -> tuple[int, bytes]:
        """A small GET read whole (metrics, controller), errors translated like `post`.

        `max_bytes`: an answer longer is AnswerTooLarge, cut as soon as it passes the
        bound (None: no bound). Unbounded, an engine's endless /metrics was taken into
        memory for the scrape's whole timeout, hundreds of MiB a scrape."""
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self.connect_timeout_s)
        try:
            async with self.session.get(url, headers=headers, timeout=timeout) as resp:
                if max_bytes is None:
                    return resp.status, await resp.read()
                return resp.status, await _read_at_most(resp, max_bytes, endpoint_id)
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


async def _read_at_most(resp: aiohttp.ClientResponse, max_bytes: int, endpoint_id: str) -> bytes:
    """The answer's body, or AnswerTooLarge once it passes `max_bytes` (the connection
    is then closed, not drained: the rest could be endless)."""
    too_large = AnswerTooLarge(endpoint_id, f"answer over {_size(max_bytes)}")
    if resp.content_length is not None and resp.content_length > max_bytes:
        resp.close()
        raise too_large
    body = bytearray()
    while chunk := await resp.content.read(64 * 1024):
        body += chunk
        if len(body) > max_bytes:
            resp.close()
            raise too_large
    return bytes(body)


def _size(n: int) -> str:
    return f"{n // (1 << 20)} MiB" if n % (1 << 20) == 0 else f"{n} bytes"
