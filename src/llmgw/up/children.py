"""Child programs of `llmgw up`: start, wait for the ready line, supervise, stop by PID.

Each child runs `python -m llmgw <program> …` in its own process group with its
output in a log file under the state folder. A child that dies on its own is
restarted with backoff (`llmgw up` is a supervisor, like a process manager
would be in production); a child being stopped is not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.runtime.serve import READY_PREFIX
from llmgw.up.errors import UpError
from llmgw.up.say import say


class StartFailed(UpError):
    """A child exited or did not print its ready line in time; carries its log tail."""


class Interrupted(UpError):
    """Ctrl-C (or SIGTERM, SIGHUP) arrived while `up` was still starting its programs."""


@dataclass
class Child:
    name: str
    args: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    restarts: int = 0
    # monotonic time before which a crashed child is not restarted (backoff)
    restart_after: float = 0.0
    env: dict[str, str] = field(default_factory=dict)
    _log_offset: int = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Append: a restarted child's log continues the old one.
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llmgw", *self.args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def poll_ready(self) -> bool:
        """True once this run of the child printed its ready line (sets `url`)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except FileNotFoundError:
            return False
        for raw in data.splitlines():
            line = raw.decode(errors="replace")
            if line.startswith(READY_PREFIX):
                self.url = line.split()[-1]
                return True
        return False

    def wait_ready(self, timeout_s: float, *, stopping: Callable[[], bool] = lambda: False) -> None:
        """Return once ready; StartFailed if it dies or times out, Interrupted once `stopping()`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.poll_ready():
                return
            # Ctrl-C during start-up stops now, not after every program is ready.
            if stopping():
                raise Interrupted(self.name)
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise StartFailed(f"{self.name} exited with {code}:\n{self.log_tail()}")
            time.sleep(0.05)
        raise StartFailed(f"{self.name} not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def terminate(self) -> None:
        if self.alive() and self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)

    def wait_exit(self, timeout_s: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)


def stop_all(children: list[Child], *, grace_s: float) -> None:
    """SIGTERM every child, then wait (up to grace_s in all) and SIGKILL stragglers."""
    for c in children:
        c.terminate()
    deadline = time.monotonic() + grace_s
    for c in children:
        c.wait_exit(max(0.1, deadline - time.monotonic()))


def stop_leftover_engines(agents: list[tuple[str, Path]], *, grace_s: float) -> int:
    """Stop engines that agents' state files still list once the agents are gone.

    An agent stops its engines on exit (`--stop-engines-on-exit`), but not if it
    was already dead when Ctrl-C came (crashed, waiting for its restart) or was
    SIGKILLed after its grace. The agent's own subcommand does it (`llmgw agent
    stop-engines`, which knows its state file and checks pid AND start time), so
    `up` needs none of the agent's internals. `agents` is (node name, state dir)
    pairs; returns how many engines were stopped (0 when the subcommand failed,
    whose output is shown).
    """
    if not agents:
        return 0
    argv = [sys.executable, "-m", "llmgw", "agent", "stop-engines", "--grace-s", str(grace_s)]
    argv += [f"{node}={state_dir}" for node, state_dir in agents]
    try:
        # A session of its own, as every child: a second Ctrl-C at the terminal (sent to
        # up's whole process group) would end it between its SIGTERM and its SIGKILL,
        # leaving the engines it was stopping. `up` itself only notes such a signal.
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=grace_s + 30,
            check=False,
            start_new_session=True,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        say(f"llmgw up: could not stop leftover engines: {exc}", err=True)
        return 0
    if done.stderr:
        say(done.stderr.rstrip("\n"), err=True)
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) < 2 or not lines[1].isdigit():
        say(f"llmgw up: agent stop-engines exited {done.returncode}", err=True)
        return 0
    return int(lines[1])
