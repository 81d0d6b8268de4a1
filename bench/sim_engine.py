"""How many concurrent streams one sim-engine process holds on one core, timing intact.

For each concurrency level N, N streaming chat requests (distinct ~100-token
prompts, 64 output tokens, ignore_eos) are sent at once to one sim-engine
pinned to one core (the client runs on another). The same workload, with the
arrival times the engine reported (x-llmgw-sim-arrival), is replayed offline through the engine's
own pure scheduler and timing model (`Scheduler`, `TimingModel`): that replay
is what the configured model predicts. The level passes when the measured mean
time to first token and mean time per output token are both within 5% of the
prediction. Engine CPU use comes from /proc.

    .venv/bin/python bench/sim_engine.py [--levels 100,500,1000,2000,4000] [--speeds 2,4]
        [--speed-streams 1000] [--write]

The speed-1 levels answer the question as asked (the model's own pace caps the
token rate: at most max_num_seqs sequences decode at once); the faster runs
push more tokens per second through the same process to show where one core
stops keeping up.

`--write` replaces this benchmark's section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from llmgw.simengine.app import ARRIVAL_HEADER
from llmgw.simengine.batcher import Scheduler, SimRequest
from llmgw.simengine.kvcache import KVCache
from llmgw.simengine.stats import EngineStats
from llmgw.simengine.timing import TimingModel, default_num_gpu_blocks
from llmgw.simengine.tokenizer import chat_prompt_ids
from llmgw.testing import start_program

OUTPUT_TOKENS = 64
TOLERANCE = 0.05
MAX_NUM_SEQS = 1024
MAX_BATCHED = 8192
BLOCK_SIZE = 16
ROOT = Path(__file__).resolve().parents[1]


def body(run: int, i: int) -> dict[str, object]:
    # Run and index first, so no two prompts (of this or an earlier level) share a block.
    text = f"{run:03d}/{i:06d} " + "please summarise the following text about engines. " * 8
    return {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }


@dataclass
class Result:
    sent_s: float  # when the engine took the request in (its x-llmgw-sim-arrival header)
    first_s: float = -1.0
    last_s: float = -1.0
    tokens: int = 0


async def one(session: aiohttp.ClientSession, url: str, run: int, i: int, t0: float) -> Result:
    res = Result(sent_s=-1.0)
    async with session.post(url + "/v1/chat/completions", json=body(run, i)) as r:
        # Same host, same CLOCK_MONOTONIC: the engine's arrival time is comparable to ours.
        res.sent_s = float(r.headers[ARRIVAL_HEADER]) - t0
        async for line in r.content:
            # Content chunks carry `"content":"<4 chars per token>"`; the role chunk is empty.
            k = line.find(b'"content":"')
            if k < 0:
                continue
            end = line.find(b'"', k + 11)
            n = (end - k - 11) // 4
            if n <= 0:
                continue
            now = time.monotonic() - t0
            if res.first_s < 0:
                res.first_s = now
            res.last_s = now
            res.tokens += n
    return res


def predict(
    run: int, arrivals: list[float], timing: TimingModel, num_blocks: int
) -> list[SimRequest]:
    """Replay the workload through the engine's own scheduler in virtual time."""
    kv = KVCache(num_gpu_blocks=num_blocks, block_size=BLOCK_SIZE)
    s = Scheduler(
        kv=kv,
        stats=EngineStats({}),
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_BATCHED,
        max_model_len=8192,
    )
    reqs = []
    order = sorted(range(len(arrivals)), key=arrivals.__getitem__)
    for i in order:
        ids = chat_prompt_ids(body(run, i)["messages"])  # type: ignore[arg-type]
        reqs.append(
            SimRequest(
                str(i),
                ids,
                arrival_s=arrivals[i],
                max_tokens=OUTPUT_TOKENS,
                seed=i,
                ignore_eos=True,
            )
        )
    t, k = 0.0, 0
    while k < len(reqs) or s.has_work():
        while k < len(reqs) and reqs[k].arrival_s <= t:
            s.add(reqs[k])
            k += 1
        plan = s.schedule(t)
        if not plan.scheduled:
            t = reqs[k].arrival_s  # idle until the next arrival
            continue
        t += timing.step_s(prefill_tokens=plan.prefill_tokens, decode_seqs=plan.decode_seqs)
        s.finish_step(plan, t)
    return reqs


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(pid: int, cpu: int) -> str:
    if shutil.which("taskset"):
        cmd = ["taskset", "-a", "-p", "-c", str(cpu), str(pid)]
        subprocess.run(cmd, check=True, capture_output=True)
        return f"taskset cpu {cpu}"
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(pid, {cpu})
        return f"sched_setaffinity cpu {cpu}"
    return "not pinned"


async def level(
    url: str, pid: int, run: int, n: int, timing: TimingModel, blocks: int
) -> dict[str, float]:
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        cpu0, wall0 = cpu_seconds(pid), time.monotonic()
        t0 = time.monotonic()
        results = await asyncio.gather(*(one(session, url, run, i, t0) for i in range(n)))
        wall = time.monotonic() - wall0
        cpu = cpu_seconds(pid) - cpu0
        async with session.get(url + "/sim/state") as r:
            state = await r.json()
    bad = [r for r in results if r.tokens != OUTPUT_TOKENS]
    predicted = predict(run, [r.sent_s for r in results], timing, blocks)
    by_id = {int(p.req_id): p for p in predicted}
    m_ttft = statistics.fmean(r.first_s - r.sent_s for r in results)
    m_tpot = statistics.fmean((r.last_s - r.first_s) / (r.tokens - 1) for r in results)
    p_ttft = statistics.fmean(p.first_token_s - p.arrival_s for p in predicted)  # type: ignore[operator]
    p_tpot = statistics.fmean(
        (p.last_token_s - p.first_token_s) / (p.num_output - 1)  # type: ignore[operator]
        for p in by_id.values()
    )
    return {
        "n": n,
        "speed": timing.speed,
        "tok_s": sum(r.tokens for r in results) / wall,
        "incomplete": len(bad),
        "ttft_ms": m_ttft * 1e3,
        "ttft_pred_ms": p_ttft * 1e3,
        "ttft_err": m_ttft / p_ttft - 1,
        "tpot_ms": m_tpot * 1e3,
        "tpot_pred_ms": p_tpot * 1e3,
        "tpot_err": m_tpot / p_tpot - 1,
        "wall_s": wall,
        "cpu": cpu / wall,
        "lag_resets": state["lag_resets"],
    }


def within(r: dict[str, float]) -> bool:
    ok = abs(r["ttft_err"]) <= TOLERANCE and abs(r["tpot_err"]) <= TOLERANCE
    return ok and not r["incomplete"]


def table(rows: list[dict[str, float]]) -> str:
    head = (
        "| streams | speed | tokens/s | TTFT ms (model) | err | TPOT ms (model) | err | "
        "engine CPU | timeline slips | within 5% |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|\n"
    )
    lines = []
    for r in rows:
        ok = within(r)
        lines.append(
            f"| {r['n']:.0f} | {r['speed']:g} | {r['tok_s']:.0f} | "
            f"{r['ttft_ms']:.0f} ({r['ttft_pred_ms']:.0f}) | "
            f"{r['ttft_err']:+.1%} | {r['tpot_ms']:.1f} ({r['tpot_pred_ms']:.1f}) | "
            f"{r['tpot_err']:+.1%} | {r['cpu']:.0%} | {r['lag_resets']:.0f} | "
            f"{'yes' if ok else 'NO'} |"
        )
    return head + "\n".join(lines) + "\n"


NOTE = (
    "Reading: at speed 1 the model's own pace bounds the token rate (at most 1024 sequences "
    "decode per step), so streams beyond that wait in the engine's queue, as in vLLM; the "
    "speed-N rows push N times the tokens per second through the same single-core process. "
    "'engine CPU' is CPU time used over wall time; 'timeline slips' counts the times the "
    "process fell more than 5 s behind the simulated timeline."
)


def write_results(text: str) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    header = "## sim_engine.py"
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    start = old.find(header)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        nxt = old.find("\n## ", start + len(header))
        rest = old[nxt + 1 :] if nxt >= 0 else ""
        new = old[:start] + text + ("\n" + rest if rest else "")
    path.write_text(new.rstrip("\n") + "\n")


async def sweep(
    speed: float, levels: list[int], rows: list[dict[str, float]], first_run: int
) -> str:
    """Run `levels` against one engine at `speed`; returns how it was pinned."""
    timing = TimingModel(speed=speed)
    blocks = default_num_gpu_blocks(block_size=BLOCK_SIZE)
    prog = start_program(
        ["sim-engine", "--port", "0", "--model", "m", "--grace-s", "1", "--speed", str(speed)]
    )
    try:
        how = pin(prog.pid, 0)
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {1})
        for run, n in enumerate(levels, start=first_run):
            rows.append(await level(prog.url, prog.pid, run, n, timing, blocks))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        prog.stop()
    return how


async def main_async(
    levels: list[int], speeds: list[float], speed_streams: int, write: bool, argv: list[str]
) -> int:
    rows: list[dict[str, float]] = []
    load_before = os.getloadavg()[0]
    how = await sweep(1.0, levels, rows, 0)
    for k, speed in enumerate(speeds):
        await sweep(speed, [speed_streams], rows, len(levels) + k)
    out = table(rows)
    print()
    print(out)
    at_1 = [f"{r['n']:.0f}" for r in rows if r["speed"] == 1.0 and within(r)]
    fastest = [r["tok_s"] for r in rows if within(r)]
    summary = "Speed-1 levels within 5%: " + (", ".join(at_1) or "none") + " streams"
    if fastest:
        summary += f"; highest delivery rate within 5%: {max(fastest):.0f} tokens/s"
    print(summary)
    if write:
        cmd = "python " + " ".join(["bench/sim_engine.py", *argv])
        write_results(
            "## sim_engine.py\n\n"
            f"Command: `{cmd}` ({platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}; engine {how}, client on another core; "
            f"Llama-3-8B/H100 defaults (max_num_seqs {MAX_NUM_SEQS}); ~100-token prompts, "
            f"{OUTPUT_TOKENS} output tokens, all N sent at once; prediction = the engine's own "
            "arrival times replayed through its scheduler and timing model; the machine was "
            f"shared with other work: 1-minute load average {load_before:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} at the end).\n\n"
            + out
            + "\n"
            + summary
            + ".\n\n"
            + NOTE
            + "\n"
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", default="100,500,1000,2000,4000", help="streams at speed 1")
    p.add_argument("--speeds", default="2,4", help="faster runs, to find the CPU limit")
    p.add_argument("--speed-streams", type=int, default=1000, help="streams in the faster runs")
    p.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    speeds = [float(x) for x in args.speeds.split(",") if x]
    return asyncio.run(main_async(levels, speeds, args.speed_streams, args.write, sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
