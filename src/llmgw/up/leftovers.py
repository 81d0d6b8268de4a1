"""The programs a killed `llmgw up` left running, found through its manifest and stopped.

`up` runs each program in a session of its own (the terminal's Ctrl-C reaches `up`
alone, which then stops them in order), so a `kill -9` of `up` left every one of them
running: the next `up` in the folder found its ports taken and refused to start, and
the old fleet, engines included, ran on until someone killed it by hand.

The manifest (`up.json`, written as each program starts, removed by a clean stop)
lists their pids. The next `up`, holding the folder's lock (so the old one is surely
gone), stops each that is still an llmgw program of this state folder: its command
line must say `-m llmgw` and name a path in the folder, so a pid reused since by an
unrelated process is left alone. Router first, then agents (they stop their engines),
then the rest, as `Up.stop` does; engines whose agent was already gone are then
stopped by `agent stop-engines` (children.stop_leftover_engines).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from pathlib import Path

import msgspec

from llmgw.up.children import stop_leftover_engines

MANIFEST = "up.json"


class _Entry(msgspec.Struct, frozen=True, kw_only=True):
    # None: the program had not started (a manifest written while starting).
    pid: int | None = None


class _Manifest(msgspec.Struct, frozen=True, kw_only=True):
    children: dict[str, _Entry] = {}


def stop_last_run(state: Path, *, grace_s: float) -> int | None:
    """Stop what the manifest in `state` lists and remove it; None when there is none.

    Returns how many programs were stopped. The manifest is kept when one of them
    could not be stopped (another user's process), so the port refusal that follows
    can point at it. Call only while holding the folder's lock.
    """
    path = state / MANIFEST
    try:
        manifest = msgspec.json.decode(path.read_bytes(), type=_Manifest)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError):
        # Unreadable or not ours: nothing to go on; a port refusal will point at it.
        return None
    named = [(name, e.pid) for name, e in manifest.children.items() if e.pid is not None]
    pids = {name: pid for name, pid in named if _is_ours(pid, state)}
    order = [
        [p for n, p in pids.items() if n == "router"],
        [p for n, p in pids.items() if n.startswith("agent ")],
        [p for n, p in pids.items() if n != "router" and not n.startswith("agent ")],
    ]
    left: list[int] = []
    for group in order:
        left += _stop(group, state, grace_s=grace_s)
    agents = state / "agents"
    if agents.is_dir() and not agents.is_symlink():
        dirs = sorted((d.name, d) for d in agents.iterdir() if d.is_dir() and not d.is_symlink())
        stop_leftover_engines(dirs, grace_s=grace_s)
    if not left:
        path.unlink(missing_ok=True)
    return len(pids) - len(left)


def _is_ours(pid: int, state: Path) -> bool:
    """Whether `pid` is alive and an llmgw program of `state` (module docstring)."""
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False  # gone
    if _gone(pid):
        return False
    words = [a.decode(errors="replace") for a in args]
    llmgw = any(a == "-m" and b == "llmgw" for a, b in itertools.pairwise(words))
    inside = f"{state}/"
    return llmgw and any(inside in w for w in words)


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its new parent has not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def _stop(pids: list[int], state: Path, *, grace_s: float) -> list[int]:
    """SIGTERM each, SIGKILL its process group after `grace_s`; returns those still alive."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        # Checked again: in the grace the pid may have gone and been reused.
        if not _gone(pid) and _is_ours(pid, state):
            # Each program leads a session (and group) of its own: its children go too.
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if not _gone(p)]
