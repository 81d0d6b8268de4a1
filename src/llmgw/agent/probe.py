"""Is an engine ready? `GET http://<host>:<port><path>` answers 200 (host: where it listens)."""

from __future__ import annotations

from typing import Protocol

import aiohttp


class HealthProbe(Protocol):
    async def check(self, host: str, port: int, path: str) -> bool: ...

    async def close(self) -> None: ...


class HttpHealthProbe:
    """One shared client session; every failure (refused, timeout, non-200) is "not ready"."""

    def __init__(self, *, timeout_s: float = 1.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def check(self, host: str, port: int, path: str) -> bool:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.get(f"http://{netloc(host)}:{port}{path}") as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def netloc(host: str) -> str:
    """An IPv6 literal goes in brackets; a name or IPv4 address as it is."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
