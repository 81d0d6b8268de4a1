"""What the router adds: latency, throughput, streamed chunks, CPU and memory (issue 3).

Set-up, all on 127.0.0.1:
- a minimal upstream written with raw asyncio protocols (no HTTP framework),
  answering a small chat completion, a 64-event SSE stream, and /metrics —
  cheap enough that the router, not the upstream, is what is measured;
- the router (`llmgw router`, policy `ours`, the real scrape loop running)
  pinned to CPU 0 with `taskset`;
- the upstream and this load generator (raw asyncio, keep-alive connections)
  pinned to the other CPU(s).

Each phase runs the same load twice, straight at the upstream ("direct") and
through the router, so the difference is the router's. Phases:
  latency at concurrency 1 and 64 (added p50/p99), req/s at 64 and 256 (non-
  streaming, small bodies), streamed events/s at 64 with 64-event responses,
  router CPU seconds per 1,000 requests, router peak RSS.

Usage: .venv/bin/python bench/router_overhead.py [--seconds 4] [--no-results]
       .venv/bin/python bench/router_overhead.py --profile
           (cProfile of the router)
       .venv/bin/python bench/router_overhead.py --scale [--quota 0.35]
           (--workers 1 vs 2; with --quota, each worker held to that share of a CPU)
       .venv/bin/python bench/router_overhead.py --chat [--peers]
           (realistic chat bodies, four engines: ours vs round_robin, issue 15)
       .venv/bin/python bench/router_overhead.py --instructions [--stream] [--requests 2000]
           [--sizes 300 8192] [--policies ours round_robin] [--build-only] [--keep DIR]
           [--concurrency 16]
           (user-space instructions per request under valgrind's callgrind: the default
           policy and round_robin, compiled and Python modules; steady on a noisy machine)
       .venv/bin/python bench/router_overhead.py --policy-step
           (the routing work in-process; with the router's mypyc build when there is
           one, LLMGW_ROUTER_COMPILED=0 for the Python modules: docs/router.md)

--chat --peers also runs the Rust routers of issue 15 through the same phases, in the
same run, pinned to the same CPU: sglang-router 0.3.2 (cache_aware, round_robin) and
vllm-router 0.1.17 (round_robin). They are bench-only: each lives in its own venv under
~/.cache/llmgw/peers/<package>-<version>/, made with `python -m venv` and `pip install`
on first use — never in the project's venv, never a project dependency. A peer whose
wheel does not install or that does not answer is skipped with the reason printed.
Each is launched as `<venv>/bin/python -m sglang_router.launch_router` (or
`vllm_router.launch_router`) `--host 127.0.0.1 --port P --worker-urls URL... --policy
POLICY --prometheus-host 127.0.0.1 --prometheus-port Q --log-level warn[ing]` (sglang
also `--shutdown-grace-period-secs 1`); without `--log-level warn` sglang-router logs
two INFO lines per request. Its CPU is read from its PID (a python launcher running
the Rust router in-process: its threads are in the PID's counters; `cpu_seconds` adds
direct children, and the table's notes list threads and children). The minimal
engines answer what the peers poll (GET /health 200; other GETs but /metrics 404;
sglang-router's HTTP/2 probe is hung up on). Not measured: vllm-router's cache_aware,
which asks a worker to render every chat request into token ids first
(POST /v1/chat/completions/render), which the minimal engines cannot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## router_overhead.py"
CHAT_SECTION = "## router_overhead.py --chat"
SCALE_SECTION = "## router_overhead.py --scale"
MODEL = "bench"
STREAM_EVENTS = 64

# -- the upstream: raw asyncio, one process ------------------------------------

_CHAT = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok ok ok ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12},
    }
).encode()
_CHAT_RESP = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(_CHAT)).encode()
    + b"\r\n\r\n"
    + _CHAT
)
_METRICS = (
    b'vllm:num_requests_running{engine="0",model_name="bench"} 0.0\n'
    b'vllm:num_requests_waiting{engine="0",model_name="bench"} 0.0\n'
    b'vllm:kv_cache_usage_perc{engine="0",model_name="bench"} 0.0\n'
    b'vllm:request_success_total{engine="0",finished_reason="stop",model_name="bench"} 1.0\n'
)
_METRICS_RESP = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
    + str(len(_METRICS)).encode()
    + b"\r\n\r\n"
    + _METRICS
)
# What the peer routers (--peers) ask of an engine besides completions: sglang-router
# and vllm-router accept a worker once GET /health answers 200; sglang-router also asks
# /server_info, /get_server_info, /model_info, /get_model_info (a 404 is fine: the
# worker registers with model "unknown") and first probes for HTTP/2 (gRPC), to which an
# HTTP/1.1 engine hangs up. llmgw itself GETs nothing but /metrics.
_HEALTH_RESP = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
_NOT_FOUND_RESP = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def _sse_chunk(i: int) -> bytes:
    ev = (
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
        b'"delta":{"content":"tok' + str(i).encode() + b' "}}]}\n\n'
    )
    return f"{len(ev):x}\r\n".encode() + ev + b"\r\n"


_SSE_CHUNKS = [_sse_chunk(i) for i in range(STREAM_EVENTS)]
_SSE_END = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
_CL = re.compile(rb"(?i)content-length:\s*(\d+)")


class UpstreamProtocol(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.t = cast(asyncio.Transport, transport)
        self.buf = b""
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            m = _CL.search(self.buf, 0, end)
            total = end + 4 + (int(m.group(1)) if m else 0)
            if len(self.buf) < total:
                return
            head, body, self.buf = self.buf[:end], self.buf[end + 4 : total], self.buf[total:]
            if head.startswith(b"GET /metrics"):
                self.t.write(_METRICS_RESP)
            elif head.startswith(b"GET /health"):
                self.t.write(_HEALTH_RESP)
            elif head.startswith(b"PRI * HTTP/2"):
                self.t.close()
                return
            elif head.startswith(b"GET "):
                self.t.write(_NOT_FOUND_RESP)
            elif b'"stream":true' in body or b'"stream": true' in body:
                asyncio.get_running_loop().create_task(self._stream())
            else:
                self.t.write(_CHAT_RESP)

    async def _stream(self) -> None:
        # One write per event, yielding in between: the router must relay a stream
        # that arrives in pieces, as an engine's does.
        self.t.write(_SSE_HEAD)
        for chunk in _SSE_CHUNKS:
            if self.t.is_closing():
                return
            self.t.write(chunk)
            await asyncio.sleep(0)
        self.t.write(_SSE_END)


def run_upstream(port: int, count: int = 1) -> None:
    """`count` minimal engines in one process; the ready line names every port."""
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        servers = [
            await loop.create_server(UpstreamProtocol, "127.0.0.1", port, backlog=4096)
            for _ in range(count)
        ]
        ports = " ".join(str(sv.sockets[0].getsockname()[1]) for sv in servers)
        print(f"upstream-ready {ports}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


# -- the floor: the least an aiohttp proxy can do --------------------------------


def run_floor(port: int, upstream_port: int) -> None:
    """A bare aiohttp pass-through (one shared session, no routing logic): what the
    router would cost if everything it adds to aiohttp were free."""
    import aiohttp
    import uvloop
    from aiohttp import web

    target = f"http://127.0.0.1:{upstream_port}"
    sess: list[aiohttp.ClientSession] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with sess[0].post(
            target + request.path, data=body, headers={"Content-Type": "application/json"}
        ) as up:
            ctype = up.headers.get("Content-Type", "application/json")
            if ctype.startswith("text/event-stream"):
                resp = web.StreamResponse(status=up.status, headers={"Content-Type": ctype})
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
            data = await up.read()
            return web.Response(status=up.status, body=data, headers={"Content-Type": ctype})

    async def main() -> None:
        sess.append(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        )
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"floor-ready {bound}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


# -- what would: a proxy on raw asyncio protocols, no HTTP framework -----------


class _RawUpstream(asyncio.Protocol):
    """One pooled upstream connection; relays one response at a time, bytes untouched."""

    def __init__(self, pool: list[_RawUpstream]) -> None:
        self.pool = pool
        self.sink: asyncio.Transport | None = None
        self.buf = b""
        self.head_done = False
        self.left = 0  # content-length bytes still to relay
        self.chunked = False
        self.t: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = cast(asyncio.Transport, transport)

    def send(self, data: bytes, sink: asyncio.Transport) -> None:
        self.sink, self.buf, self.head_done = sink, b"", False
        assert self.t is not None
        self.t.write(data)

    def data_received(self, data: bytes) -> None:
        assert self.sink is not None
        self.sink.write(data)  # relay at once; parse only to find the end
        if not self.head_done:
            self.buf += data
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            m = _CL.search(self.buf, 0, end)
            self.head_done = True
            self.chunked = m is None
            self.left = (int(m.group(1)) if m else 0) - (len(self.buf) - end - 4)
            self.buf = self.buf[end + 4 :] if self.chunked else b""
        elif self.chunked:
            self.buf += data
        else:
            self.left -= len(data)
        done = self.buf.endswith(b"0\r\n\r\n") if self.chunked else self.left <= 0
        if done:
            self.sink = None
            self.buf = b""
            self.pool.append(self)


class _RawFront(asyncio.Protocol):
    def __init__(self, pool: list[_RawUpstream], upstream_port: int) -> None:
        self.pool = pool
        self.port = upstream_port
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        m = _CL.search(self.buf, 0, end)
        total = end + 4 + (int(m.group(1)) if m else 0)
        if len(self.buf) < total:
            return
        req, self.buf = self.buf[:total], self.buf[total:]
        if self.pool:
            self.pool.pop().send(req, self.t)
        else:
            asyncio.get_running_loop().create_task(self._connect_and_send(req))

    async def _connect_and_send(self, req: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, up = await loop.create_connection(
            lambda: _RawUpstream(self.pool), "127.0.0.1", self.port
        )
        up.send(req, self.t)


def run_raw_proxy(port: int, upstream_port: int) -> None:
    import uvloop

    async def main() -> None:
        pool: list[_RawUpstream] = []
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _RawFront(pool, upstream_port), "127.0.0.1", port, backlog=4096
        )
        print(f"raw-ready {server.sockets[0].getsockname()[1]}", flush=True)
        await server.serve_forever()

    uvloop.run(main())


# -- the load generator: raw asyncio streams, keep-alive -----------------------


def _request(port: int, stream: bool) -> bytes:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "You are a terse assistant."},
                {"role": "user", "content": "Say ok."},
            ],
            "max_tokens": 4,
            "stream": stream,
        },
        separators=(",", ":"),
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:"
        + str(port).encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def _http(port: int, body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:"
        + str(port).encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


_TEXT = (
    "you are a careful assistant for the support desk of an online shop answer briefly "
    "cite the order number when one is given never invent prices or delivery dates "
    "escalate refunds above fifty euros to a human and keep a friendly tone"
)
_WORDS = _TEXT.split()


def chat_bodies(size: int, *, stream: bool, systems: int = 8, users: int = 32) -> list[bytes]:
    """Realistic chat bodies: `systems` system prompts x `users` user turns, each body
    about `size` bytes (the system prompt takes what the user turn leaves). Bodies
    sharing a system prompt share a prefix, as a real workload's do."""
    out = []
    for s in range(systems):
        for u in range(users):
            user = f"Where is my order {u * 7919 % 100000:05d}? It was due on day {u % 28 + 1}."
            body: dict[str, object] = {
                "model": MODEL,
                "messages": [
                    {"role": "system", "content": ""},
                    {"role": "user", "content": user},
                ],
                "max_tokens": 16,
                "stream": stream,
                "user": f"customer-{u}",
            }
            room = size - len(json.dumps(body, separators=(",", ":")))
            words: list[str] = [f"Desk {s}:"]
            i = s
            while len(" ".join(words)) < room:
                words.append(_WORDS[i % len(_WORDS)])
                i += 1
            body["messages"][0]["content"] = " ".join(words)[: max(room, 8)]  # type: ignore[index]
            out.append(json.dumps(body, separators=(",", ":")).encode())
    return out


async def _read_response(reader: asyncio.StreamReader) -> int:
    """Read one response; returns the number of SSE data events (0 when not a stream)."""
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"bad answer: {head[:80]!r}")
    m = _CL.search(head)
    if m:
        await reader.readexactly(int(m.group(1)))
        return 0
    events = 0
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            return events
        events += data.count(b"data: ")


async def load(
    port: int,
    *,
    concurrency: int,
    seconds: float,
    stream: bool,
    bodies: list[bytes] | None = None,
    requests: int | None = None,
) -> tuple[list[float], int]:
    """Closed loop: `concurrency` connections, each sending back to back for `seconds`
    (and, given `requests`, until that many have been sent in all).

    `bodies`: request bodies to cycle through (connection i starts at body i);
    None: the one small body of `_request`."""
    reqs = [_request(port, stream)] if bodies is None else [_http(port, b) for b in bodies]
    lat: list[float] = []
    events = 0
    stop_at = time.perf_counter() + seconds
    left = float("inf") if requests is None else requests

    async def worker(i: int) -> None:
        nonlocal events, left
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while (t0 := time.perf_counter()) < stop_at and left > 0:
                left -= 1
                writer.write(reqs[i % len(reqs)])
                i += 7
                # Not `events += await ...`: that reads `events` before the await and
                # loses the other workers' additions.
                n = await _read_response(reader)
                events += n
                lat.append(time.perf_counter() - t0)
        finally:
            writer.close()

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return lat, events


# -- processes, measurements ---------------------------------------------------


def cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


@contextlib.contextmanager
def child(cpu_list: str, *args: str) -> Iterator[tuple[int, int]]:
    """This file in another mode, pinned; yields (port from its ready line, pid)."""
    with child_ports(cpu_list, *args) as (ports, pid):
        yield ports[0], pid


@contextlib.contextmanager
def child_ports(cpu_list: str, *args: str) -> Iterator[tuple[list[int], int]]:
    """This file in another mode, pinned; yields (every port of its ready line, pid)."""
    proc = subprocess.Popen(
        ["taskset", "-c", cpu_list, sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        yield [int(w) for w in line.split()[1:]], proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def router_yaml(ports: list[int], policy: str, timeout_s: float, more: str = "") -> str:
    """The benchmark router's config: one endpoint per minimal engine, then `more`."""
    endpoints = "".join(
        f"  - {{id: up{i}, url: 'http://127.0.0.1:{p}', models: [{MODEL}]}}\n"
        for i, p in enumerate(ports)
    )
    return f"endpoints:\n{endpoints}request_timeout_s: {timeout_s:g}\npolicy: {policy}\n{more}"


@contextlib.contextmanager
def router_process(
    upstream_port: int | list[int],
    cpu: str,
    *,
    profile: Path | None,
    policy: str = "ours",
    extra: tuple[str, ...] = (),
    prefix: tuple[str, ...] = (),
) -> Iterator[tuple[int, int]]:
    """The router, ready; `prefix` goes before its command line (--scale --quota's
    cgroup join, which then execs it, so the PID is the router's)."""
    tmp = Path(tempfile.mkdtemp(prefix="router-bench-"))
    cfg = tmp / "router.yaml"
    ports = [upstream_port] if isinstance(upstream_port, int) else upstream_port
    cfg.write_text(router_yaml(ports, policy, 30, ""))
    log = (tmp / "router.log").open("w")
    if "--workers" not in extra:
        # One process on the one CPU it is pinned to (the default is one per core).
        extra = (*extra, "--workers", "1")
    cmd = [sys.executable, "-m", "llmgw", "router", "--config", str(cfg), "--port", "0", *extra]
    if profile is not None:
        cmd = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "llmgw", *cmd[3:]]
    proc = subprocess.Popen(
        [*prefix, "taskset", "-c", cpu, *cmd], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = (tmp / "router.log").read_text()
            if m := re.search(r"llmgw-ready router http://127.0.0.1:(\d+)", text):
                yield int(m.group(1)), proc.pid
                break
            if proc.poll() is not None:
                raise RuntimeError("router exited:\n" + text)
            time.sleep(0.05)
        else:
            raise RuntimeError("router not ready")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


# -- peer routers (--chat --peers): bench-only, in their own venvs ---------------

PEER_ROOT = Path.home() / ".cache" / "llmgw" / "peers"
# (package, version, policy, the module its launcher runs, its --log-level for "warn")
PEERS = (
    ("sglang-router", "0.3.2", "cache_aware", "sglang_router.launch_router", "warn"),
    ("sglang-router", "0.3.2", "round_robin", "sglang_router.launch_router", "warn"),
    ("vllm-router", "0.1.17", "round_robin", "vllm_router.launch_router", "warning"),
)
# Peers not run, and why (printed with the table).
PEER_SKIPS = {
    "vllm-router 0.1.17 (cache_aware)": "its cache_aware asks a worker to render each chat "
    "request into token ids (POST /v1/chat/completions/render) before it routes; the "
    "minimal engines have no tokenizer, so that policy cannot be measured against them",
}


def peer_python(package: str, version: str) -> Path | str:
    """The python of a venv holding `package==version` under ~/.cache/llmgw/peers/ (made
    and filled with pip on first use, never the project's venv); a reason when not."""
    venv = PEER_ROOT / f"{package}-{version}"
    py = venv / "bin" / "python"
    done = venv / ".installed"
    if done.exists() and py.exists():
        return py
    PEER_ROOT.mkdir(parents=True, exist_ok=True)
    log = PEER_ROOT / f"{package}-{version}.install.log"
    with log.open("w") as f:
        for cmd in (
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [str(py), "-m", "pip", "install", "-q", f"{package}=={version}"],
        ):
            print(f"peers: {' '.join(cmd)}", flush=True)
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                tail = log.read_text().strip().splitlines()[-3:]
                return f"`{' '.join(cmd[1:4])}` failed: " + " / ".join(tail)
    done.write_text(f"{package}=={version}\n")
    return py


def proc_shape(pid: int) -> tuple[int, int]:
    """(threads of `pid`, its child processes): what `cpu_seconds` has to cover."""
    threads = len(list(Path(f"/proc/{pid}/task").iterdir()))
    children = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    children += 1
    return threads, children


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _chat_ok(port: int) -> bool:
    """One small chat completion through `port` answers 200."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=chat_bodies(300, stream=False, systems=1, users=1)[0],
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200
    except OSError:
        return False
    finally:
        conn.close()


@contextlib.contextmanager
def peer_process(
    python: Path, module: str, log_level: str, policy: str, ports: list[int], cpu: str
) -> Iterator[tuple[int, int]]:
    """A peer router pinned like ours; yields (port, pid) once a chat request through
    it answers 200 (the peers report ready before their workers are registered)."""
    tmp = Path(tempfile.mkdtemp(prefix="peer-bench-"))
    port = free_port()
    cmd = [
        str(python), "-m", module,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--worker-urls", *(f"http://127.0.0.1:{p}" for p in ports),
        "--policy", policy,
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()),
        "--log-level", log_level,
    ]  # fmt: skip
    if module.startswith("sglang_router"):
        cmd += ["--shutdown-grace-period-secs", "1"]
    log = (tmp / "peer.log").open("w")
    proc = subprocess.Popen(["taskset", "-c", cpu, *cmd], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _chat_ok(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join((tmp / "peer.log").read_text().splitlines()[-5:])
                raise RuntimeError(f"{' '.join(cmd[2:])}: not ready:\n{tail}")
            time.sleep(0.1)
        yield port, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    """CPU of `pid` and of its live children: a router's supervisor and its workers."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def best_of(
    port: int, *, concurrency: int, seconds: float, stream: bool, repeats: int
) -> tuple[list[float], int, int]:
    """The run with the most completed requests out of `repeats`, and the total count.

    The dev machine is shared: another process landing on the router's CPU for a
    second halves one run's figures. The best run is the router's, not the noise's.
    """
    best: tuple[list[float], int] = ([], 0)
    total = 0
    for _ in range(repeats):
        lat, events = await load(port, concurrency=concurrency, seconds=seconds, stream=stream)
        total += len(lat)
        if len(lat) > len(best[0]):
            best = (lat, events)
    return best[0], best[1], total


async def measure_path(
    port: int, pid: int | None, seconds: float, repeats: int
) -> dict[str, float]:
    """Every phase against one path; CPU is counted when the path is a process of ours."""
    out: dict[str, float] = {}
    await load(port, concurrency=8, seconds=1.0, stream=False)  # warm up
    requests = 0
    cpu0 = cpu_seconds(pid) if pid else 0.0
    for conc in (1, 64, 256):
        lat, _, n = await best_of(
            port, concurrency=conc, seconds=seconds, stream=False, repeats=repeats
        )
        requests += n
        out[f"p50_ms_c{conc}"] = pct(lat, 0.5) * 1e3
        out[f"p99_ms_c{conc}"] = pct(lat, 0.99) * 1e3
        out[f"rps_c{conc}"] = len(lat) / seconds
    cpu1 = cpu_seconds(pid) if pid else 0.0
    lat, events, n = await best_of(
        port, concurrency=64, seconds=seconds, stream=True, repeats=repeats
    )
    out["events_s"] = events / seconds
    if pid:
        # CPU split by kind: a stream costs a request plus one relay step per event.
        per_req = (cpu1 - cpu0) / max(1, requests)
        out["cpu_s_per_1000"] = per_req * 1000
        out["rps_per_cpu_s"] = 1 / per_req if per_req > 0 else float("nan")
        out["cpu_ms_per_stream"] = (cpu_seconds(pid) - cpu1) / max(1, n) * 1000
        out["peak_rss_mib"] = peak_rss_mib(pid)
    return out


async def measure_chat(
    port: int, pid: int | None, seconds: float, size: int, repeats: int
) -> dict[str, float]:
    """The issue-15 figures for one path with realistic chat bodies of `size` bytes:
    CPU ms per request at c=64, req/s at c=64, p50/p99 at c=256, p50 at c=1, CPU us
    per streamed chunk (the stream phase's CPU less a request's CPU per stream), RSS."""
    out: dict[str, float] = {}
    plain = chat_bodies(size, stream=False)
    streamed = chat_bodies(size, stream=True)
    await load(port, concurrency=8, seconds=1.0, stream=False, bodies=plain)  # warm up
    lat, _ = await load(port, concurrency=1, seconds=seconds, stream=False, bodies=plain)
    out["p50_c1"] = pct(lat, 0.5) * 1e3
    best_rps, best_cpu = 0.0, float("nan")
    for _ in range(repeats):
        cpu0 = cpu_seconds(pid) if pid else 0.0
        lat, _ = await load(port, concurrency=64, seconds=seconds, stream=False, bodies=plain)
        if pid and lat:
            cpu = (cpu_seconds(pid) - cpu0) / len(lat) * 1e3
            best_cpu = cpu if best_cpu != best_cpu else min(best_cpu, cpu)
        best_rps = max(best_rps, len(lat) / seconds)
    out["cpu_ms_req"] = best_cpu
    out["rps_c64"] = best_rps
    lat, _ = await load(port, concurrency=256, seconds=seconds, stream=False, bodies=plain)
    out["p50_c256"] = pct(lat, 0.5) * 1e3
    out["p99_c256"] = pct(lat, 0.99) * 1e3
    if pid:
        cpu0 = cpu_seconds(pid)
        lat, events = await load(
            port, concurrency=64, seconds=seconds, stream=True, bodies=streamed
        )
        spent = cpu_seconds(pid) - cpu0 - len(lat) * best_cpu / 1e3
        out["cpu_us_chunk"] = spent / max(1, events) * 1e6
        out["rss_mib"] = peak_rss_mib(pid)
    return out


def policy_step(n: int = 20000) -> str:
    """`--policy-step`: the routing work of one request in-process, no sockets (µs of CPU
    per request, best of 3): body decode, the registry's snapshots of four endpoints,
    the route key (prefix chain, session), and each policy's choice plus its
    completion bookkeeping. Steadier than the end-to-end figures on a shared machine."""
    from llmgw.router import compiled

    built = compiled.load()  # before the hot modules are imported
    from llmgw.router.replicas.registry import Registry
    from llmgw.wire.endpoints import EndpointInfo

    reg = Registry()
    reg.replace(
        EndpointInfo(id=f"up{i}", url=f"http://127.0.0.1:{9000 + i}", models=(MODEL,))
        for i in range(4)
    )
    lines = [
        f"Compiled: {', '.join(built.modules)}" if built.modules else f"Python ({built.detail})",
        "",
        "| body | decode µs | 4 snapshots µs | route key µs | ours choose+served µs "
        "| round_robin choose µs |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for size in (300, 8192):
        lines.append(f"| {size} B | " + " | ".join(_policy_row(reg, size, n)) + " |")
    return "\n".join(lines)


def _policy_row(reg: Any, size: int, n: int) -> list[str]:
    import msgspec

    from llmgw.router.routing.affinity import route_key
    from llmgw.router.routing.policies import Ours, RoundRobin
    from llmgw.router.routing.prefix import PrefixIndex

    dec = msgspec.json.Decoder().decode
    bodies = chat_bodies(size, stream=False)
    docs = [dec(b) for b in bodies]
    keys = [route_key(d, None) for d in docs]
    snaps = reg.snapshots(MODEL)
    ours, rr = Ours(PrefixIndex()), RoundRobin()

    def ours_step(i: int) -> None:
        k = keys[i % len(keys)]
        d = ours.choose(snaps, k, ())
        assert d.endpoint_id is not None
        ours.served(d.endpoint_id, k, None, decision=d, cached_tokens=None)

    steps = (
        lambda i: dec(bodies[i % len(bodies)]),
        lambda i: reg.snapshots(MODEL),
        lambda i: route_key(docs[i % len(docs)], None),
        ours_step,
        lambda i: rr.choose(snaps, keys[i % len(keys)], ()),
    )
    cells = []
    for step in steps:
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()
            for i in range(n):
                step(i)
            best = min(best, (time.process_time() - t0) / n * 1e6)
        cells.append(f"{best:.1f}")
    return cells


CHAT_TARGETS = {"cpu_ms_req": 0.13, "cpu_us_chunk": 8.0}
INSTR_SECTION = "### router_overhead.py --instructions"


def count_instructions(
    ports: list[int],
    policy: str,
    size: int,
    n: int,
    env: dict[str, str],
    stream: bool = False,
    keep: Path | None = None,
    concurrency: int = 16,
) -> tuple[float, str]:
    """User-space instructions per request of a router under callgrind, and which modules
    it ran (its start-up line). Instrumented only while `n` requests run (after 300
    uninstrumented ones): start-up and warm-up are not counted; the kernel's side of the
    socket calls never is (valgrind sees user space only). `keep`: a folder to move the
    callgrind output and the router's log into (for callgrind_annotate); by default
    they are deleted. `concurrency`: requests kept in flight; what costs more the more
    are in flight (flow control's look at saturated replicas) shows only at the
    concurrency of --chat's CPU figure, 64."""
    import uvloop

    tmp = Path(tempfile.mkdtemp(prefix="router-instr-"))
    cfg = tmp / "router.yaml"
    cfg.write_text(router_yaml(ports, policy, 600))
    out = tmp / "callgrind.out"
    log_path = tmp / "router.log"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "llmgw",
        "router",
        "--config",
        str(cfg),
        "--port",
        "0",
        "--workers",
        "1",
    ]
    bodies = chat_bodies(size, stream=stream)
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 300
        port = 0
        while not port:
            text = log_path.read_text()
            if m := re.search(r"llmgw-ready router http://127.0.0.1:(\d+)", text):
                port = int(m.group(1))
            elif proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("router under valgrind did not start:\n" + text[-2000:])
            else:
                time.sleep(0.2)

        def send(requests: int) -> None:
            uvloop.run(
                load(
                    port,
                    concurrency=concurrency,
                    seconds=3600,
                    stream=stream,
                    bodies=bodies,
                    requests=requests,
                )
            )

        send(300)
        ctl = ["callgrind_control"]
        subprocess.run([*ctl, "-i", "on", str(proc.pid)], check=True, capture_output=True)
        send(n)
        subprocess.run([*ctl, "-i", "off", str(proc.pid)], check=True, capture_output=True)
        subprocess.run([*ctl, "-d", str(proc.pid)], check=True, capture_output=True)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    total = 0
    for part in tmp.glob("callgrind.out*"):
        for line in part.read_text().splitlines():
            if line.startswith("totals:"):
                total = max(total, int(line.split()[1]))
    text = log_path.read_text()
    ran = "compiled" if "compiled modules modules=" in text else "Python"
    if keep is not None:
        name = f"{policy}-{size}-{ran.lower()}{'-stream' if stream else ''}"
        keep.mkdir(parents=True, exist_ok=True)
        for part in tmp.glob("callgrind.out*"):
            shutil.move(part, keep / f"{name}.{part.name}")
        shutil.move(log_path, keep / f"{name}.router.log")
    shutil.rmtree(tmp, ignore_errors=True)
    return total / n, ran


def instructions_main(args: argparse.Namespace, others: str) -> int:
    """`--instructions`: the default policy and round_robin, compiled and Python modules,
    300 B and 8 KB chat bodies; instructions per request, which a shared machine's noise
    does not move (the same run twice agrees within 0.5 %)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("--instructions needs valgrind (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    n = args.requests
    stream = args.stream
    rows: list[str] = []
    # Streamed: the build only (a 64-event stream takes long under valgrind).
    settings = ("auto",) if stream or args.build_only else ("auto", "0")
    with child_ports(others, "--upstream", "0", "--count", "4") as (ports, _):
        for size in args.sizes:
            for policy in args.policies:
                cells = []
                for compiled_setting in settings:
                    env = {**os.environ, "LLMGW_ROUTER_COMPILED": compiled_setting}
                    per, ran = count_instructions(
                        ports, policy, size, n, env, stream, args.keep, args.concurrency
                    )
                    print(f"{policy} {size} B {ran}: {per / 1e3:,.1f} k", flush=True)
                    cells.append(f"{per / 1e3:,.1f} k ({ran})")
                rows.append(f"| {policy}, {size} B | " + " | ".join(cells) + " |")
    head = (
        ["| policy, body | instructions / streamed request (64 events), build |", "|---|---:|"]
        if stream
        else ["| policy, body | instructions / request, build |", "|---|---:|"]
        if args.build_only
        else [
            "| policy, body | instructions / request, build | instructions / request, "
            "LLMGW_ROUTER_COMPILED=0 |",
            "|---|---:|---:|",
        ]
    )
    out = "\n".join([*head, *rows])
    print(out)
    if args.build_only or args.sizes != [300, 8192] or args.policies != ["ours", "round_robin"]:
        return 0  # a partial table (one step of a round): printed, never written
    if not args.no_results and stream:
        write_results(
            f"{INSTR_SECTION} --stream\n\n"
            f"As below, with `stream: true` bodies: each request a {STREAM_EVENTS}-event "
            f"stream relayed chunk by chunk; {n} requests counted. Python "
            f"{sys.version.split()[0]}.\n\n"
            f"Command: `.venv/bin/python bench/router_overhead.py --instructions --stream"
            f" --requests {n}`\n\n{out}\n",
            section=CHAT_SECTION,
            subsection=f"{INSTR_SECTION} --stream",
        )
    elif not args.no_results:
        write_results(
            f"{INSTR_SECTION}\n\n"
            f"User-space instructions per request of one router process under valgrind's "
            f"callgrind (kernel work in the socket calls not included), four minimal "
            f"engines, {n} realistic chat requests at concurrency 16 after 300 not counted, "
            f"the same bodies as --chat. Deterministic: a shared machine's noise moves "
            f"CPU time by 10-30 % between runs and these counts by under 0.5 %. Python "
            f"{sys.version.split()[0]}.\n\n"
            f"Command: `.venv/bin/python bench/router_overhead.py --instructions"
            f"{'' if n == 2000 else f' --requests {n}'}`\n\n{out}\n",
            section=CHAT_SECTION,
            subsection=INSTR_SECTION,
        )
    return 0


def chat_table(rows: dict[str, dict[str, float]], direct: dict[int, dict[str, float]]) -> str:
    head = (
        "| router (policy, body) | CPU ms / request, c=64 | req/s, c=64 | p50 ms, c=256 "
        "| p99 ms, c=256 | p99/p50 | added p50 ms, c=1 | CPU µs / streamed chunk | RSS MB |"
    )
    lines = [head, "|---|" + "---:|" * 8]
    for name, r in rows.items():
        size = int(name.rsplit(" ", 1)[1].removesuffix("B"))
        lines.append(
            f"| {name} | {r['cpu_ms_req']:.3f} | {r['rps_c64']:,.0f} | {r['p50_c256']:.1f} "
            f"| {r['p99_c256']:.1f} | {r['p99_c256'] / r['p50_c256']:.1f}x "
            f"| {r['p50_c1'] - direct[size]['p50_c1']:.2f} | {r.get('cpu_us_chunk', 0):.1f} "
            f"| {r.get('rss_mib', 0):.0f} |"
        )
    return "\n".join(lines)


def chat_main(args: argparse.Namespace, router_cpu: str, others: str, ncpu: int) -> int:
    """`--chat`: ours vs round_robin with realistic chat bodies, four engines (issue 15)."""
    import uvloop

    sizes = (300, 8192)
    load_before = os.getloadavg()[0]
    rows: dict[str, dict[str, float]] = {}
    direct: dict[int, dict[str, float]] = {}
    # One worker unless asked: the router is pinned to one CPU here.
    extra = ("--workers", str(args.workers))
    # --peers: the Rust routers, each in the same phases on the same CPU as ours.
    peer_runs: list[tuple[str, int, tuple[Path, str, str, str]]] = []
    skipped: dict[str, str] = {}
    shape: dict[str, tuple[int, int]] = {}
    if args.peers and not args.profile:
        skipped.update(PEER_SKIPS)
        for package, version, policy, module, level in PEERS:
            py = peer_python(package, version)
            for size in sizes:
                name = f"{package} {version} ({policy}) {size}B"
                if isinstance(py, str):
                    skipped[name.rsplit(" ", 1)[0]] = py
                    print(f"peers: skipping {name}: {py}", flush=True)
                else:
                    peer_runs.append((name, size, (py, module, level, policy)))
    with child_ports(others, "--upstream", "0", "--count", "4") as (ports, _):
        up = ports[0]
        if args.profile:
            prof = Path(tempfile.mkdtemp()) / "router.prof"
            with router_process(ports, router_cpu, profile=prof) as (rt, rpid):
                print(uvloop.run(measure_chat(rt, rpid, args.seconds, args.size, 1)))
            import pstats

            pstats.Stats(str(prof)).sort_stats("tottime").print_stats(40)
            shutil.rmtree(prof.parent, ignore_errors=True)
            return 0
        for size in sizes:
            direct[size] = uvloop.run(measure_chat(up, None, args.seconds, size, 1))
        for _rep in range(args.repeats):
            for policy in ("ours", "round_robin"):
                for size in sizes:
                    with router_process(
                        ports,
                        router_cpu,
                        profile=None,
                        policy=policy,
                        extra=extra,
                    ) as (rt, rpid):
                        r = uvloop.run(measure_chat(rt, rpid, args.seconds, size, 2))
                    name = f"llmgw ({policy}) {size}B"
                    old = rows.get(name)
                    if old is None or r["cpu_ms_req"] < old["cpu_ms_req"]:
                        rows[name] = r
            for name, size, launch in peer_runs:
                try:
                    with peer_process(*launch, ports, router_cpu) as (rt, rpid):
                        r = uvloop.run(measure_chat(rt, rpid, args.seconds, size, 2))
                        shape[name.rsplit(" ", 1)[0]] = proc_shape(rpid)
                except (RuntimeError, OSError, EOFError) as e:
                    # Did not start, or failed under load: not fatal, the reason is shown.
                    skipped[name] = f"{type(e).__name__}: {e}"
                    print(f"peers: {name} failed: {skipped[name]}", flush=True)
                    continue
                old = rows.get(name)
                if old is None or r["cpu_ms_req"] < old["cpu_ms_req"]:
                    rows[name] = r
    out = chat_table(rows, direct)
    if args.peers:
        notes = [f"- {n}: pid with {t} threads, {c} child processes" for n, (t, c) in shape.items()]
        notes += [f"- {n}: not measured: {why}" for n, why in skipped.items() if n not in rows]
        out += "\n\nPeers (bench-only, venvs under ~/.cache/llmgw/peers/):\n" + "\n".join(notes)
    print(out)
    if not args.no_results:
        flags = "".join(
            f" --{k} {v:g}"
            for k, v, d in (("seconds", args.seconds, 2.0), ("repeats", args.repeats, 3))
            if v != d
        )
        peers_note = ""
        if args.peers:
            flags += " --peers"
            peers_note = (
                " Peer rows: the peer router (its own venv, bench-only) on the same CPU, "
                "same phases, `--log-level warn`; CPU from its PID (threads included)."
            )
        write_results(
            f"{CHAT_SECTION}\n\n"
            f"Realistic chat bodies (8 system prompts x 32 users, a system prompt and a user "
            f"turn, `user` set; about 300 bytes and 8 KB), four minimal engines in one "
            f"process, the router on CPU {router_cpu} (taskset), "
            f"engines and load generator on CPU(s) {others}; {ncpu} CPUs visible, load "
            f"average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after (shared "
            f"machine: short runs, treat as noisy). Each row: a fresh router per repetition "
            f"({args.repeats}), {args.seconds:g} s per phase; CPU per request is the lower "
            f"of two c=64 runs, the best repetition kept. CPU per streamed chunk: the stream "
            f"phase's CPU less one request's CPU per stream, over the events relayed "
            f"({STREAM_EVENTS} per stream).{peers_note} Python {sys.version.split()[0]}.\n\n"
            f"Command: `.venv/bin/python bench/router_overhead.py --chat{flags}`\n\n{out}\n",
            section=CHAT_SECTION,
        )
    return 0


async def measure_scale(port: int, pid: int, seconds: float, repeats: int) -> dict[str, float]:
    """Throughput at c=64 (best of `repeats`) and the router's CPU per request in it (all
    its processes), 300-byte chat bodies, the default policy."""
    plain = chat_bodies(300, stream=False)
    await load(port, concurrency=16, seconds=1.0, stream=False, bodies=plain)  # warm up
    best = {"rps": 0.0, "cpu_ms_req": float("nan")}
    for _ in range(repeats):
        cpu0 = cpu_seconds(pid)
        lat, _ = await load(port, concurrency=64, seconds=seconds, stream=False, bodies=plain)
        cpu = (cpu_seconds(pid) - cpu0) / max(1, len(lat)) * 1e3
        if len(lat) / seconds > best["rps"]:
            best = {"rps": len(lat) / seconds, "cpu_ms_req": cpu}
    return best


@contextlib.contextmanager
def cpu_quota(cpus: float) -> Iterator[tuple[str, ...]]:
    """A fresh CPU cgroup allowed `cpus` CPUs of time (CFS quota), and the command prefix
    that joins it before exec'ing the rest; removed afterwards. cgroup v2 (`cpu.max`) or
    v1 (`cpu.cfs_quota_us`); RuntimeError when neither can be written (needs root)."""
    name = f"llmgw-bench-{os.getpid()}-{time.monotonic_ns()}"
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        group = v2 / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{int(cpus * 100_000)} 100000")
    else:
        group = v2 / "cpu" / name
        try:
            group.mkdir()
        except OSError as exc:
            raise RuntimeError(f"no writable CPU cgroup under {v2}: {exc}") from exc
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(cpus * 100_000)))
    try:
        yield ("sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group))
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def scale_main(args: argparse.Namespace, all_cpus: list[int]) -> int:
    """`--scale`: `router --workers 1` on one CPU against `--workers 2` on two (issue 15).

    The engines (four, one process) and the load generator get the CPUs left; on a
    2-CPU machine none are left for them, so they share the router's second CPU and
    the 2-worker figure understates what two free cores give (the table says so)."""
    if args.quota is not None:
        return scale_quota_main(args, all_cpus)
    import uvloop

    load_before = os.getloadavg()[0]
    rows: dict[int, dict[str, float]] = {}
    for workers in (1, 2):
        router_cpus = all_cpus[:workers]
        rest = all_cpus[workers:] or all_cpus[-1:]
        others = ",".join(str(c) for c in rest)
        os.sched_setaffinity(0, set(rest))
        with child_ports(others, "--upstream", "0", "--count", "4") as (ports, _):
            for _rep in range(args.repeats):
                with router_process(
                    ports,
                    ",".join(str(c) for c in router_cpus),
                    profile=None,
                    extra=("--workers", str(workers)),
                ) as (rt, rpid):
                    r = uvloop.run(measure_scale(rt, rpid, args.seconds, 2))
                if workers not in rows or r["rps"] > rows[workers]["rps"]:
                    rows[workers] = r
    shared = len(all_cpus) < 4
    lines = [
        "| router | CPUs (router) | req/s c=64 | CPU ms / request (all processes) |",
        "|---|---|---:|---:|",
    ]
    for w, r in rows.items():
        cpus_w = ",".join(str(c) for c in all_cpus[:w])
        lines.append(f"| `--workers {w}` | {cpus_w} | {r['rps']:,.0f} | {r['cpu_ms_req']:.3f} |")
    ratio = rows[2]["rps"] / rows[1]["rps"]
    out = "\n".join(lines) + f"\n\nThroughput, 2 workers / 1: {ratio:.2f}x"
    print(out)
    if not args.no_results:
        note = (
            " The engines and the load generator had no CPU of their own: they shared the "
            "2-worker router's second CPU, so the ratio understates two free cores."
            if shared
            else ""
        )
        write_results(
            f"{SCALE_SECTION}\n\n"
            f"`llmgw router --workers 1` pinned to one CPU against `--workers 2` pinned to "
            f"two (taskset), default policy, 300-byte chat bodies, four minimal engines in "
            f"one process and the load generator (c=64: 64 keep-alive connections per run, "
            f"spread over the workers as they are accepted) on the CPUs left; {len(all_cpus)} "
            f"CPUs visible, load average "
            f"{load_before:.1f} before and {os.getloadavg()[0]:.1f} after (shared machine). "
            f"Best of {args.repeats} fresh routers x 2 runs of {args.seconds:g} s.{note}\n\n"
            f"Command: `.venv/bin/python bench/router_overhead.py --scale"
            f" --seconds {args.seconds:g} --repeats {args.repeats}`\n\n{out}\n",
            section=SCALE_SECTION,
        )
    return 0


QUOTA_HEADING = "### router_overhead.py --scale --quota"


def scale_quota_main(args: argparse.Namespace, all_cpus: list[int]) -> int:
    """`--scale --quota F`: each router worker gets F of a CPU (a CFS quota on the router's
    cgroup: F for `--workers 1` pinned to one CPU, 2F for `--workers 2` pinned to two),
    while the engines and the load generator run on every CPU without a quota. On a
    machine too small to give the generator CPUs of its own, this keeps the router the
    bottleneck in both runs, so the ratio shows how throughput follows the CPU the
    workers get; the table gives each run's router CPU use against its quota."""
    import uvloop

    quota = float(args.quota)
    load_before = os.getloadavg()[0]
    everything = ",".join(str(c) for c in all_cpus)
    os.sched_setaffinity(0, set(all_cpus))
    rows: dict[int, dict[str, float]] = {}
    with child_ports(everything, "--upstream", "0", "--count", "4") as (ports, _):
        for _rep in range(args.repeats):
            for workers in (1, 2):
                with (
                    cpu_quota(quota * workers) as prefix,
                    router_process(
                        ports,
                        ",".join(str(c) for c in all_cpus[:workers]),
                        profile=None,
                        extra=("--workers", str(workers)),
                        prefix=prefix,
                    ) as (rt, rpid),
                ):
                    cpu0, t0 = cpu_seconds(rpid), time.monotonic()
                    r = uvloop.run(measure_scale(rt, rpid, args.seconds, 2))
                    r["cpus_used"] = (cpu_seconds(rpid) - cpu0) / (time.monotonic() - t0)
                if workers not in rows or r["rps"] > rows[workers]["rps"]:
                    rows[workers] = r
    lines = [
        "| router | CPUs (router) | quota (CPUs) | req/s c=64 | router CPUs used "
        "| CPU ms / request (router) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for w, r in rows.items():
        cpus_w = ",".join(str(c) for c in all_cpus[:w])
        lines.append(
            f"| `--workers {w}` | {cpus_w} | {quota * w:.2f} | {r['rps']:,.0f} "
            f"| {r['cpus_used']:.2f} | {r['cpu_ms_req']:.3f} |"
        )
    ratio = rows[2]["rps"] / rows[1]["rps"]
    out = "\n".join(lines) + f"\n\nThroughput, 2 workers / 1: {ratio:.2f}x"
    print(out)
    if not args.no_results:
        write_results(
            f"{QUOTA_HEADING}\n\n"
            f"Each router worker held to {quota:g} of a CPU by a CFS quota on the router's "
            f"cgroup ({quota:g} CPU for `--workers 1` pinned to CPU {all_cpus[0]}, "
            f"{2 * quota:g} for `--workers 2` pinned to two), the four minimal engines and "
            f"the load generator on all {len(all_cpus)} CPUs without a quota, default "
            f"policy, 300-byte chat bodies, c=64; the two router sizes alternate, best of "
            f"{args.repeats} fresh routers each (2 runs of {args.seconds:g} s). Load average "
            f"{load_before:.1f} before and {os.getloadavg()[0]:.1f} after. The quota "
            f"stands in for a core of the router's own: router CPUs used near the quota "
            f"means the router, not the generator, set the rate.\n\n"
            f"Command: `.venv/bin/python bench/router_overhead.py --scale --quota {quota:g}"
            f" --seconds {args.seconds:g} --repeats {args.repeats}`\n\n{out}\n",
            section=SCALE_SECTION,
            subsection=QUOTA_HEADING,
        )
    return 0


TARGETS = {
    "rps_c64": (3000.0, ">="),
    "added_p50_ms_c1": (0.6, "<="),
    "events_s": (60000.0, ">="),
}


ROUTERS = ("router",)


def table(paths: dict[str, dict[str, float]]) -> str:
    """One column per path, then what the router adds to direct; targets judge it."""
    direct = paths["direct"]
    names = list(paths)
    routers = [n for n in ROUTERS if n in paths]

    def verdict(key: str, value: float) -> str:
        if key not in TARGETS:
            return ""
        target, op = TARGETS[key]
        met = value >= target if op == ">=" else value <= target
        return f"{op} {target:,.6g} {'met' if met else 'MISSED'}"

    added_heads = "".join(f" {n} added |" for n in routers)
    head = "| measure | " + " | ".join(names) + " |" + added_heads + " target (router) |"
    lines = [head, "|---|" + "---:|" * (len(names) + len(routers)) + "---|"]
    rows = [
        ("latency c=1 p50 ms", "p50_ms_c1"),
        ("latency c=1 p99 ms", "p99_ms_c1"),
        ("latency c=64 p50 ms", "p50_ms_c64"),
        ("latency c=64 p99 ms", "p99_ms_c64"),
        ("req/s c=1", "rps_c1"),
        ("req/s c=64", "rps_c64"),
        ("req/s c=256", "rps_c256"),
        ("stream events/s c=64", "events_s"),
        ("CPU s / 1,000 req (non-stream)", "cpu_s_per_1000"),
        ("req/s per CPU-second (non-stream)", "rps_per_cpu_s"),
        (f"CPU ms / {STREAM_EVENTS}-event stream", "cpu_ms_per_stream"),
        ("peak RSS MiB", "peak_rss_mib"),
    ]
    judged = routers[0] if routers else names[-1]
    for label, key in rows:
        cells = [f"{paths[n][key]:,.3f}" if key in paths[n] else "" for n in names]
        added = []
        target = verdict(key, paths[judged][key])
        for n in routers:
            if key.startswith(("p50", "p99")):
                added.append(f"{paths[n][key] - direct[key]:.3f}")
            else:
                added.append("")
        if key.startswith(("p50", "p99")):
            target = verdict("added_" + key, paths[judged][key] - direct[key]) or target
        lines.append(
            f"| {label} | " + " | ".join(cells) + " | " + " | ".join(added) + f" | {target} |"
        )
    return "\n".join(lines)


def write_results(body: str, section: str = SECTION, subsection: str | None = None) -> None:
    """Replace this benchmark's section, keeping its hand-written `###` parts (the
    first of them and all after); with `subsection`, replace (or add at the section's
    end) only that `###` part of it."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if subsection is not None and (start := text.find(section + "\n")) >= 0:
        nxt = text.find("\n## ", start + len(section))
        end = nxt if nxt >= 0 else len(text)
        sub = text.find(subsection + "\n", start, end)
        if sub >= 0:
            stop = text.find("\n### ", sub + len(subsection))
            stop = stop if 0 <= stop < end else end
            text = text[:sub] + body.rstrip("\n") + "\n" + text[stop:]
        else:
            text = text[:end].rstrip("\n") + "\n\n" + body.rstrip("\n") + "\n" + text[end:]
        RESULTS.write_text(text)
        return
    start = text.find(section + "\n")
    if start >= 0:
        nxt = text.find("\n## ", start + len(section))
        old = text[start:nxt] if nxt >= 0 else text[start:]
        keep = old.find("\n### ")
        if keep >= 0:
            body = body.rstrip("\n") + "\n\n" + old[keep + 1 :].rstrip("\n") + "\n"
        text = text[:start] + body + (text[nxt:] if nxt >= 0 else "\n")
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    RESULTS.write_text(text)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--floor", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    p.add_argument("--raw", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=2.0, help="length of one run of a phase")
    p.add_argument("--repeats", type=int, default=3, help="runs per phase; the best is kept")
    p.add_argument("--profile", action="store_true", help="cProfile the router, print top 30")
    p.add_argument("--no-results", action="store_true", help="do not touch bench/RESULTS.md")
    p.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--chat", action="store_true", help="realistic chat bodies, ours vs round_robin")
    p.add_argument(
        "--peers",
        action="store_true",
        help="--chat: also sglang-router and vllm-router (bench-only venvs under "
        "~/.cache/llmgw/peers/, made on first use)",
    )
    p.add_argument("--workers", type=int, default=1, help="--chat: router --workers N")
    p.add_argument("--scale", action="store_true", help="router --workers 1 vs 2 on 1 vs 2 CPUs")
    p.add_argument(
        "--quota",
        type=float,
        default=None,
        help="--scale: hold each router worker to this share of a CPU (cgroup CFS quota)",
    )
    p.add_argument("--policy-step", action="store_true", help="in-process routing work per request")
    p.add_argument(
        "--instructions",
        action="store_true",
        help="instructions per request under callgrind (needs valgrind)",
    )
    p.add_argument("--requests", type=int, default=2000, help="--instructions: requests counted")
    p.add_argument("--concurrency", type=int, default=16, help="--instructions: requests in flight")
    p.add_argument(
        "--stream", action="store_true", help="--instructions: streamed requests (64 events)"
    )
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[300, 8192],
        help="--instructions: body sizes (a partial table is printed, not written)",
    )
    p.add_argument(
        "--policies",
        nargs="+",
        default=["ours", "round_robin"],
        help="--instructions: policies (a partial table is printed, not written)",
    )
    p.add_argument(
        "--build-only",
        action="store_true",
        help="--instructions: the compiled build only, not LLMGW_ROUTER_COMPILED=0 too",
    )
    p.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="--instructions: keep each run's callgrind output in this folder",
    )
    p.add_argument("--size", type=int, default=300, help="--chat --profile: body bytes")
    args = p.parse_args()
    if args.upstream is not None:
        run_upstream(args.upstream, args.count)
        return 0
    if args.floor is not None:
        run_floor(*args.floor)
        return 0
    if args.raw is not None:
        run_raw_proxy(*args.raw)
        return 0
    all_cpus = cpus()
    if len(all_cpus) < 2:
        print("needs at least 2 CPUs", file=sys.stderr)
        return 2
    if args.scale:
        return scale_main(args, all_cpus)
    router_cpu = str(all_cpus[0])
    others = ",".join(str(c) for c in all_cpus[1:])
    os.sched_setaffinity(0, set(all_cpus[1:]))
    if args.policy_step:
        print(policy_step())
        return 0
    if args.instructions:
        return instructions_main(args, others)
    if args.chat:
        return chat_main(args, router_cpu, others, len(all_cpus))
    profile = Path(tempfile.mkdtemp()) / "router.prof" if args.profile else None
    import uvloop

    load_before = os.getloadavg()[0]
    paths: dict[str, dict[str, float]] = {}
    with child(others, "--upstream", "0") as (up, _):
        paths["direct"] = uvloop.run(measure_path(up, None, args.seconds, args.repeats))
        if profile is None:
            with child(router_cpu, "--floor", "0", str(up)) as (fl, fpid):
                paths["aiohttp floor"] = uvloop.run(
                    measure_path(fl, fpid, args.seconds, args.repeats)
                )
            with child(router_cpu, "--raw", "0", str(up)) as (rw, rpid):
                paths["raw asyncio"] = uvloop.run(
                    measure_path(rw, rpid, args.seconds, args.repeats)
                )
        with router_process(up, router_cpu, profile=profile) as (rt, rpid):
            paths["router"] = uvloop.run(measure_path(rt, rpid, args.seconds, args.repeats))
    out = table(paths)
    print(out)
    if profile is not None:
        import pstats

        pstats.Stats(str(profile)).sort_stats("tottime").print_stats(30)
        shutil.rmtree(profile.parent, ignore_errors=True)
    if not args.no_results and profile is None:
        flags = "".join(
            f" --{k} {v:g}"
            for k, v, d in (("seconds", args.seconds, 2.0), ("repeats", args.repeats, 3))
            if v != d
        )
        write_results(
            f"{SECTION}\n\n"
            f"Router and the two reference proxies on CPU {router_cpu} (taskset); the "
            f"raw-asyncio upstream and the load generator on CPU(s) {others}; "
            f"{len(all_cpus)} CPUs visible, load average {load_before:.1f} before and "
            f"{os.getloadavg()[0]:.1f} after (shared machine). Closed loop; each phase run "
            f"{args.repeats}× for {args.seconds:g} s per path, best run kept; small chat "
            f"bodies; streams of {STREAM_EVENTS} SSE events. Python "
            f"{sys.version.split()[0]}.\n\n"
            f"Command: `.venv/bin/python bench/router_overhead.py{flags}`\n\n{out}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
