"""An OTLP/HTTP traces receiver for tests: every span it is sent, decoded from the wire.

    async with otlp_receiver() as rec:        # rec.url: http://127.0.0.1:P/v1/traces
        ... start a program with tracing pointed at rec.url ...
        span = await rec.wait_span(lambda s: s.name == "llmgw.placement")
        attributes(span.attributes)["llmgw.model"]

    with unanswering_endpoint() as url:       # a collector that never answers

    lost = await wait_spans_lost(read_metrics, "router")   # both reasons counted, by reason

It decodes the programs' exports with the protobuf classes of opentelemetry-proto
(the real wire format, not the SDK's in-memory spans), so it needs the `tracing`
extra: importing this module without it raises ImportError (tests importorskip it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from llmgw.testing.wait import until

# Where the SDK's OTLP/HTTP exporter posts spans.
TRACES_PATH = "/v1/traces"


class Receiver:
    """The spans received so far, in arrival order, with the resource each came with."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        # service.name of each span's resource, parallel to `spans`.
        self.services: list[str] = []
        self.url = ""

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        for rs in export.resource_spans:
            service = str(attributes(rs.resource.attributes).get("service.name", ""))
            for ss in rs.scope_spans:
                self.spans.extend(ss.spans)
                self.services.extend(service for _ in ss.spans)
        reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type="application/x-protobuf")

    async def wait_span(self, match: Callable[[Any], bool], *, timeout_s: float = 20.0) -> Any:
        """The first span received that `match` accepts; AssertionError after `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            for span in self.spans:
                if match(span):
                    return span
            await asyncio.sleep(0.05)
        names = sorted({s.name for s in self.spans})
        raise AssertionError(f"no matching span among {len(self.spans)}: {names}")

    async def wait_trace(self, trace_id: str, *, timeout_s: float = 20.0) -> Any:
        """The first span of the trace `trace_id` (32 hex digits)."""
        return await self.wait_span(lambda s: s.trace_id.hex() == trace_id, timeout_s=timeout_s)


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    """A receiver listening on 127.0.0.1 (a free port) until the block ends."""
    rec = Receiver()
    app = web.Application()
    app.router.add_post(TRACES_PATH, rec.traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rec.url = f"http://127.0.0.1:{runner.addresses[0][1]}{TRACES_PATH}"
    try:
        yield rec
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def unanswering_endpoint() -> Iterator[str]:
    """A traces URL whose collector never answers: a listening socket never accepted,
    so connects succeed and no reply ever comes (an exporter waits out its timeout)."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        yield f"http://127.0.0.1:{hole.getsockname()[1]}{TRACES_PATH}"


def spans_dropped(metrics_text: str, program: str) -> dict[str, float]:
    """`llmgw_<program>_spans_dropped_total` by reason, from a /metrics page."""
    series = f"llmgw_{program}_spans_dropped_total{{"
    out = {}
    for line in metrics_text.splitlines():
        if line.startswith(series):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('reason="', 1)[1].split('"', 1)[0]] = float(value)
    return out


async def wait_spans_lost(
    read_metrics: Callable[[], Awaitable[str]], program: str, *, timeout_s: float = 20.0
) -> dict[str, float]:
    """`spans_dropped` once every reason has counted a span (AssertionError after
    `timeout_s`); `read_metrics` gets the program's /metrics page."""

    async def each_reason() -> dict[str, float]:
        got = spans_dropped(await read_metrics(), program)
        return got if got and min(got.values()) >= 1 else {}

    lost: dict[str, float] = await until(each_reason, timeout_s=timeout_s, what="spans lost")
    return lost


def attributes(items: Any) -> dict[str, Any]:
    """OTLP key-values as a dict: each value as its set field holds it (arrays as lists)."""
    out: dict[str, Any] = {}
    for kv in items:
        out[kv.key] = _value(kv.value)
    return out


def _value(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which)


def without_sdk(folder: Path) -> dict[str, str]:
    """An environment whose programs cannot import OpenTelemetry, as where the extra is
    not installed: a package of that name first on PYTHONPATH that refuses to load."""
    shadow = folder / "opentelemetry"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    return dict(os.environ, PYTHONPATH=str(folder))
