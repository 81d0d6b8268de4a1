"""Engine hosts that go silent under the router, across network namespaces.

No controller here: a router with static endpoints on one host, sim-engines on
another, so what is timed is the router's connection to the engine and nothing
else. `Net.silence_between` drops every packet between the two without a reset,
as a firewall DROP or a dead switch port does.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmgw.testing import Program

from . import netns
from .netns import Host, Net
from .test_multihost import wait_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

ADMIN = "silent-admin"


@pytest.fixture(autouse=True)
def _need_netns() -> None:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(why)


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    with netns.hosts(["router", "gpu-a"], log_dir=tmp_path / "logs") as n:
        yield n


def start_engine(host: Host, *extra: str) -> Program:
    return host.start(["sim-engine", "--host", host.addr, "--port", "0", "--model", "m", *extra])


def start_router(host: Host, engine: Program, tmp: Path, **over: Any) -> Program:
    cfg: dict[str, Any] = {
        "endpoints": [{"id": "e0", "url": engine.url, "models": ["m"]}],
        "scrape_interval_s": 0.25,
        "scrape_timeout_s": 0.2,
        "stale_after_s": 60.0,
        "request_timeout_s": 60.0,
        "admin_token": ADMIN,
        **over,
    }
    path = tmp / "router.yaml"
    path.write_text(yaml.safe_dump(cfg))
    argv = ["router", "--config", str(path), "--host", host.addr, "--port", "0", "--workers", "1"]
    return host.start(argv)


def body(*, max_tokens: int, stream: bool) -> bytes:
    return json.dumps(
        {
            "model": "m",
            "max_tokens": max_tokens,
            "stream": stream,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()


def ask(router_url: str) -> tuple[int, str]:
    """One short non-streamed request: its status and its body."""
    req = urllib.request.Request(
        f"{router_url}/v1/chat/completions",
        data=body(max_tokens=4, stream=False),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def admin_e0(router_url: str) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{router_url}/admin/endpoints", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        snap: dict[str, Any] = json.loads(resp.read())["endpoints"][0]
    return snap


def inflight_gauges(router_url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{router_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in text.splitlines())
        if name.startswith(("llmgw_router_inflight{", "llmgw_router_pending{"))
    }


class TestBriefLoss:
    """A brief loss on a healthy connection does not drop it, however small connect_timeout_s."""

    def test_a_brief_loss_with_a_small_connect_timeout(self, net: Net, tmp_path: Path) -> None:
        """connect_timeout_s 0.2, 0.3 s of loss as a request is written: answered."""
        # The loss is short so that the heal comes before TCP's retransmission at 1.4 s
        # even where a busy machine is slow to run `ip`.
        engine = start_engine(net["gpu-a"], "--speed", "20")
        router = start_router(net["router"], engine, tmp_path, connect_timeout_s=0.2)
        wait_for(lambda: ask(router.url)[0] == 200, what="router serves m")
        out: list[tuple[int, str]] = []
        # On the connection the last answer left pooled: the request's bytes go
        # unacknowledged until the heal, and TCP retransmits them.
        net.silence_between("router", "gpu-a")
        t0 = time.monotonic()
        worker = threading.Thread(target=lambda: out.append(ask(router.url)))
        worker.start()
        time.sleep(0.3)
        net.heal_between("router", "gpu-a")
        lost_s = time.monotonic() - t0
        worker.join(timeout=40)
        took = time.monotonic() - t0
        print(f"answered {out[0][0] if out else None} in {took:.2f}s after {lost_s:.2f} s of loss")
        assert out, "no answer"
        assert out[0][0] == 200, (out, f"{lost_s:.2f} s of loss")
        assert took < 5.0


class TestSilentMidStream:
    """A stream whose engine host goes silent ends with an error event in bounded time."""

    def test_stream_cut_by_a_silent_host(self, net: Net, tmp_path: Path) -> None:
        """Error event and [DONE] within keepalive idle plus the user timeout; the
        breaker counts it; in-flight back to 0."""
        # 10 tokens a second: a 40 s stream, far from over when the host goes silent.
        engine = start_engine(net["gpu-a"], "--decode-base-ms", "100")
        router = start_router(
            net["router"],
            engine,
            tmp_path,
            breaker={"failure_threshold": 1, "cooldown_s": 60.0, "max_cooldown_s": 120.0},
        )
        wait_for(lambda: ask(router.url)[0] == 200, what="router serves m")
        host, port = router.url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=body(max_tokens=400, stream=True),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        assert resp.status == 200
        events: list[str] = []
        silent_at = done_at = None
        while line := resp.readline():
            if not line.startswith(b"data: "):
                continue
            events.append(line[6:].decode().strip())
            if len(events) == 5:
                net.silence_between("router", "gpu-a")
                silent_at = time.monotonic()
            if events[-1] == "[DONE]":
                done_at = time.monotonic()
                break
        conn.close()
        assert silent_at is not None
        assert done_at is not None, events[-3:]
        took = done_at - silent_at
        errors = [json.loads(e)["error"] for e in events if e.startswith('{"error"')]
        print(f"stream ended {took:.1f}s after the silence, {len(events)} events: {errors}")
        assert len(errors) == 1, events[-3:]
        assert errors[0]["code"] == 502
        # PROBE_IDLE_S (5) + about the 3 s user timeout, plus a little for the loaded machine.
        assert took < 12.0
        snap = admin_e0(router.url)
        assert snap["breaker"] == "open", snap
        assert snap["inflight"] == 0, snap
        assert not any(inflight_gauges(router.url).values())
        net.heal_between("router", "gpu-a")
