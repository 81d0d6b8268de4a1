"""What ten concurrent big refused bodies cost one sim-engine: its peak and what is left.

For each body shape (about 7.9 MB, every one past the 8,192-token context), one fresh
sim-engine gets one small request, then ten copies of the body at once on ten
connections; all must be refused (400). Memory comes from /proc: VmRSS before, VmHWM
(the process's peak) and VmRSS after.

    .venv/bin/python bench/sim_refusals.py

Prints a markdown table for bench/RESULTS.md ("sim_refusals.py").
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from pathlib import Path

from llmgw.testing import start_program

N = 7_900_000
SHAPES = {
    "chat, one long message": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "abcd" * (N // 4)}]},
    ),
    "chat, many short messages": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "a"}] * (N // 32)},
    ),
    "completion, token ids": ("/v1/completions", {"model": "m", "prompt": [1000] * (N // 6)}),
    "embeddings, many inputs": ("/v1/embeddings", {"model": "m", "input": ["ab"] * (N // 6)}),
}


def mib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError(field)


def status_of(port: int, data: bytes) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return int(out.split(b" ", 2)[1])


def _send(port: int, data: bytes, statuses: list[int]) -> None:
    statuses.append(status_of(port, data))  # list.append is atomic


def post(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as logs:
        for shape, (path, doc) in SHAPES.items():
            data = post(path, json.dumps(doc).encode())
            args = ["sim-engine", "--port", "0", "--model", "m"]
            with start_program(args, log_dir=Path(logs)) as sim:
                assert status_of(sim.port, post("/v1/completions", b'{"model":"m","prompt":"hi"}'))
                before = mib(sim.pid, "VmRSS")
                statuses: list[int] = []
                send = (sim.port, data, statuses)
                threads = [threading.Thread(target=_send, args=send) for _ in range(10)]
                t0 = time.monotonic()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                took = time.monotonic() - t0
                refused = sum(s == 400 for s in statuses)
                row = (shape, len(data), before, mib(sim.pid, "VmHWM"), mib(sim.pid, "VmRSS"))
                rows.append((*row, refused, took))
    head = (
        "| body (x10 at once) | bytes each | RSS before MiB | peak MiB | RSS after MiB | 400s | s |"
    )
    print(head)
    print("|---|---:|---:|---:|---:|---:|---:|")
    for shape, size, before, peak, after, refused, took in rows:
        print(f"| {shape} | {size:,} | {before} | {peak} | {after} | {refused}/10 | {took:.1f} |")


if __name__ == "__main__":
    main()
