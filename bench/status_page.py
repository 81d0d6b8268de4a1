"""The status page at fleet scale: 2,000 nodes × 8 GPUs, 5,000 models, a real controller.

A controller process (memory store) gets the 5,000 models of controller_scale.py and
2,000 nodes heartbeating over HTTP, each reporting its desired shards ready. Then:

- GET /admin/status (the page's data) vs GET /admin/summary (what `ctl status --json`
  reads), both timed on the same controller in the same run: the ratio is the page's
  extra cost for carrying every node, model and replica;
- GET /metrics (Prometheus' scrape of the same fleet);
- headless chromium: from navigation start to the first complete picture (summary and
  every table drawn), as the page itself records it (body[data-first-render-ms]).

    .venv/bin/python bench/status_page.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from controller_scale import FABRICS, GPUS, NODES, specs
from llmgw.testing import start_program


def call(url: str, body: Any = None) -> tuple[float, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        out = resp.read()
    return time.perf_counter() - t0, out


def heartbeat(base: str, i: int, shards: dict[str, list[dict[str, Any]]]) -> None:
    name = f"node-{i:04d}"
    hb = {
        "node": name,
        "address": f"10.{i // 250}.{i % 250}.1",
        "gpus": [
            {
                "index": g,
                "uuid": f"GPU-{i}-{g}",
                "name": "H100",
                "gpu_class": "H100-80G",
                "memory_mib": 81_559,
            }
            for g in range(GPUS)
        ],
        "fabrics": [f"ib{i % FABRICS}"],
        "shards": shards.get(name, []),
        "agent_started_at": 1.0,
    }
    _, raw = call(f"{base}/v1/agents/{name}/heartbeat", hb)
    want = [
        {"replica_id": s["replica_id"], "rank": s["rank"], "state": "ready", "port": 21000 + n}
        for n, s in enumerate(json.loads(raw)["shards"])
    ]
    shards[name] = want


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tmp = Path("/tmp") / f"llmgw-bench-status-{int(time.time())}"
    prog = start_program(
        [
            "controller",
            "--port",
            "0",
            "--database",
            "memory://",
            "--tick-s",
            "0.5",
            "--heartbeat-timeout-s",
            "600",
            "--starting-deadline-s",
            "3600",
        ],
        log_dir=tmp,
    )
    try:
        base = prog.url
        shards: dict[str, list[dict[str, Any]]] = {}
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            # Nodes first (cheap while no model exists), then the models, then one round
            # that reports every placed shard ready.
            list(pool.map(lambda i: heartbeat(base, i, shards), range(NODES)))
            print(f"{NODES} nodes registered ({time.perf_counter() - t0:.0f} s)", flush=True)
            call(base + "/admin/models", [msgspec.to_builtins(s) for s in specs()])
            time.sleep(3)  # a few ticks place them
            for _ in range(2):
                list(pool.map(lambda i: heartbeat(base, i, shards), range(NODES)))
                print(f"heartbeat round ({time.perf_counter() - t0:.0f} s)", flush=True)
        setup_s = time.perf_counter() - t0
        summary = json.loads(call(base + "/admin/summary")[1])
        print(
            f"fleet: {summary['nodes']['total']} nodes, {summary['models']['total']} models, "
            f"{summary['replicas']['ready']} ready replicas (setup {setup_s:.0f} s)"
        )

        def timed(path: str) -> tuple[float, int]:
            runs = [call(base + path) for _ in range(args.repeat)]
            return statistics.median(t for t, _ in runs), len(runs[0][1])

        status_s, status_b = timed("/admin/status")
        summary_s, summary_b = timed("/admin/summary")
        metrics_s, metrics_b = timed("/metrics")
        render = browser_first_render(base + "/status", args.repeat)
        rows = [
            ("GET /admin/status (page data)", status_s * 1000, status_b),
            ("GET /admin/summary (ctl status --json, baseline)", summary_s * 1000, summary_b),
            ("GET /metrics", metrics_s * 1000, metrics_b),
        ]
        print(f"{'request':<50} {'median ms':>10} {'bytes':>10}")
        for name, t, b in rows:
            print(f"{name:<50} {t:>10.1f} {b:>10,}")
        print(f"page data / summary: {status_s / summary_s:.1f}x")
        if render is None:
            print("browser: chromium or chromium-driver missing; first render not measured")
        else:
            print(
                f"first render in headless chromium, median of {args.repeat}: "
                f"{statistics.median(render):.0f} ms (all: {', '.join(f'{r:.0f}' for r in render)})"
            )
    finally:
        prog.stop(grace_s=10)
    return 0


def browser_first_render(url: str, repeat: int) -> list[float] | None:
    chromium = shutil.which("chromium")
    if chromium is None or not Path("/usr/bin/chromedriver").exists():
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    out = []
    try:
        for _ in range(repeat):
            driver.get("about:blank")
            driver.get(url)
            WebDriverWait(driver, 30).until(
                lambda d: d.execute_script("return document.body.dataset.firstRenderMs")
            )
            out.append(float(driver.execute_script("return document.body.dataset.firstRenderMs")))
    finally:
        driver.quit()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
