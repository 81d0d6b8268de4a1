"""Real controller processes for integration tests, and agents simulated by posting heartbeats.

    with controller(db) as c:                     # `llmgw controller --port 0 …`
        c.post("/admin/models", spec("m"))
        with FakeAgents(c, {"a": 8}) as agents:   # heartbeats every 0.2 s, engines "ready"
            c.wait_for(lambda: c.endpoint_ids())

`Db` says which store a test runs on: a SQLite file, or a fresh PostgreSQL
schema (tests/integration/pg.py). Short timeouts come in through the same
flags an operator would use, so every test takes seconds.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from llmgw.ctl import main as ctl_main
from llmgw.ctl.context import Ctx
from llmgw.testing import Program, start_program
from llmgw.testing.wait import wait_until

T = TypeVar("T")

FAST = (
    "--tick-s", "0.2",
    "--heartbeat-timeout-s", "1.5",
    "--heartbeat-interval-s", "0.2",
    "--unreachable-grace-s", "2",
    "--standby-reload-s", "0.3",
    "--drain-grace-s", "2",
    "--restart-backoff-s", "0.5",
    "--shutdown-grace-s", "1",
)  # fmt: skip


@dataclass(frozen=True)
class Db:
    url: str
    schema: str | None = None

    def args(self) -> list[str]:
        out = ["--database", self.url]
        if self.schema is not None:
            out += ["--schema", self.schema]
        return out


class HttpError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class Controller:
    def __init__(self, program: Program, token: str | None) -> None:
        self.program = program
        self.token = token

    @property
    def url(self) -> str:
        return self.program.url

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | bool | None = True,
        raw: bytes | None = None,
        timeout_s: float = 10.0,
    ) -> Any:
        """JSON in and out; HttpError for statuses ≥ 400. token=True: the configured one."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = {"Content-Type": "application/json"}
        use = self.token if token is True else token
        if isinstance(use, str):
            headers["Authorization"] = f"Bearer {use}"
        req = urllib.request.Request(self.url + path, method=method, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                text = resp.read()
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            raise HttpError(exc.code, json.loads(payload) if payload else None) from None
        return json.loads(text) if text else None

    def get(self, path: str, **kw: Any) -> Any:
        return self.call("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.call("POST", path, body, **kw)

    def error(self, method: str, path: str, body: Any = None, **kw: Any) -> HttpError:
        """The error a call must fail with (fails the test if it succeeds)."""
        try:
            got = self.call(method, path, body, **kw)
        except HttpError as exc:
            return exc
        raise AssertionError(f"{method} {path} succeeded: {got}")

    def replicas(self, model: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        q = "&".join(f"{k}={v}" for k, v in (("model", model), ("state", state)) if v)
        out: list[dict[str, Any]] = self.get("/admin/replicas" + (f"?{q}" if q else ""))
        return out

    def ticks(self) -> int:
        return ticks(self.url, self.token)

    def wait_ticks(self, n: int, *, timeout_s: float = 15.0) -> None:
        wait_ticks(self.url, self.token, n, timeout_s=timeout_s)

    def endpoint_ids(self) -> list[str]:
        return [e["id"] for e in self.get("/v1/endpoints")["endpoints"]]

    def leader(self) -> bool:
        return bool(self.get("/healthz")["leader"])

    def events(self, **filters: str) -> list[str]:
        q = "&".join(f"{k}={v}" for k, v in filters.items())
        return [
            f"{e['kind']} {e['subject_id']}: {e['message']}" for e in self.get(f"/admin/events?{q}")
        ]


def wait_for(check: Callable[[], T], *, timeout_s: float = 15.0, what: str = "") -> T:
    """`wait_until`, where a controller not answering yet is "not yet"."""
    return wait_until(check, timeout_s=timeout_s, what=what, ignore=(HttpError, OSError))


def ticks(url: str, token: str | None) -> int:
    """Control-loop ticks the controller at `url` has completed (its tick histogram's count)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url + "/metrics", headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith("llmgw_controller_tick_duration_seconds_count "):
            return int(float(line.split()[1]))
    raise AssertionError("the controller's /metrics has no tick count")


def wait_ticks(url: str, token: str | None, n: int, *, timeout_s: float = 15.0) -> None:
    """Return after at least `n` whole ticks from now: the controller has had its chances
    to act on what it knows, where a fixed sleep would guess how long those take."""
    # The tick under way now, if any, completes first: it is not a whole one.
    want = ticks(url, token) + n + 1
    wait_for(lambda: ticks(url, token) >= want, timeout_s=timeout_s, what=f"{n} controller ticks")


@contextlib.contextmanager
def controller(
    db: Db, *extra: str, token: str | None = None, log_dir: Path | None = None
) -> Iterator[Controller]:
    args = ["controller", "--port", "0", *db.args(), *FAST, *extra]
    if token is not None:
        args += ["--token", token]
    program = start_program(args, log_dir=log_dir)
    try:
        yield Controller(program, token)
    finally:
        program.stop(grace_s=5)


def run_ctl(c: Controller, *argv: str) -> tuple[int, str, str]:
    """One `llmgw ctl` command in-process against `c` (real transport): its exit code,
    standard output and standard error."""
    out, err = io.StringIO(), io.StringIO()
    code = ctl_main.main(
        list(argv),
        env={"LLMGW_CONTROLLER": c.url},
        home=Path("/nonexistent"),
        base=Ctx(out=out, err=err, width=160),
    )
    return code, out.getvalue(), err.getvalue()


def spec(name: str, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "engine": "sim", "gpu_classes": ["H100-80G"]}
    out.update(kw)
    return out


def gpus(count: int) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "uuid": f"GPU-{i}",
            "name": "H100",
            "gpu_class": "H100-80G",
            "memory_mib": 81_559,
        }
        for i in range(count)
    ]


class FakeAgents:
    """Agents for some nodes, in a thread: heartbeat, and report every desired shard ready.

    Ports are stable per (replica, rank). `silence(node)` stops one node's
    heartbeats (a node that died); `fail(replica)` reports that replica failed.
    """

    def __init__(
        self, c: Controller, nodes: dict[str, int], *, interval_s: float = 0.2, ready: bool = True
    ) -> None:
        self.c = c
        self.nodes = dict(nodes)
        self.interval_s = interval_s
        self.ready = ready
        self.silenced: set[str] = set()
        self.failing: set[str] = set()
        # What a failing shard's engine printed last (the agent's log tail).
        self.log_tail: list[str] = ["boom"]
        self.replies: dict[str, list[dict[str, Any]]] = {}
        self._running: dict[str, dict[tuple[str, int], int]] = {n: {} for n in nodes}
        self._next_port = 30000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def __enter__(self) -> FakeAgents:
        """Start heartbeating (again: the same agents may move to a restarted controller)."""
        self.beat_all()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def silence(self, node: str) -> None:
        self.silenced.add(node)

    def beat_all(self) -> None:
        for node in self.nodes:
            if node not in self.silenced:
                self.beat(node)

    def beat(self, node: str) -> list[dict[str, Any]]:
        running = self._running[node]
        shards = [
            {
                "replica_id": rid,
                "rank": rank,
                "state": "failed"
                if rid in self.failing
                else ("ready" if self.ready else "starting"),
                "port": port,
                "exit_code": 3 if rid in self.failing else None,
                "log_tail": list(self.log_tail) if rid in self.failing else [],
            }
            for (rid, rank), port in sorted(running.items())
        ]
        hb = {
            "node": node,
            "address": "127.0.0.1",
            "gpus": gpus(self.nodes[node]),
            "fabrics": ["ib0"],
            "shards": shards,
            "agent_started_at": 1.0,
        }
        reply = self.c.post(f"/v1/agents/{node}/heartbeat", hb)
        desired = {(s["replica_id"], s["rank"]) for s in reply["shards"]}
        for key in list(running):
            if key not in desired:
                del running[key]
        for key in sorted(desired):
            if key not in running:
                self._next_port += 1
                running[key] = self._next_port
        self.replies[node] = reply["shards"]
        return list(reply["shards"])

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat_all()
            except (HttpError, OSError) as exc:
                # A standby or a restarting controller: retry next interval, like an agent.
                self.errors.append(str(exc))
