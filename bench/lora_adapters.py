"""LoRA adapters as models: 50 adapters of one base on two replicas vs the base alone.

Fleet
    Two real `llmgw sim-engine` processes at speed 1 (Llama-3-8B/H100 timings),
    started with the LoRA flags the agent renders for a base with 50 adapters
    (`llmgw.agent.adapters.start_args`: `--enable-lora --max-loras 8
    --max-cpu-loras 50 --lora-modules ...`), and one real `llmgw router` (one
    worker, default policy) whose endpoints list the base and the 50 adapters,
    as the controller lists a replica whose agent reported them loaded. With
    `--fleet controller` the same replicas are placed by a real controller and
    started by a real agent (two fake H100s) from a base spec and 50 adapter
    specs, and the router follows the controller's endpoint list. Everything is
    restarted before every run, so each starts empty.

Workload (seeded; the same arrivals and prompts in every run)
    Open-loop Poisson arrivals at `--rate` requests/s for `--seconds`; each a
    streaming chat request with a distinct ~`--prompt-tokens`-token prompt and
    `--max-tokens` output tokens (`ignore_eos`). Runs:
      base       every request names the base
      adapters   each names one of the 50 adapters, uniformly at random
      cold       as `adapters`, without the warm-up below
    `base` and `adapters` first send one request per adapter to each engine
    directly (not measured), so `adapters` measures serving with the adapters
    loaded; `cold` shows what reading them in on first use adds (the sim-engine
    waits `--lora-load-ms` per adapter per engine, docs/sleep-and-adapters.md).

Measured: time to first token (first content chunk) at the client, p50/p99 over
the samples of `--repeat` rounds (the runs interleaved, so a busy moment of the
machine does not fall on one run only); errors. Target (issue 31): adapters' p99
TTFT within 1.2x of the base alone.

Command: `.venv/bin/python bench/lora_adapters.py [--fleet controller]` (about five
minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from llmgw.agent.adapters import start_args
from llmgw.testing import Program, start_program
from llmgw.wire.agent import ShardSpec

BASE = "base"


@dataclass
class Result:
    sent_s: float
    first_s: float | None = None
    error: str | None = None


def adapters(n: int) -> dict[str, str]:
    return {f"ad-{i:02d}": f"/adapters/ad-{i:02d}" for i in range(n)}


def engine_args(n_adapters: int, load_ms: float) -> list[str]:
    shard = ShardSpec(
        replica_id="bench",
        rank=0,
        model=BASE,
        served_names=(BASE,),
        engine="sim",
        gpu_indices=(0,),
        adapters=adapters(n_adapters),
    )
    flags = start_args(shard, {})
    return [
        "sim-engine",
        "--port",
        "0",
        "--model",
        BASE,
        "--speed",
        "1",
        "--lora-load-ms",
        f"{load_ms:g}",
        *flags,
    ]


def prompt(rng: random.Random, tokens: int) -> str:
    # The sim tokenizer counts about one token per word.
    return " ".join(f"w{rng.randrange(100_000)}" for _ in range(tokens))


def body(model: str, text: str, max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()


async def stream_one(
    session: aiohttp.ClientSession, url: str, data: bytes, res: Result, key: str = ""
) -> None:
    loop = asyncio.get_running_loop()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        async with session.post(url, data=data, headers=headers) as resp:
            if resp.status != 200:
                res.error = f"http {resp.status}"
                await resp.read()
                return
            async for line in resp.content:
                if res.first_s is None and line.startswith(b"data: {") and b'"content":"' in line:
                    res.first_s = loop.time()
    except (aiohttp.ClientError, TimeoutError) as exc:
        res.error = type(exc).__name__


class Fleet:
    def __init__(self, log_dir: Path, n_adapters: int, load_ms: float) -> None:
        self.log_dir = log_dir
        self.n = n_adapters
        self.load_ms = load_ms
        self.engines: list[Program] = []
        self.router: Program | None = None

    def targets(self) -> list[tuple[str, str]]:
        """(engine URL, its key) of each replica."""
        return [(p.url, "") for p in self.engines]

    def start(self, run: str) -> str:
        self.engines = [
            start_program(engine_args(self.n, self.load_ms), log_dir=self.log_dir) for _ in range(2)
        ]
        names = [BASE, *adapters(self.n)]
        eps = [{"id": f"e{i}", "url": p.url, "models": names} for i, p in enumerate(self.engines)]
        cfg = self.log_dir / f"router-{run}.json"
        cfg.write_text(
            json.dumps({"endpoints": eps, "scrape_interval_s": 0.5, "scrape_timeout_s": 0.4})
        )
        self.router = start_program(
            ["router", "--config", str(cfg), "--port", "0", "--workers", "1"],
            log_dir=self.log_dir,
        )
        return self.router.url

    def stop(self) -> None:
        for p in [*self.engines, *([self.router] if self.router else [])]:
            p.stop(grace_s=3)
        self.engines, self.router = [], None


class ControllerFleet(Fleet):
    """The same replicas placed by a real controller and started by a real agent (two
    fake H100s), the router following the controller's endpoint list: the adapters
    reach the engines as the agent renders them, and the router as the agent reports
    them loaded."""

    TOKEN = "bench-token"

    def __init__(self, log_dir: Path, n_adapters: int, load_ms: float) -> None:
        super().__init__(log_dir, n_adapters, load_ms)
        self.procs: list[Program] = []
        self.endpoints: list[dict[str, Any]] = []

    def targets(self) -> list[tuple[str, str]]:
        return [(str(e["url"]), str(e.get("api_key", ""))) for e in self.endpoints]

    def _call(self, url: str, body: object = None) -> Any:
        req = urllib.request.Request(
            url,
            data=None if body is None else json.dumps(body).encode(),
            method="GET" if body is None else "POST",
            headers={"Authorization": f"Bearer {self.TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def start(self, run: str) -> str:
        d = self.log_dir / run
        ctrl = start_program(
            [
                "controller",
                "--port",
                "0",
                "--database",
                f"sqlite:///{d}.db",
                "--token",
                self.TOKEN,
                "--tick-s",
                "0.2",
                "--heartbeat-interval-s",
                "0.3",
            ],
            log_dir=self.log_dir,
        )
        self.procs.append(ctrl)
        lo = random.randrange(30000, 60000, 50)
        self.procs.append(
            start_program(
                [
                    "agent",
                    "--controller",
                    ctrl.url,
                    "--token",
                    self.TOKEN,
                    "--node",
                    "n1",
                    "--gpus",
                    "2xH100-80G",
                    "--address",
                    "127.0.0.1",
                    "--port-range",
                    f"{lo}-{lo + 49}",
                    "--state-dir",
                    str(d / "state"),
                    "--interval-s",
                    "0.3",
                    "--port",
                    "0",
                    "--stop-engines-on-exit",
                    "--stop-grace-s",
                    "3",
                ],
                log_dir=self.log_dir,
            )
        )
        base = {
            "name": BASE,
            "engine": "sim",
            "gpu_classes": ["H100-80G"],
            "min_replicas": 2,
            "max_replicas": 2,
            "args": ["--speed", "1", "--lora-load-ms", f"{self.load_ms:g}"],
        }
        lora = [{"name": n, "adapter_of": BASE, "source": p} for n, p in adapters(self.n).items()]
        self._call(f"{ctrl.url}/admin/models", [base, *lora])
        want = {BASE, *adapters(self.n)}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = self._call(f"{ctrl.url}/v1/endpoints")
            self.endpoints = list(got["endpoints"])
            if len(self.endpoints) == 2 and all(want <= set(e["models"]) for e in self.endpoints):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"replicas not serving every adapter: {self.endpoints}")
        cfg = self.log_dir / f"router-{run}.json"
        cfg.write_text(
            json.dumps(
                {
                    "controller": {"url": ctrl.url, "token": self.TOKEN, "poll_timeout_s": 2.0},
                    "scrape_interval_s": 0.5,
                    "scrape_timeout_s": 0.4,
                }
            )
        )
        self.router = start_program(
            ["router", "--config", str(cfg), "--port", "0", "--workers", "1"],
            log_dir=self.log_dir,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{self.router.url}/v1/models", timeout=5) as resp:
                if want <= {m["id"] for m in json.loads(resp.read())["data"]}:
                    return self.router.url
            time.sleep(0.2)
        raise RuntimeError("the router did not learn the adapters")

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop(grace_s=3)
        # The agent stops its engines on exit; then the controller.
        for p in reversed(self.procs):
            p.stop(grace_s=10)
        self.procs, self.router, self.endpoints = [], None, []


async def warm_up(session: aiohttp.ClientSession, fleet: Fleet) -> None:
    """One request per adapter to each engine, straight to it: every adapter loaded."""
    jobs = []
    for url, key in fleet.targets():
        for name in adapters(fleet.n):
            res = Result(sent_s=0.0)
            data = body(name, "hi", 1)
            jobs.append(stream_one(session, f"{url}/v1/chat/completions", data, res, key))
    await asyncio.gather(*jobs)


async def run(args: argparse.Namespace, fleet: Fleet, kind: str) -> list[float | None]:
    """One run on fresh engines: each request's TTFT in ms (None: it failed)."""
    url = fleet.start(kind) + "/v1/chat/completions"
    try:
        rng = random.Random(args.seed)
        names = list(adapters(fleet.n))
        schedule: list[tuple[float, bytes]] = []
        t = 0.0
        while True:
            t += rng.expovariate(args.rate)
            if t >= args.seconds:
                break
            text = prompt(rng, args.prompt_tokens)
            pick = rng.choice(names)
            model = BASE if kind == "base" else pick
            schedule.append((t, body(model, text, args.max_tokens)))
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            if kind != "cold":
                await warm_up(session, fleet)
            loop = asyncio.get_running_loop()
            start = loop.time() + 0.5
            results: list[Result] = []
            tasks = []
            for at, data in schedule:
                await asyncio.sleep(max(0.0, start + at - loop.time()))
                res = Result(sent_s=loop.time())
                results.append(res)
                tasks.append(asyncio.create_task(stream_one(session, url, data, res)))
            await asyncio.gather(*tasks)
        return [
            (r.first_s - r.sent_s) * 1000 if r.first_s is not None and not r.error else None
            for r in results
        ]
    finally:
        fleet.stop()


def summary(samples: list[float | None]) -> dict[str, float]:
    ttft = sorted(x for x in samples if x is not None)
    return {
        "requests": len(samples),
        "errors": len(samples) - len(ttft),
        "p50": statistics.median(ttft),
        "p99": ttft[min(len(ttft) - 1, int(len(ttft) * 0.99))],
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--adapters", type=int, default=50)
    p.add_argument("--rate", type=float, default=20.0, help="requests/s, Poisson")
    p.add_argument("--seconds", type=float, default=30.0, help="per run")
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--lora-load-ms", type=float, default=50.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", default="base,adapters,cold")
    p.add_argument(
        "--repeat", type=int, default=3, help="rounds of the runs, interleaved; samples pooled"
    )
    p.add_argument(
        "--fleet",
        choices=("static", "controller"),
        default="static",
        help="static: engines and a router on a file; controller: a controller and an agent",
    )
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        kind_of = ControllerFleet if args.fleet == "controller" else Fleet
        fleet = kind_of(Path(tmp), args.adapters, args.lora_load_ms)
        pooled: dict[str, list[float | None]] = {}
        for round_ in range(args.repeat):
            for kind in args.runs.split(","):
                t0 = time.monotonic()
                got = asyncio.run(run(args, fleet, kind))
                pooled.setdefault(kind, []).extend(got)
                took = time.monotonic() - t0
                print(f"round {round_ + 1} {kind}: {summary(got)} ({took:.0f} s)", flush=True)
        out = {kind: summary(samples) for kind, samples in pooled.items()}
    print("| run | requests | errors | TTFT p50 ms | TTFT p99 ms | p99 vs base |")
    print("|---|---:|---:|---:|---:|---:|")
    base = out.get("base", {}).get("p99")
    for kind, r in out.items():
        ratio = f"{r['p99'] / base:.2f}x" if base else "-"
        print(
            f"| {kind} | {r['requests']:.0f} | {r['errors']:.0f} | {r['p50']:.1f} | "
            f"{r['p99']:.1f} | {ratio} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
