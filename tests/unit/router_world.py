"""A router in memory: the real `Router` and `Proxy`, engines from `FakeForwarder`, time virtual.

`World.send()` drives one request through `Proxy.handle` on an aiohttp request
built in memory (aiohttp's own test helper); a streamed answer's bytes are
caught by `Sink`, the writer the response writes to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from unittest import mock

import msgspec
from aiohttp import StreamReader, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.test_utils import make_mocked_request

from llmgw.router.config import parse
from llmgw.router.request.proxy import Proxy
from llmgw.router.wiring import Router
from llmgw.runtime.clock import ManualClock
from llmgw.testing import vtime
from llmgw.testing.forwarder import FakeForwarder

CHAT = "/v1/chat/completions"


class Sink(AbstractStreamWriter):
    """Collects what a prepared response writes (head and body), in memory."""

    def __init__(self) -> None:
        self.status_line = ""
        self.body = bytearray()
        self.eof = False

    async def write(self, chunk: Any) -> None:
        self.body += bytes(chunk)

    async def write_eof(self, chunk: bytes = b"") -> None:
        self.body += chunk
        self.eof = True

    async def drain(self) -> None:
        pass

    def enable_compression(self, encoding: str = "deflate", strategy: int | None = None) -> None:
        pass

    def enable_chunking(self) -> None:
        pass

    async def write_headers(self, status_line: str, headers: Any) -> None:
        self.status_line = status_line


class Answered:
    """What the client got."""

    def __init__(self, resp: web.StreamResponse, sink: Sink) -> None:
        self.status = resp.status
        self.headers = resp.headers
        self.streamed = sink.status_line != ""
        self.body = bytes(sink.body) if self.streamed else bytes(getattr(resp, "body", b""))

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


class World:
    def __init__(self, config: str, *, start: float = 1_000.0) -> None:
        self.clock = ManualClock(start_monotonic=start)
        self.router = Router(parse(config), clock=self.clock, env={})
        self.fake = FakeForwarder()
        self.router.forward = self.fake
        self.proxy = Proxy(self.router)

    def run(self, main: Callable[[], Awaitable[Any]]) -> Any:
        async def wrapped() -> Any:
            return await main()

        return vtime.run(wrapped(), self.clock)

    async def send(
        self,
        body: dict[str, Any] | None = None,
        *,
        path: str = CHAT,
        headers: dict[str, str] | None = None,
    ) -> Answered:
        raw = msgspec.json.encode(body if body is not None else {"model": "m", "messages": []})
        payload = StreamReader(
            mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop()
        )
        payload.feed_data(raw)
        payload.feed_eof()
        sink = Sink()
        hdrs = {"Content-Type": "application/json", "Content-Length": str(len(raw))}
        hdrs.update(headers or {})
        request = make_mocked_request("POST", path, headers=hdrs, payload=payload, writer=sink)
        resp = await self.proxy.handle(request)
        return Answered(resp, sink)

    def retries(self) -> dict[str, float]:
        """llmgw_router_retries_total by endpoint, from the router's own metrics."""
        out: dict[str, float] = {}
        for line in self.router.metrics.render().decode().splitlines():
            if line.startswith("llmgw_router_retries_total{"):
                labels, value = line.rsplit(" ", 1)
                eid = labels.split('endpoint="', 1)[1].split('"', 1)[0]
                out[eid] = float(value)
        return out

    def breaker(self, eid: str) -> str:
        return next(str(s.breaker) for s in self.router.registry.snapshots() if s.id == eid)
