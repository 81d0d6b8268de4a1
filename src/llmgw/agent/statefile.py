"""The re-adoption state file: which engines this node's agent started (docs/agent.md).

One JSON document in the state dir, rewritten whole and atomically (temp file,
fsync, rename, fsync of the directory) whenever the running set changes, so a
crash at any instant leaves either the old or the new file, never half of one.
It is written right after each start, before anything else can happen, so an
agent killed a moment later still finds the engine it just started.

One agent per state dir (`lock_state_dir`): two agents on one file would both
adopt the same engines, both start what the controller lists (a shard twice,
on two ports), and each stop what the other started.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import IO

import msgspec

from llmgw.agent.errors import AgentError
from llmgw.runtime.lockfile import LockHeld, StateDirRefused, hold_lock, open_nofollow
from llmgw.runtime.logs import kv
from llmgw.wire.agent import ShardSpec

log = logging.getLogger(__name__)

STATE_FILE = "agent-state.json"
LOCK_FILE = "agent.lock"


class StateDirBusy(AgentError):
    """The state dir cannot be ours: another live agent holds it (the message names its
    pid), or it, its lock or its state file's temp file is a symlink or not what it
    should be. At start and at run time alike the agent ends with this one line, exit 2."""


def refusal_in(exc: BaseException | None) -> StateDirBusy | None:
    """The StateDirBusy inside `exc` (through exception groups), or None."""
    if isinstance(exc, StateDirBusy):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            found = refusal_in(sub)
            if found is not None:
                return found
    return None


def lock_state_dir(state_dir: Path) -> IO[str]:
    """Hold the state dir for this process's lifetime: keep the returned file open.

    flock: the kernel drops it however the agent dies, so a SIGKILLed agent's
    successor starts at once. Engines never inherit it (Python's descriptors
    are not inheritable), or a surviving engine would lock its own agent out.
    """
    try:
        return hold_lock(state_dir / LOCK_FILE)
    except StateDirRefused as exc:
        raise StateDirBusy(f"--state-dir: {exc}") from None
    except LockHeld as held:
        who = f"pid {held.holder_pid}" if held.holder_pid else "another process"
        raise StateDirBusy(
            f"another agent ({who}) is running with --state-dir {state_dir}; "
            "one agent per node and state dir"
        ) from None


class ShardRecord(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    rank: int
    pid: int
    # Process start time, clock ticks since boot (/proc/<pid>/stat field 22);
    # None if it could not be read (such an engine is never adopted).
    start_ticks: int | None
    port: int
    spec: ShardSpec
    log_path: str
    # Unix seconds the engine was started.
    started_at: float
    health_path: str | None = "/health"
    # The engine's key (the router needs it after a re-adoption too); the file is 0600.
    api_key: str = ""
    # Its KV-event publisher's ports, reported again after a re-adoption.
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None
    # Started with --scheduling-policy priority (reported again after a re-adoption;
    # a record from an agent that did not write it reads FCFS).
    priority_scheduling: bool = False


class StateDoc(msgspec.Struct, frozen=True, kw_only=True):
    version: int = 1
    node: str = ""
    shards: tuple[ShardRecord, ...] = ()


class StateStore:
    def __init__(self, state_dir: Path, *, node: str) -> None:
        self.path = state_dir / STATE_FILE
        self.node = node
        self._last: bytes | None = None
        # Why the last write failed; None: it succeeded (or none was needed).
        self._failing: str | None = None

    def load(self) -> tuple[ShardRecord, ...]:
        """Records of a previous run; a missing or unreadable file is an empty set (logged)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return ()
        try:
            doc = msgspec.json.decode(raw, type=StateDoc)
        except msgspec.DecodeError as exc:
            # Adopting from a corrupt file could signal the wrong process: start clean.
            log.error(kv("state file unreadable, adopting nothing", path=self.path, error=exc))
            return ()
        if doc.node and doc.node != self.node:
            log.error(
                kv("state file belongs to another node, adopting nothing", file_node=doc.node)
            )
            return ()
        self._last = raw
        return doc.shards

    def try_save(self, records: tuple[ShardRecord, ...]) -> str | None:
        """`save`, but a write the disk refuses is returned (why, in one line), not raised;
        logged once as it starts failing. The next call tries again (the set still differs
        from the last one written)."""
        try:
            self.save(records)
        except OSError as exc:
            # A full disk or a state dir made read-only must not end the agent: its
            # engines still need watching, and its restart would meet the same disk.
            why = f"cannot write the state file {self.path}: {exc.strerror or exc}"
            if self._failing != why:
                log.error(kv("state file not written", error=why))
            self._failing = why
            return why
        if self._failing is not None:
            log.info(kv("state file up to date again", path=self.path))
            self._failing = None
        return None

    def save(self, records: tuple[ShardRecord, ...]) -> None:
        """Write the set if it changed since the last write."""
        doc = StateDoc(node=self.node, shards=tuple(sorted(records, key=_key)))
        raw = msgspec.json.encode(doc)
        if raw == self._last:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            # Never through a symlink planted at the temp name; the rename replaces a link.
            fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except StateDirRefused as exc:
            # Without its state file the agent cannot re-adopt what it starts: it stops
            # (engines keep running; `llmgw agent stop-engines` stops those the file lists).
            raise StateDirBusy(f"--state-dir: {exc}") from None
        # 0600 from the first byte: the file holds the engines' keys.
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._last = raw


def _key(r: ShardRecord) -> tuple[str, int]:
    return (r.replica_id, r.rank)
