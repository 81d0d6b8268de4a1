"""End-to-end: `llmgw up` with the real programs, the real openai client, `llmgw ctl --json`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.testing import Program, free_port, start_program, up_engine_ports
from llmgw.testing.wait import wait_until

HERE = Path(__file__).resolve().parent


@dataclass
class System:
    prog: Program
    state_dir: Path
    router_url: str
    controller_url: str
    # Every client `client()` made, closed by `stop()`: an unclosed one's sockets
    # are a ResourceWarning (an error here) whenever the collector finds them.
    clients: list[openai.OpenAI] = field(default_factory=list)

    def close_clients(self) -> None:
        for c in self.clients:
            c.close()
        self.clients.clear()

    def stop(self, *, grace_s: float = 10.0) -> int | None:
        """Close the clients made here, then stop `up` (SIGTERM, then SIGKILL)."""
        self.close_clients()
        return self.prog.stop(grace_s=grace_s)

    def manifest(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / "up.json").read_text())
        return data

    def pid(self, child: str) -> int:
        pid = self.manifest()["children"][child]["pid"]
        assert isinstance(pid, int)
        return pid

    def token_file(self, kind: str = "admin") -> Path:
        """The token `up` drew for `kind` (admin, agent, router, read), 0600."""
        return self.state_dir / "tokens" / kind

    def token(self, kind: str = "admin") -> str:
        return self.token_file(kind).read_text().strip()

    def ctl(self, *args: str, timeout_s: float = 30) -> Any:
        out = subprocess.run(
            [sys.executable, "-m", "llmgw", "ctl", "--controller", self.controller_url, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, "LLMGW_TOKEN_FILE": str(self.token_file())},
        )
        assert out.returncode == 0, f"ctl {args} failed: {out.stderr}"
        return json.loads(out.stdout) if "--json" in args else out.stdout

    def client(self) -> openai.OpenAI:
        c = openai.OpenAI(base_url=self.router_url + "/v1", api_key="e2e", max_retries=0)
        self.clients.append(c)
        return c

    def replicas(self, model: str | None = None) -> list[dict[str, Any]]:
        reps: list[dict[str, Any]] = self.ctl("replicas", "--json")
        return [r for r in reps if model is None or r["model"] == model]

    def ready(self, model: str) -> list[dict[str, Any]]:
        return [r for r in self.replicas(model) if r["state"] == "ready"]


def wait_for(pred: Callable[[], Any], *, timeout_s: float, what: str, every_s: float = 0.3) -> Any:
    """`wait_until`, where a fleet still settling (a failed look, a refused call) is "not yet"."""
    return wait_until(
        pred,
        timeout_s=timeout_s,
        what=what,
        every_s=every_s,
        ignore=(AssertionError, OSError, ValueError, KeyError, openai.OpenAIError),
    )


def start_up(tmp: Path, fleet: Path | None) -> System:
    port = free_port()
    cport = free_port()
    args = ["up", "--port", str(port), "--controller-port", str(cport), "--quiet"]
    args += ["--state-dir", str(tmp / "state"), *up_engine_ports()]
    if fleet is not None:
        args += ["--fleet", str(fleet)]
    prog = start_program(args, log_dir=tmp, ready_timeout_s=240, cwd=tmp)
    return System(
        prog=prog,
        state_dir=tmp / "state",
        router_url=f"http://127.0.0.1:{port}",
        controller_url=f"http://127.0.0.1:{cport}",
    )


def engine_pids(system: System) -> set[int]:
    pids: set[int] = set()
    for r in system.replicas():
        for s in r["shards"]:
            if s.get("pid"):
                pids.add(int(s["pid"]))
    return pids


def kill_leftovers(folder: Path) -> list[int]:
    """SIGKILL every process that runs in `folder` (where `up` was started); returns their pids.

    The safety net for a test that failed before `up` could stop its programs:
    they, and the engines their agents started, all inherit that working folder.
    """
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd == str(folder) or cwd.startswith(f"{folder}/"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@dataclass
class Load:
    """Background chat traffic through the router; counts every failure."""

    system: System
    model: str
    workers: int = 4
    stream: bool = False
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _run(self, n: int) -> None:
        client = self.system.client()
        i = 0
        while not self._stop.is_set():
            i += 1
            msgs: Any = [{"role": "user", "content": f"worker {n} request {i}"}]
            try:
                if self.stream:
                    chunks = client.chat.completions.create(
                        model=self.model, messages=msgs, max_tokens=8, stream=True, timeout=60
                    )
                    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                    assert text
                else:
                    r = client.chat.completions.create(
                        model=self.model, messages=msgs, max_tokens=8, timeout=60
                    )
                    assert r.choices[0].message.content
                self.ok += 1
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                self.failures.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> Load:
        for n in range(self.workers):
            t = threading.Thread(target=self._run, args=(n,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=90)


@pytest.fixture(scope="module")
def fault_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    tmp = tmp_path_factory.mktemp("e2e-faults")
    system = start_up(tmp, HERE / "fleet.yaml")
    try:
        yield system
    finally:
        try:
            system.stop(grace_s=60)
        finally:
            kill_leftovers(tmp)
