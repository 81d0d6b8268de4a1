"""Start a real `llmgw` program on 127.0.0.1, wait until it is ready, stop it by PID.

The program is started with `--port 0` (or a given port); it prints
`llmgw-ready <name> http://host:port` once bound (runtime.serve), and this
helper reads that line from the program's log file. Reading a file rather than
a pipe means a chatty child can never block on a full pipe buffer.

Only processes started here are ever signalled, by PID (never by name).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from llmgw.runtime.serve import READY_PREFIX


def free_port() -> int:
    """A port free right now on 127.0.0.1 (racy by nature; prefer `--port 0`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def up_engine_ports() -> list[str]:
    """`llmgw up`'s engine ports for this test process: 1,000 of its own per pytest-xdist
    worker, under the kernel's ephemeral ports and clear of up's default (21000), so ups
    in parallel test processes never race each other for an engine's port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    n = int(worker) % 10 if worker.isdigit() else 0
    return ["--engine-ports", str(22000 + 1000 * n)]


class ProgramFailed(RuntimeError):
    """The program exited or never became ready; the message carries its log tail."""


class Program:
    """A running child program. Use as a context manager, or call `stop()`."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, argv: Sequence[str]) -> None:
        self.proc = proc
        self.log_path = log_path
        self.argv = list(argv)
        self.url = ""
        self.port = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_ready(self, *, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.log_text().splitlines():
                if line.startswith(READY_PREFIX):
                    self.url = line.split()[-1]
                    self.port = int(self.url.rsplit(":", 1)[1])
                    return self.url
            if self.proc.poll() is not None:
                raise ProgramFailed(
                    f"{self.argv} exited with {self.proc.returncode} before ready:\n"
                    + self.log_tail()
                )
            time.sleep(0.02)
        raise ProgramFailed(f"{self.argv} not ready after {timeout_s}s:\n" + self.log_tail())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the program (its own process group too, so its children die with it)."""
        self._signal_group(signal.SIGKILL)
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, *, grace_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to grace_s, then SIGKILL; returns the exit code."""
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        # Anything the program left in its own process group goes too.
        self._signal_group(signal.SIGKILL)
        return self.proc.returncode

    def __enter__(self) -> Program:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def llmgw_argv(*args: str, python: str | None = None) -> list[str]:
    """argv that runs the llmgw CLI of this interpreter, or of `python` (no reliance on PATH)."""
    return [python or sys.executable, "-m", "llmgw", *args]


def start_program(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
    ready_timeout_s: float = 30.0,
    wait: bool = True,
    cwd: Path | None = None,
    prefix: Sequence[str] = (),
    python: str | None = None,
) -> Program:
    """Start `llmgw <args>` in a new process group and (by default) wait until it is ready.

    Pass `--port 0` in args to let the program pick a free port; `Program.url`
    and `Program.port` are read back from its ready line. `prefix` runs it
    through a command that execs it in place (`ip netns exec NS`), so the PID
    is still the program's own. `python`: another interpreter's llmgw (an installed
    wheel's, say) instead of this one's, without this process's PYTHONPATH.
    """
    argv = [*prefix, *llmgw_argv(*args, python=python)]
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="llmgw-test-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    name = args[0] if args else "llmgw"
    fd, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log", dir=log_dir)
    child_env = dict(os.environ)
    if python is not None:
        # Another interpreter runs its own installed llmgw: a PYTHONPATH naming a source
        # tree (how tests run a checkout's code) would run that tree's modules instead.
        child_env.pop("PYTHONPATH", None)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        child_env.update(env)
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=cwd,
            start_new_session=True,
        )
    prog = Program(proc, Path(path), argv)
    if wait:
        try:
            prog.wait_ready(timeout_s=ready_timeout_s)
        except BaseException:
            prog.stop(grace_s=2)
            raise
    return prog
