"""Precise mode: real sim-engines publish their KV events, a real router follows them.

The router learns what an engine caches from the engine itself (docs/routing.md):
a prompt sent straight to one engine, behind the router's back, draws the
router's next request with that prompt there; once that engine's cache is reset
the router stops believing in it at once, before any engine answer could tell.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.router.routing.blockhash import request_block_hashes
from llmgw.router.routing.rendezvous import rendezvous_order
from llmgw.testing import start_program
from llmgw.testing.procs import free_port
from llmgw.testing.wait import until

from .router_fixtures import (
    MODEL,
    base_config,
    config_path,
    post,
    router,
    sim_engines,
    wait_until_scraped,
    write_config,
)

pytestmark = pytest.mark.slow

IDS = ["e0", "e1", "e2"]
CONNECTED = "llmgw_router_kv_events_connected"


def metric(router_url: str, name: str, **labels: str) -> float | None:
    """One sample of the router's /metrics, None when absent."""
    with urllib.request.urlopen(router_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    return None if m is None else float(m.group(1))


def post_engine(
    engine_url: str, path: str, body: dict[str, Any] | None = None, *, key: str = ""
) -> Any:
    """POST to an engine; `key`: its engine key, which every route but three needs."""
    data = json.dumps(body).encode() if body is not None else b""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(engine_url + path, data=data, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def chat(tag: str) -> dict[str, Any]:
    system = f"[{tag}] You answer questions about the ACME corporation's products. " * 10
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "What does the anvil cost?"},
        ],
        "max_tokens": 4,
    }


class TestPreciseMode:
    """The router follows what real engines hold."""

    async def test_follows_what_engines_really_hold(self, tmp_path: Path) -> None:
        """The router's index follows what real engines hold."""
        ports = [free_port() for _ in IDS]
        extras = [
            [
                "--kv-events-config",
                json.dumps(
                    {
                        "enable_kv_cache_events": True,
                        "publisher": "zmq",
                        "endpoint": f"tcp://127.0.0.1:{port}",
                    }
                ),
            ]
            for port in ports
        ]
        with (
            sim_engines(tmp_path, [20.0], extra=extras[0]) as e0,
            sim_engines(tmp_path, [20.0], extra=extras[1]) as e1,
            sim_engines(tmp_path, [20.0], extra=extras[2]) as e2,
        ):
            engines = [*e0, *e1, *e2]
            entries = [
                {
                    "id": eid,
                    "url": p.url,
                    "models": [MODEL],
                    "kv_events": f"tcp://127.0.0.1:{port}",
                    "tokenizer": "sim",
                }
                for eid, p, port in zip(IDS, engines, ports, strict=True)
            ]
            with router(tmp_path, base_config(endpoints=entries)) as r:
                await wait_until_scraped(r.url, IDS)
                for eid, p in zip(IDS, engines, strict=True):
                    await until(
                        lambda eid=eid: metric(r.url, CONNECTED, endpoint=eid) == 1,
                        what=f"{eid} subscribed",
                        blocking=True,
                    )

                    # A reset publishes AllBlocksCleared: the router then knows the
                    # cache exactly (empty). Repeated, in case the first was sent
                    # before the subscription reached the publisher.
                    def synced(eid: str = eid, url: str = p.url) -> bool:
                        mode = {"endpoint": eid, "mode": "precise"}
                        if metric(r.url, "llmgw_router_prefix_mode", **mode) == 1:
                            return True
                        post_engine(url, "/reset_prefix_cache")
                        return False

                    await until(synced, what=f"{eid} in precise mode", blocking=True)

                body = chat("precise")
                # The engine the guessing mode would least pick for this prompt.
                order = rendezvous_order(request_block_hashes(body)[0], IDS)
                target, home = order[-1], order[0]
                t_url = engines[IDS.index(target)].url
                # Behind the router's back: only the engine's events can tell.
                post_engine(t_url, "/v1/chat/completions", body)
                await until(
                    lambda: (
                        (metric(r.url, "llmgw_router_kv_events_blocks", endpoint=target) or 0) > 0
                    ),
                    what="the router applied the engine's BlockStored",
                    blocking=True,
                )
                debug = {"x-llmgw-debug": "1"}
                async with aiohttp.ClientSession() as session:
                    reply = await post(session, r.url, body, headers=debug)
                    assert reply.status == 200, reply.body
                    assert reply.endpoint == target, reply.headers.get("x-llmgw-scores")
                    assert " prefix;" in reply.headers["x-llmgw-scores"]
                    details = reply.json()["usage"]["prompt_tokens_details"]
                    assert details["cached_tokens"] > 0

                    # The engine forgets; the router learns it from the event alone.
                    assert post_engine(t_url, "/reset_prefix_cache") == {"reset": True}
                    await until(
                        lambda: (
                            metric(r.url, "llmgw_router_kv_events_blocks", endpoint=target) == 0
                        ),
                        what="the router applied AllBlocksCleared",
                        blocking=True,
                    )
                    again = await post(session, r.url, body, headers=debug)
                    assert again.status == 200, again.body
                    scores = again.headers["x-llmgw-scores"]
                    assert again.endpoint == home, scores
                    assert " home;" in scores, scores

                # A publisher that goes away takes its endpoint out of precise mode.
                engines[IDS.index(target)].stop(grace_s=3)
                await until(
                    lambda: (
                        metric(r.url, "llmgw_router_prefix_mode", endpoint=target, mode="guess")
                        == 1
                    ),
                    what="fallback to guessing once the subscription is down",
                    blocking=True,
                )


class TestWithoutPyzmq:
    """Without pyzmq the router starts and guesses."""

    async def test_router_starts_and_guesses(self, tmp_path: Path) -> None:
        """pyzmq is optional: without it a router whose endpoints name KV events
        starts, says why it cannot follow them, and routes by guessing."""
        hide = tmp_path / "hide"
        (hide / "zmq").mkdir(parents=True)
        (hide / "zmq" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
        path = os.pathsep.join(p for p in (str(hide), os.environ.get("PYTHONPATH", "")) if p)
        with sim_engines(tmp_path, [20.0]) as engines:
            entry = {
                "id": "e0",
                "url": engines[0].url,
                "models": [MODEL],
                "kv_events": f"tcp://127.0.0.1:{free_port()}",
                "tokenizer": "sim",
            }
            cfg = write_config(config_path(tmp_path), base_config(endpoints=[entry]))
            prog = start_program(
                ["router", "--config", str(cfg), "--port", "0"],
                log_dir=tmp_path,
                env={"PYTHONPATH": path},
            )
            try:
                await wait_until_scraped(prog.url, ["e0"])
                async with aiohttp.ClientSession() as session:
                    reply = await post(session, prog.url, chat("no-zmq"))
                assert reply.status == 200, reply.body
                assert (
                    metric(prog.url, "llmgw_router_prefix_mode", endpoint="e0", mode="guess") == 1
                )
                await until(
                    lambda: "pyzmq is not installed" in prog.log_text(),
                    what="the error",
                    blocking=True,
                )
            finally:
                prog.stop(grace_s=5)
