"""Helpers for the router's integration tests: real sim-engines, a real router process.

Every process is started through `llmgw.testing.start_program` and stopped by
PID in a `finally`, even when the test fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from llmgw.testing import Program, start_program
from llmgw.testing.wait import until

MODEL = "m"


def sim_args(
    *, model: str = MODEL, speed: float = 20.0, port: int = 0, extra: Sequence[str] = ()
) -> list[str]:
    return ["sim-engine", "--port", str(port), "--model", model, "--speed", f"{speed:g}", *extra]


@contextlib.contextmanager
def sim_engines(
    log_dir: Path, speeds: Sequence[float], *, extra: Sequence[str] = (), model: str = MODEL
) -> Iterator[list[Program]]:
    """Start one sim-engine per speed; stop them all on exit."""
    progs: list[Program] = []
    try:
        for speed in speeds:
            progs.append(
                start_program(sim_args(model=model, speed=speed, extra=extra), log_dir=log_dir)
            )
        yield progs
    finally:
        for p in progs:
            p.stop(grace_s=3)


def endpoint_entries(engines: Sequence[Program], *, model: str = MODEL) -> list[dict[str, Any]]:
    return [{"id": f"e{i}", "url": p.url, "models": [model]} for i, p in enumerate(engines)]


def band_keys(keys: Mapping[str, tuple[str, str]]) -> list[dict[str, Any]]:
    """A router file's `api_keys` for name → (band, key): each its own team."""
    return [
        {
            "name": name,
            "team": name,
            "priority": band,
            "sha256": hashlib.sha256(key.encode()).hexdigest(),
        }
        for name, (band, key) in keys.items()
    ]


def write_config(path: Path, cfg: dict[str, Any]) -> Path:
    """Write the YAML file atomically (a reload never sees half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(cfg))
    tmp.replace(path)
    return path


def base_config(**over: Any) -> dict[str, Any]:
    """Test timings: fast scrapes and reloads, so tests take seconds."""
    cfg: dict[str, Any] = {
        "scrape_interval_s": 0.25,
        "scrape_timeout_s": 0.2,
        "stale_after_s": 2.0,
        "reload_poll_s": 0.1,
        "report_interval_s": 0.5,
        "request_timeout_s": 30.0,
    }
    cfg.update(over)
    return cfg


def config_path(log_dir: Path, name: str = "router") -> Path:
    return log_dir / f"{name}.yaml"


@contextlib.contextmanager
def router(
    log_dir: Path, cfg: dict[str, Any], *, name: str = "router", workers: int = 1
) -> Iterator[Program]:
    """A router on the config `cfg`, written to `config_path(log_dir, name)`.

    One process unless `workers` says otherwise: the default (one worker per core)
    would make a test's behaviour depend on the machine it runs on."""
    path = write_config(config_path(log_dir, name), cfg)
    argv = ["router", "--config", str(path), "--port", "0", "--workers", str(workers)]
    prog = start_program(argv, log_dir=log_dir)
    try:
        yield prog
    finally:
        prog.stop(grace_s=5)


def get_json(url: str, *, headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def admin_endpoints(router_url: str) -> dict[str, Any]:
    doc: dict[str, Any] = get_json(router_url + "/admin/endpoints")
    return doc


def snapshot(router_url: str, endpoint_id: str) -> dict[str, Any]:
    """One endpoint's snapshot from /admin/endpoints, with its prefix-index entry count."""
    doc = admin_endpoints(router_url)
    for snap in doc["endpoints"]:
        if snap["info"]["id"] == endpoint_id:
            return {**snap, "prefix_entries": doc["prefix_entries"].get(endpoint_id, 0)}
    raise KeyError(endpoint_id)


async def wait_until_scraped(router_url: str, ids: Sequence[str], timeout_s: float = 15) -> None:
    """Until every endpoint in `ids` has figures (the scheduler sees real load)."""

    def scraped() -> bool:
        snaps = admin_endpoints(router_url)
        seen = {s["info"]["id"] for s in snaps["endpoints"] if s["stats"] is not None}
        return set(ids) <= seen

    await until(scraped, timeout_s=timeout_s, blocking=True, what=f"endpoints {ids} scraped")


def chat_body(
    content: str | list[dict[str, str]],
    *,
    max_tokens: int = 8,
    stream: bool = False,
    model: str = MODEL,
) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": stream,
        # vLLM's extension: generate exactly max_tokens, so request lengths (and so
        # load) do not depend on when the sim-engine happens to emit its stop token.
        "ignore_eos": True,
    }
    return body


class Reply:
    """What one request through the router came back with."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def endpoint(self) -> str | None:
        return self.headers.get("x-llmgw-endpoint")

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[str]:
        """The `data:` payloads of an SSE body, in order."""
        return [
            line[len("data: ") :]
            for line in self.body.decode().split("\n")
            if line.startswith("data: ")
        ]


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any] | bytes,
    *,
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
) -> Reply:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    async with session.post(url + path, data=data, headers=hdrs) as resp:
        payload = await resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, payload)
