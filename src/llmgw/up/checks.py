"""What must hold before `llmgw up` starts anything: one `up` per state folder, free ports.

Both are checked before the first child starts, so a refusal leaves nothing
behind to clean up and says in one line what to change. Without the lock, a
second `up` in the same folder would start agents on the first one's state
files: they would adopt the first one's engines and, on exit, stop them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from pathlib import Path
from typing import IO

from llmgw.runtime.lockfile import LockHeld, StateDirRefused, hold_lock
from llmgw.up.errors import UpError

LOCK_FILE = "up.lock"


class Refused(UpError):
    """`up` cannot start here; the message is one line saying what to change."""


def lock_state_dir(state: Path) -> IO[str]:
    """Hold `state/up.lock` for this process's lifetime (keep the returned file open).

    flock, not a pid file: the kernel drops it when the process dies, however
    it dies, so a crashed `up` never blocks the next one.
    """
    try:
        return hold_lock(state / LOCK_FILE)
    except StateDirRefused as exc:
        raise Refused(f"--state-dir: {exc}") from None
    except LockHeld as held:
        who = f" (pid {held.holder_pid})" if held.holder_pid else ""
        raise Refused(
            f"already running in {state}{who}; stop it first (Ctrl-C there), "
            "or pass --state-dir for a second system"
        ) from None


# The state folder's entries `up` and its programs write, and whether each is a folder.
STATE_ENTRIES = {
    "logs": True,
    "tokens": True,
    "agents": True,
    "controller.db": False,
    "router.yaml": False,
    "up.json": False,
}


def check_state_entries(state: Path) -> None:
    """Refuse an entry of the state folder of the wrong kind (a folder for a file, or not a
    folder), in one line before anything starts: each was an errno line after the
    controller had started, an agent's exit, or (up.json) a traceback from the stop."""
    for name, folder in STATE_ENTRIES.items():
        try:
            mode = os.lstat(state / name).st_mode
        except FileNotFoundError:
            continue
        if folder and not stat.S_ISDIR(mode):
            raise Refused(f"{state / name} is not a folder; move it away")
        if not folder and stat.S_ISDIR(mode):
            raise Refused(f"{state / name} is a folder, not a file; move it away")


def port_in_use(host: str, port: int) -> bool:
    """True when something listens on host:port (a bind test, as the child would do it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As runtime.serve binds: a port in TIME_WAIT is free for it, so free here.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def check_ports(host: str, ports: dict[str, tuple[int, str]]) -> None:
    """Refuse when a program's port is out of range, shared, or already taken.

    `ports` maps a program ("router") to (its port, the flag that sets it).
    """
    seen: dict[int, str] = {}
    for name, (port, flag) in ports.items():
        if not 1 <= port <= 65535:
            raise Refused(f"{flag} {port}: ports are 1-65535")
        if port in seen:
            raise Refused(f"the {seen[port]} and the {name} cannot share port {port}; pass {flag}")
        seen[port] = name
        in_use = False
        with contextlib.suppress(PermissionError):
            in_use = port_in_use(host, port)
        if in_use:
            raise Refused(
                f"{host}:{port} (the {name}'s port) is in use by another process; "
                f"stop it, or pass {flag}"
            )
