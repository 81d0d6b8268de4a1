"""A router in memory: the real `Router`, `Proxy` and HTTP server, engines from
`FakeForwarder`, time virtual.

`World.send()` writes one HTTP/1.1 request into the router's own server
(router/http/: the protocol object production serves every connection with,
answering through `Proxy.answer`) over an in-memory transport, and reads back
what the server wrote: the production path from the request's bytes to the
answer's, with no socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httptools
import msgspec
from multidict import CIMultiDict

from llmgw.router.config import parse
from llmgw.router.http.server import FastProtocol, FastServer
from llmgw.router.request.proxy import Proxy
from llmgw.router.wiring import Router
from llmgw.runtime.clock import ManualClock
from llmgw.runtime.httpserver import Edge, ServerLimits, openai_error
from llmgw.testing import vtime
from llmgw.testing.forwarder import FakeForwarder

CHAT = "/v1/chat/completions"


class Pipe(asyncio.Transport):
    """One client connection's transport, in memory: what the server writes is kept;
    `closed` is done once the server has closed it (its answer is all there)."""

    def __init__(self, protocol: FastProtocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.out = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closed.done()

    def close(self) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def can_write_eof(self) -> bool:
        # No lingering read after an early answer: nothing more will come.
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def get_write_buffer_size(self) -> int:
        # Everything written is taken at once (`out`); without this, each answer that
        # closed its connection left a "Task exception was never retrieved" behind.
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Answered:
    """What the client got, parsed from the bytes the server wrote."""

    def __init__(self, raw: bytes) -> None:
        self.status = 0
        self.headers: CIMultiDict[str] = CIMultiDict()
        body = bytearray()
        self._done = False
        parser = httptools.HttpResponseParser(self)
        self._body = body
        parser.feed_data(raw)
        self.status = parser.get_status_code()
        self.body = bytes(body)
        self.streamed = self.headers.get("Transfer-Encoding") == "chunked"
        self.complete = self._done  # the body came to its end (a chunked one: its last chunk)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self._done = True

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


class World:
    def __init__(self, config: str, *, start: float = 1_000.0) -> None:
        self.clock = ManualClock(start_monotonic=start)
        self.router = Router(parse(config), clock=self.clock)
        self.fake = FakeForwarder()
        self.router.forward = self.fake
        self.proxy = Proxy(self.router)

    def run(self, main: Callable[[], Awaitable[Any]]) -> Any:
        async def wrapped() -> Any:
            return await main()

        return vtime.run(wrapped(), self.clock)

    def _server(self) -> FastServer:
        edge = Edge(ServerLimits(decompress=False), openai_error, name="router")
        cfg = self.router.cfg
        return FastServer(edge, self.proxy.answer, max_body_bytes=cfg.max_body_bytes)

    async def send(
        self,
        body: dict[str, Any] | None = None,
        *,
        path: str = CHAT,
        headers: dict[str, str] | None = None,
    ) -> Answered:
        """One request on a connection of its own (closed after its answer)."""
        raw = msgspec.json.encode(body if body is not None else {"model": "m", "messages": []})
        hdrs = {"Host": "router", "Content-Type": "application/json", "Connection": "close"}
        hdrs["Content-Length"] = str(len(raw))
        hdrs.update(headers or {})
        head = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
        conn = self._server().protocol()
        pipe = Pipe(conn)
        conn.connection_made(pipe)
        conn.data_received(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + raw)
        await pipe.closed
        return Answered(bytes(pipe.out))

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
