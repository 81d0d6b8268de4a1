"""What big whole (non-stream) answers from an engine cost one router's memory.

An engine on 127.0.0.1 (raw asyncio, in this process) answers each embeddings request
with a JSON answer of the size the request's `input` names (in MiB; 4,096 floats a
row as vLLM writes them, usage last). One router (one worker) relays: one 200 MiB
answer to a fast client; one 200 MiB answer to a client that reads 1 MiB, then
nothing for 4 s (its RSS 3 s in); ten 100 MiB answers at once. Memory from /proc:
VmRSS, and VmHWM (the process's peak).

    .venv/bin/python bench/big_answers.py [--src DIR] [--max-answer-bytes N]
        [--max-held-answer-bytes N]

`--src`: the llmgw sources the router runs (PYTHONPATH), to compare two commits.
Prints a markdown table for bench/RESULTS.md ("big_answers.py").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from llmgw.testing import start_program

MIB = 1 << 20
SIZES_MIB = (100, 200)


def embeddings(size_mib: int) -> bytes:
    row = ", ".join(["-0.012345678918063641"] * 4096)
    rows: list[str] = []
    n = 0
    while n < size_mib * MIB:
        r = f'{{"object": "embedding", "index": {len(rows)}, "embedding": [{row}]}}'
        rows.append(r)
        n += len(r) + 2
    usage = '"usage": {"prompt_tokens": 9, "total_tokens": 9}'
    return f'{{"object": "list", "data": [{", ".join(rows)}], "model": "m", {usage}}}'.encode()


class Engine:
    def __init__(self) -> None:
        self.bodies = {s: embeddings(s) for s in SIZES_MIB}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = 0
                for line in head.split(b"\r\n"):
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        n = int(v)
                req = await reader.readexactly(n)
                if not head.startswith(b"POST"):
                    writer.write(b"HTTP/1.1 404 X\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                body = self.bodies[int(json.loads(req)["input"])]
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body)
                )
                view = memoryview(body)
                for i in range(0, len(body), MIB):
                    writer.write(view[i : i + MIB])
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def mib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    raise AssertionError(key)


async def ask(session: aiohttp.ClientSession, url: str, size: int, stall_s: float = 0.0) -> int:
    body = {"model": "m", "input": str(size)}
    async with session.post(url + "/v1/embeddings", json=body) as resp:
        if stall_s:
            await resp.content.read(MIB)
            await asyncio.sleep(stall_s)
        await resp.read()
        return resp.status


async def run(src: str | None, bound: int | None, held: int | None) -> list[tuple[str, str]]:
    engine = Engine()
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    d = Path(tempfile.mkdtemp(prefix="big-answers-"))
    cfg: dict[str, Any] = {
        "endpoints": [{"id": "e0", "url": f"http://127.0.0.1:{port}", "models": ["m"]}],
        "request_timeout_s": 120,
    }
    if bound is not None:
        cfg["max_answer_bytes"] = bound
    if held is not None:
        cfg["max_held_answer_bytes"] = held
    (d / "router.yaml").write_text(yaml.safe_dump(cfg))
    argv = ["router", "--config", str(d / "router.yaml"), "--port", "0", "--workers", "1"]
    prog = start_program(argv, env={"PYTHONPATH": src} if src else None, log_dir=d)
    pid = prog.pid
    out: list[tuple[str, str]] = []
    try:
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            idle = mib(pid, "VmRSS:")
            out.append(("idle RSS", f"{idle:.0f}"))
            assert await ask(session, prog.url, 200) == 200
            out.append(("1 × 200 MiB: peak", f"{mib(pid, 'VmHWM:'):.0f}"))
            stalled = asyncio.create_task(ask(session, prog.url, 200, stall_s=4.0))
            await asyncio.sleep(3.0)
            out.append(("1 × 200 MiB, client stalled: RSS", f"{mib(pid, 'VmRSS:'):.0f}"))
            assert await stalled == 200
            statuses = await asyncio.gather(*(ask(session, prog.url, 100) for _ in range(10)))
            assert set(statuses) == {200}, statuses
            out.append(("10 × 100 MiB at once: peak", f"{mib(pid, 'VmHWM:'):.0f}"))
    finally:
        prog.stop(grace_s=5)
        server.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--src", help="the llmgw sources the router runs (PYTHONPATH)")
    ap.add_argument("--max-answer-bytes", type=int, help="the router's bound (default: its own)")
    ap.add_argument(
        "--max-held-answer-bytes", type=int, help="the router's bound on all answers held"
    )
    args = ap.parse_args()
    rows = asyncio.run(run(args.src, args.max_answer_bytes, args.max_held_answer_bytes))
    print("| router MiB | value |\n|---|---:|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
