"""Traces across the router: the W3C context reaches the engine, and spans reach OTLP.

A real sim-engine and router; an OTLP/HTTP receiver in the test decodes the
router's export with the protobuf classes of opentelemetry-proto (the real
wire format, not the SDK's in-memory spans; llmgw.testing.otlp).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing.procs import Program, llmgw_argv

from .hostile import no_traceback, raw_request
from .router_fixtures import (
    base_config,
    chat_body,
    endpoint_entries,
    post,
    router,
    sim_engines,
    wait_until_scraped,
)

otlp = pytest.importorskip("llmgw.testing.otlp", reason="the tracing extra is not installed")
attributes = otlp.attributes

pytestmark = pytest.mark.timeout(90)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Any, str]]:
    async with otlp.otlp_receiver() as rec:
        yield rec, rec.url


@contextlib.asynccontextmanager
async def traced_fleet(
    tmp_path: Path, endpoint: str
) -> AsyncIterator[tuple[list[Program], Program]]:
    """One sim-engine behind a router that exports spans to `endpoint`, once scraped."""
    with sim_engines(tmp_path, [50.0]) as engines:
        cfg = base_config(
            endpoints=endpoint_entries(engines),
            tracing={"endpoint": endpoint, "export_interval_s": 0.1},
        )
        with router(tmp_path, cfg) as r:
            await wait_until_scraped(r.url, ["e0"])
            yield engines, r


def metrics_page(router_url: str) -> str:
    with urllib.request.urlopen(router_url + "/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def engine_trace(engine_url: str) -> dict[str, str]:
    with urllib.request.urlopen(engine_url + "/sim/state", timeout=10) as resp:
        got: dict[str, str] = json.loads(resp.read())["last_trace"]
    return got


class TestTraceContextOff:
    """Without tracing the trace context is passed on unchanged."""

    async def test_passed_on_unchanged(self, tmp_path: Path) -> None:
        """Without tracing configured, the engine gets the client's traceparent and
        tracestate exactly as they came."""
        with (
            sim_engines(tmp_path, [50.0]) as engines,
            router(tmp_path, base_config(endpoints=endpoint_entries(engines))) as r,
        ):
            await wait_until_scraped(r.url, ["e0"])
            headers = {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}
            async with aiohttp.ClientSession() as s:
                got = await post(s, r.url, chat_body("trace me"), headers=headers)
                assert got.status == 200
                msg = {
                    "model": "m",
                    "max_tokens": 2,
                    "messages": [{"role": "user", "content": "x"}],
                }
                assert (
                    await post(s, r.url, msg, path="/v1/messages", headers=headers)
                ).status == 200
            seen = await asyncio.to_thread(engine_trace, engines[0].url)
        assert seen == {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}


class TestSpans:
    """The route span is exported."""

    async def test_route_span_exported(self, tmp_path: Path, receiver: tuple[Any, str]) -> None:
        """With tracing on, each request's llmgw.route span reaches the OTLP receiver: a
        child of the client's span carrying the decision, and the engine's parent."""
        rec, endpoint = receiver
        async with (
            traced_fleet(tmp_path, endpoint) as (engines, r),
            aiohttp.ClientSession() as s,
        ):
            headers = {"traceparent": TRACEPARENT, "tracestate": "k=v"}
            got = await post(s, r.url, chat_body("trace me"), headers=headers)
            assert got.status == 200
            seen = await asyncio.to_thread(engine_trace, engines[0].url)
            span = await rec.wait_trace(TRACE_ID)
            # No context from the client: the router starts a trace.
            fresh = await post(s, r.url, chat_body("no context"))
            assert fresh.status == 200
            started = await asyncio.to_thread(engine_trace, engines[0].url)
            root = await rec.wait_trace(started["traceparent"].split("-")[1])
        assert span.name == "llmgw.route"
        assert span.parent_span_id.hex() == CLIENT_SPAN
        assert seen["traceparent"] == f"00-{TRACE_ID}-{span.span_id.hex()}-01"
        assert seen["tracestate"] == "k=v"
        attrs = attributes(span.attributes)
        assert attrs["llmgw.endpoint"] == "e0"
        assert attrs["llmgw.model"] == "m"
        assert attrs["http.response.status_code"] == 200
        assert attrs["llmgw.outcome"] == "ok"
        [attempt] = [e for e in span.events if e.name == "attempt"]
        event = attributes(attempt.attributes)
        assert event["llmgw.endpoint"] == "e0"
        assert event["llmgw.attempt"] == 1
        assert event["llmgw.reason"]
        assert root.parent_span_id == b""
        assert started["traceparent"].split("-")[2] == root.span_id.hex()

    async def test_request_id_not_utf8(self, tmp_path: Path, receiver: tuple[Any, str]) -> None:
        """A client's x-request-id that is not UTF-8 is replaced by the router's own id:
        kept, the exporter could not encode it, left it off the span and logged a
        traceback, once per such request."""
        rec, endpoint = receiver
        async with traced_fleet(tmp_path, endpoint) as (_, r):
            body = json.dumps(chat_body("trace me")).encode()
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                f"traceparent: {TRACEPARENT}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n"
            ).encode()
            raw = head + b"x-request-id: id-\xff\r\n\r\n" + body
            ans = await asyncio.to_thread(raw_request, r.port, raw)
            assert ans.status == 200
            span = await rec.wait_trace(TRACE_ID)
            r.stop(grace_s=5)
            no_traceback(r.log_text())
        rid = attributes(span.attributes)["llmgw.request_id"]
        assert len(rid) == 24
        assert ans.headers["x-request-id"] == rid


class TestInvalidContext:
    """A trace context W3C says to ignore starts a new trace that carries none of it."""

    async def test_new_trace_without_client_tracestate(
        self, tmp_path: Path, receiver: tuple[Any, str]
    ) -> None:
        """A traceparent of version ff, or sent twice, makes the router start a new trace:
        the engine gets the router's own valid traceparent and not the client's
        tracestate, which belongs to the trace it did not join."""
        _, endpoint = receiver
        other = f"00-{'1' * 32}-{CLIENT_SPAN}-01"
        sent = {
            "version ff": [("traceparent", "ff" + TRACEPARENT[2:])],
            "twice": [("traceparent", TRACEPARENT), ("traceparent", other)],
        }
        seen: dict[str, dict[str, str]] = {}
        async with traced_fleet(tmp_path, endpoint) as (engines, r):
            body = json.dumps(chat_body("trace me")).encode()
            for name, lines in sent.items():
                head = "".join(f"{k}: {v}\r\n" for k, v in [*lines, ("tracestate", "k=v")])
                raw = (
                    f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{head}"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode()
                ans = await asyncio.to_thread(raw_request, r.port, raw + body)
                assert ans.status == 200
                seen[name] = await asyncio.to_thread(engine_trace, engines[0].url)
        for name, got in seen.items():
            assert list(got) == ["traceparent"], name
            version, trace_id, _, _ = got["traceparent"].split("-")
            assert version == "00", name
            assert trace_id not in (TRACE_ID, "1" * 32, "0" * 32), name


class TestStopWithCollectorAway:
    """A collector that never answers does not hold the router's stop."""

    async def test_stop_bounded(self, tmp_path: Path) -> None:
        """With spans batched for a collector that accepts no connection, SIGTERM stops
        the router within seconds (it took 10 to 30 s: the SDK waited out its export
        timeouts), saying the spans were not sent."""
        with (
            otlp.unanswering_endpoint() as endpoint,
            sim_engines(tmp_path, [50.0]) as engines,
        ):
            tracing = {"endpoint": endpoint, "export_interval_s": 0.1, "export_timeout_s": 30}
            cfg = base_config(endpoints=endpoint_entries(engines), tracing=tracing)
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0"])
                async with aiohttp.ClientSession() as s:
                    for i in range(3):
                        assert (await post(s, r.url, chat_body(f"q{i}"))).status == 200
                t0 = time.monotonic()
                r.signal(signal.SIGTERM)
                await asyncio.to_thread(r.proc.wait, 20)
                took_s = time.monotonic() - t0
                text = r.log_text()
        assert r.proc.returncode == 0
        assert took_s < 9.0
        assert "tracing stopped with spans unsent" in text
        no_traceback(text)


class TestSpansLost:
    """Spans a collector never receives are counted on the router's /metrics."""

    @pytest.mark.parametrize("workers", [1, 2])
    async def test_full_queue_and_failed_export_counted(self, tmp_path: Path, workers: int) -> None:
        """A collector that never answers and a one-span queue: spans ending while one
        waits are counted `queue_full`, those handed to the timed-out export
        `export_failed`, summed over the workers; none more than were made."""
        requests = 12
        with (
            otlp.unanswering_endpoint() as endpoint,
            sim_engines(tmp_path, [50.0]) as engines,
        ):
            tracing = {
                "endpoint": endpoint,
                "export_interval_s": 0.05,
                "export_timeout_s": 0.5,
                "max_queued_spans": 1,
            }
            cfg = base_config(endpoints=endpoint_entries(engines), tracing=tracing)
            with router(tmp_path, cfg, workers=workers) as r:
                await wait_until_scraped(r.url, ["e0"])
                before = otlp.spans_dropped(await asyncio.to_thread(metrics_page, r.url), "router")
                async with aiohttp.ClientSession() as s:
                    sent = [post(s, r.url, chat_body(f"q{i}")) for i in range(requests)]
                    assert {got.status for got in await asyncio.gather(*sent)} == {200}

                lost = await otlp.wait_spans_lost(
                    lambda: asyncio.to_thread(metrics_page, r.url), "router"
                )
        assert before == {"queue_full": 0.0, "export_failed": 0.0}
        assert lost.keys() == {"queue_full", "export_failed"}
        assert sum(lost.values()) <= requests


class TestTracingRefused:
    """Tracing configured without the SDK stops the router at start."""

    def test_sdk_missing_refused_at_start(self, tmp_path: Path) -> None:
        """`tracing:` set without the OpenTelemetry SDK: the router exits 2 with one line
        saying what to install, before any worker starts."""
        config = tmp_path / "r.yaml"
        config.write_text("endpoints: []\ntracing:\n  endpoint: http://127.0.0.1:9/v1/traces\n")
        env = otlp.without_sdk(tmp_path / "shadow")
        argv = llmgw_argv("router", "--config", str(config), "--port", "0", "--workers", "2")
        got = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert (got.returncode, got.stdout) == (2, ""), got.stderr
        assert got.stderr.strip().endswith("(pip install 'llmgw[tracing]')")
        assert "Traceback" not in got.stderr
