"""Engine processes: started children and adopted survivors behind one handle.

Every engine runs in its own session (start_new_session), so its process group
id is its pid: stopping signals the whole group (an engine's worker processes
included), and a SIGKILLed agent leaves its engines running, which is what
re-adoption needs (docs/agent.md, "State folder").

A process is identified by its pid AND its start time (field 22 of
/proc/<pid>/stat, clock ticks since boot): after a reboot or a long outage
the pid may belong to something else, and that must never be adopted or
signalled.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from llmgw.agent.errors import AgentError
from llmgw.agent.logfiles import open_for_engine
from llmgw.agent.secretrefs import is_private_env
from llmgw.agent.templates import shown_argv


class SpawnError(AgentError):
    """The engine could not be started at all (missing binary, bad cwd…)."""


@dataclass(frozen=True, slots=True)
class Exit:
    # Exit status as Popen reports it: negative N = killed by signal N; None =
    # unknown (an adopted process is not our child, so its status is not ours).
    code: int | None


class ProcessHandle(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def start_ticks(self) -> int | None: ...

    def poll(self) -> Exit | None:
        """None while it runs; the exit once it is gone. Never blocks."""
        ...

    def signal_group(self, sig: int) -> None:
        """Signal the process group; a group already gone is not an error."""
        ...


class Spawner(Protocol):
    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> ProcessHandle:
        """Start argv in a new session, stdout+stderr appended to log_path; SpawnError if not."""
        ...

    def attach(self, pid: int, start_ticks: int | None) -> ProcessHandle | None:
        """The process if it still runs with that start time; None otherwise."""
        ...


def read_environ(pid: int) -> dict[str, str] | None:
    """The environment `pid` was started with (/proc/PID/environ); None when unreadable.

    For an adopted engine, the values it was given, which its env_from references may no
    longer yield (a rotated or removed secret file): what its log tail must be masked of.
    """
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            out[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def read_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in ticks) of a live pid; None when there is none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _killpg(pgid: int, start_ticks: int | None, sig: int) -> None:
    """Signal our engine's group, never a stranger's.

    While any member of the group lives, Linux does not hand its id out again,
    so the group id is ours. Once the group is empty the number is free: a new
    process may take it and lead a group of its own. So when a process holds
    that pid with another start time, it is a stranger and nothing is sent.
    """
    stat = read_stat(pgid)
    if stat is not None and start_ticks is not None and stat[1] != start_ticks:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class ChildProcess:
    """An engine this agent started: exit codes come from waitpid."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        stat = read_stat(popen.pid)
        self._start_ticks = stat[1] if stat is not None else None

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def start_ticks(self) -> int | None:
        return self._start_ticks

    def poll(self) -> Exit | None:
        code = self._popen.poll()
        return None if code is None else Exit(code)

    def signal_group(self, sig: int) -> None:
        _killpg(self._popen.pid, self._start_ticks, sig)


class AdoptedProcess:
    """An engine a previous agent started: watched through /proc, exit status unknown."""

    def __init__(self, pid: int, start_ticks: int) -> None:
        self._pid = pid
        self._start_ticks = start_ticks

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def start_ticks(self) -> int | None:
        return self._start_ticks

    def poll(self) -> Exit | None:
        stat = read_stat(self._pid)
        # A zombie is dead: its parent (init, since we are not it) has yet to reap it.
        if stat is None or stat[0] == "Z" or stat[1] != self._start_ticks:
            return Exit(None)
        return None

    def signal_group(self, sig: int) -> None:
        _killpg(self._pid, self._start_ticks, sig)


# The programs' tokens: an engine runs a spec's code and must not read them.
PRIVATE_ENV = frozenset({"LLMGW_AGENT_TOKEN", "LLMGW_CONTROLLER_TOKEN", "LLMGW_TOKEN"})


def _inherited(withheld: frozenset[str] = frozenset()) -> dict[str, str]:
    """The agent's environment minus its secrets, which engines never inherit: its own
    tokens, and `withheld` (its secret_env, given only to the engines whose spec names it)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in PRIVATE_ENV and k not in withheld and not is_private_env(k)
    }


class PopenSpawner:
    """The real spawner.

    `withheld`: the agent's secret_env. Those variables are secrets specs may reference;
    no engine inherits them, so each reaches only the engines whose spec's `env_from`
    reads it (in `env`, under the spec's name).
    """

    def __init__(self, withheld: Collection[str] = ()) -> None:
        self._withheld = frozenset(withheld)

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> ProcessHandle:
        try:
            fd = open_for_engine(log_path)
        except OSError as exc:
            # Translated like a failed exec: the shard fails with this reason. Raw, it
            # would end the heartbeat loop and the agent, over and over after restarts.
            why = (
                "it is a symbolic link; refusing to follow it"
                if exc.errno == errno.ELOOP
                else exc.strerror or str(exc)
            )
            raise SpawnError(f"cannot open the engine log {log_path}: {why}") from exc
        try:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            # Names only: values may be secrets (a spec's env_from, the engine key).
            names = " ".join(sorted(env))
            shown = shlex.join(shown_argv(list(argv)))
            os.write(fd, f"--- llmgw agent {stamp}: env {names}; {shown}\n".encode())
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                env={**_inherited(self._withheld), **env},
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise SpawnError(f"could not start {argv[0]!r}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        return ChildProcess(popen)

    def attach(self, pid: int, start_ticks: int | None) -> ProcessHandle | None:
        if start_ticks is None:
            return None
        stat = read_stat(pid)
        if stat is None or stat[0] == "Z" or stat[1] != start_ticks:
            return None
        return AdoptedProcess(pid, start_ticks)


TERM = signal.SIGTERM
KILL = signal.SIGKILL
