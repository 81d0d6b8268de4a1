"""`llmgw agent stop-engines NODE=STATE_DIR…`: stop engines whose agent is gone.

An agent stops its engines on exit only with `--stop-engines-on-exit`, and only
if it is alive to do it: one that crashed, or was SIGKILLed after its grace,
leaves them running in sessions of their own, where nothing else would ever
stop them. This reads each folder's state file and stops what it lists, with
the same checks re-adoption uses (pid AND process start time), so a reused pid
is never signalled.

A folder whose agent still lives (it holds the folder's lock) is left alone:
that agent owns its engines. `llmgw up` runs this after stopping its agents,
so it needs nothing of the agent's internals.

Prints `stopped N engine(s)` (and one line per folder skipped); exit 0, or 2 for
a bad command line.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import IO

from llmgw.agent.engineprocs import KILL, TERM, PopenSpawner, ProcessHandle
from llmgw.agent.statefile import STATE_FILE, StateDirBusy, StateStore, lock_state_dir
from llmgw.runtime.finite import finite_float

COMMAND = "stop-engines"


def stop_leftover_engines(
    agents: list[tuple[str, Path]], *, grace_s: float, err: IO[str] = sys.stderr
) -> int:
    """SIGTERM, then SIGKILL after `grace_s`, every engine the folders list; returns how many.

    `agents` is (node name, state dir) pairs; a folder held by a live agent is skipped.
    """
    spawner = PopenSpawner()
    handles: list[ProcessHandle] = []
    with contextlib.ExitStack() as locks:
        for node, state_dir in agents:
            if not (state_dir / STATE_FILE).exists():
                continue
            try:
                locks.enter_context(lock_state_dir(state_dir))
            except StateDirBusy as exc:
                err.write(f"llmgw agent {COMMAND}: skipped {node}: {exc}\n")
                continue
            for rec in StateStore(state_dir, node=node).load():
                handle = spawner.attach(rec.pid, rec.start_ticks)
                if handle is not None:
                    handles.append(handle)
        for h in handles:
            h.signal_group(TERM)
        deadline = time.monotonic() + grace_s
        while any(h.poll() is None for h in handles) and time.monotonic() < deadline:
            time.sleep(0.1)
        for h in handles:
            if h.poll() is None:
                h.signal_group(KILL)
    return len(handles)


def _pair(text: str) -> tuple[str, Path]:
    node, sep, folder = text.partition("=")
    if not sep or not node or not folder:
        raise argparse.ArgumentTypeError(f"expected NODE=STATE_DIR, got {text!r}")
    return node, Path(folder)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog=f"llmgw agent {COMMAND}", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument("agents", nargs="+", type=_pair, metavar="NODE=STATE_DIR")
    p.add_argument("--grace-s", type=finite_float, default=10.0, help="SIGTERM→SIGKILL grace")
    args = p.parse_args(argv)
    if args.grace_s < 0:
        p.error("--grace-s must not be negative")
    count = stop_leftover_engines(args.agents, grace_s=args.grace_s)
    print(f"stopped {count} engine(s)", flush=True)
    return 0
