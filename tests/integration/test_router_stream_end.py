"""A stream whose final event went out is complete, whatever the client does next; GET /health.

The sim-engine's `linger_after_done_s` fault keeps a stream's body open after
`data: [DONE]`, so a client that closes at `[DONE]` (as guidellm does) always
lands in the moment between the router relaying it and the engine's end of
body: the race, made certain. Real sim-engine and router processes, under both
HTTP servers.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest

from llmgw.testing.wait import until

from .router_fixtures import (
    base_config,
    chat_body,
    endpoint_entries,
    router,
    sim_engines,
    wait_until_scraped,
)
from .test_router_observability import req_count, scrape
from .test_router_stream_faults import set_faults

pytestmark = pytest.mark.timeout(90)


async def close_at_done(url: str, body: dict[str, object], path: str) -> bytes:
    """POST a streamed request over a raw socket, read until `data: [DONE]`, and close."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    got = b""
    try:
        while b"data: [DONE]\n\n" not in got:
            chunk = await asyncio.wait_for(reader.read(65536), 20)
            assert chunk, got
            got += chunk
    finally:
        writer.close()
    return got


async def counted(url: str, n: int, timeout_s: float = 10.0) -> bytes:
    """/metrics once `n` requests are counted: a request whose client closed is counted
    when the router sees the close, which may come after the next scrape."""

    def enough() -> bytes | None:
        text = scrape(url)
        return text if req_count(text) >= n else None

    got: bytes = await until(enough, blocking=True, timeout_s=timeout_s, what=f"{n} counted")
    return got


class TestCloseAtDone:
    """A stream whose final event went out counts as complete."""

    async def test_counted_complete(self, tmp_path: Path) -> None:
        """Clients that close right after `[DONE]` while the engine lingers are counted
        200 `ok`, none 499 `disconnected`, and the endpoint's breaker sees no failure."""
        with sim_engines(tmp_path, [50.0]) as engines:
            await set_faults(engines[0].url, linger_after_done_s=2.0)
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg) as r:
                await wait_until_scraped(r.url, ["e0"])
                bodies = [chat_body(f"turn {i}", max_tokens=3, stream=True) for i in range(4)]
                for body in bodies:
                    got = await close_at_done(r.url, body, "/v1/chat/completions")
                    assert b" 200 " in got.split(b"\r\n", 1)[0]
                text = await counted(r.url, len(bodies))
        assert req_count(text, outcome="disconnected") == 0
        assert req_count(text, outcome="ok", code="200") == len(bodies)


class TestHealth:
    """GET /health answers like vLLM."""

    def test_health_answers_like_vllm(self, tmp_path: Path) -> None:
        """GET /health answers 200 with an empty body, as vLLM's does, beside /healthz."""
        with router(tmp_path, base_config(endpoints=[])) as r:
            with urllib.request.urlopen(r.url + "/health", timeout=10) as resp:
                assert (resp.status, resp.read()) == (200, b"")
            with urllib.request.urlopen(r.url + "/healthz", timeout=10) as resp:
                assert json.loads(resp.read())["status"] == "ok"
