"""Per-shard engine logs: a file the engine writes itself, rotated by copy-truncate.

Why a file and not a pipe the agent drains: an engine must outlive its agent
(re-adoption, docs/agent.md). With a pipe, an agent that dies leaves the engine
writing into a pipe with no reader, which blocks it (full buffer) or kills it
(EPIPE). With a file opened O_APPEND the engine never waits on the agent.

Rotation: when the file passes `max_bytes`, the agent copies it to `.1`
(shifting `.1`→`.2`… and dropping the oldest beyond `keep`) and truncates it
in place. O_APPEND makes the engine's next write land at the new end, so the
file really shrinks. The cost: lines written between the copy and the
truncate are lost, a window of one copy (milliseconds for 10 MiB).

The agent only looks every `CHECK_S`, so an engine writing fast passes
`max_bytes` by what it writes in between. The copy keeps the newest
`max_bytes` of it (from a line's start) under one line saying how much was
left out: copied whole, each copy held whatever the engine wrote in a check
interval, and a chatty engine could fill the disk `keep` times over.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import deque
from collections.abc import Collection
from pathlib import Path
from typing import IO, BinaryIO

from llmgw.agent.errors import AgentError
from llmgw.runtime.lockfile import LockHeld, StateDirRefused, hold_lock

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_KEEP = 3
# Logs of ended shards kept (EndedLogs), each with its rotated copies.
DEFAULT_ENDED_KEEP = 20
# Seconds between two looks at the live logs' sizes (agent/service.py): the live file
# passes max_bytes by at most what its engine writes in that time.
CHECK_S = 0.25
# The tail's read window: what a failed shard's tail is made of.
TAIL_WINDOW_BYTES = 64 * 1024
# Held in the log dir for the agent's lifetime (lock_log_dir). Not named like an engine
# log, so the start sweep never counts it; not the state dir's `agent.lock`, so an agent
# given the same folder for both does not lock itself out.
LOCK_FILE = "agent-logs.lock"


class LogDirBusy(AgentError):
    """The log dir cannot be ours: another live agent holds it (the message names the
    folder and its pid), or it or its lock is a symlink or not what it should be. The
    agent ends at start with this one line, exit 2."""


def lock_log_dir(log_dir: Path) -> IO[str]:
    """Hold the log dir for this process's lifetime: keep the returned file open.

    At start an agent removes the oldest engine logs there that none of its adopted
    engines owns (`LogKeeper.found`): a second agent on the folder would count the
    first's live engines' logs as left over and remove them. Taken even when the folder
    is the default under the state dir, whose lock does not keep out another agent
    naming it as its --log-dir. flock: dropped however the agent dies.
    """
    try:
        return hold_lock(log_dir / LOCK_FILE, what="log folder")
    except StateDirRefused as exc:
        raise LogDirBusy(f"--log-dir: {exc}") from None
    except LockHeld as held:
        who = f"pid {held.holder_pid}" if held.holder_pid else "another process"
        raise LogDirBusy(
            f"another agent ({who}) is running with --log-dir {log_dir}; one agent per "
            "log folder (each removes old engine logs there that are not its own)"
        ) from None


# Engine logs are the agent user's alone: an engine may print what it was given.
MODE = 0o600


def open_for_engine(path: Path) -> int:
    """A write-only O_APPEND descriptor for the engine's stdout and stderr (mode 0600,
    also for a file an older agent left readable).

    O_NOFOLLOW: a symlink planted at a log's name would have the engine's output appended
    to, and the fchmod applied to, whatever it points at; refused (ELOOP), the shard fails
    with that reason (engineprocs.PopenSpawner)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, MODE)
    os.fchmod(fd, MODE)
    return fd


def needs_rotation(path: Path, *, max_bytes: int) -> bool:
    try:
        return path.stat().st_size > max_bytes
    except FileNotFoundError:
        return False


def rotate(path: Path, *, keep: int = DEFAULT_KEEP, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Copy-truncate `path` into `path.1`, shifting older copies; keeps `keep` copies, each
    of at most `max_bytes` (the newest, module docstring) plus one line saying so."""
    if keep < 1:
        os.truncate(path, 0)
        return
    oldest = path.with_name(f"{path.name}.{keep}")
    oldest.unlink(missing_ok=True)
    for n in range(keep - 1, 0, -1):
        src = path.with_name(f"{path.name}.{n}")
        if src.exists():
            src.rename(path.with_name(f"{path.name}.{n + 1}"))
    first = path.with_name(f"{path.name}.1")
    # Made 0600 from the start (copyfile would create it under the umask, readable by
    # others until a chmod); after the shift above, nothing is at `first`.
    first.unlink(missing_ok=True)
    fd = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, MODE)
    with os.fdopen(fd, "wb") as copy, path.open("rb") as live:
        os.fchmod(copy.fileno(), MODE)
        _copy_newest(live, copy, max_bytes=max_bytes)
    os.truncate(path, 0)


def _copy_newest(live: BinaryIO, copy: BinaryIO, *, max_bytes: int) -> None:
    """The last `max_bytes` of `live` as it is now, from the first line that starts in
    them (unless none does), after a line saying how many bytes came before.

    Only the size read at the start is copied: an engine writing faster than the copy
    would otherwise keep it going, and growing, for as long as it writes."""
    size = live.seek(0, os.SEEK_END)
    start = max(0, size - max_bytes)
    if start > 0:
        live.seek(start - 1)
        head = live.read(min(size - start + 1, 64 * 1024))
        cut = head.find(b"\n")
        if cut >= 0 and start + cut < size:
            start += cut
        copy.write(f"--- llmgw agent: {start} bytes left out (over log_max_bytes)\n".encode())
    live.seek(start)
    left = size - start
    while left > 0:
        chunk = live.read(min(left, 1024 * 1024))
        if not chunk:
            break
        copy.write(chunk)
        left -= len(chunk)


def remove(path: Path, *, keep: int = DEFAULT_KEEP) -> None:
    """Delete an engine log and its rotated copies (`.1` … `.keep`, and any higher one an
    agent with a larger `log_keep` left); missing ones are fine."""
    for n in range(keep, 0, -1):
        path.with_name(f"{path.name}.{n}").unlink(missing_ok=True)
    for copy in _copies(path.parent).get(path.name, ()):
        copy.unlink(missing_ok=True)
    path.unlink(missing_ok=True)


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def log_name(replica_id: str, rank: int) -> str:
    """The file name of a shard's engine log: the replica id made safe for a path."""
    return f"{_UNSAFE.sub('_', replica_id)}-rank{rank}.log"


# An engine log as the supervisor names it (`<replica>-rank<N>.log`, the replica id made
# safe), or one of its rotated copies (`.1`, `.2` …).
_LOG_NAME = re.compile(r"([A-Za-z0-9._-]+-rank[0-9]+\.log)(?:\.[0-9]+)?")


def _copies(log_dir: Path) -> dict[str, list[Path]]:
    """The regular files of `log_dir` named like engine logs, by their live log's name."""
    out: dict[str, list[Path]] = {}
    try:
        entries = list(os.scandir(log_dir))
    except FileNotFoundError:
        return out
    for entry in entries:
        m = _LOG_NAME.fullmatch(entry.name)
        # Never followed: a link is not a file an engine of ours wrote.
        if m is not None and entry.is_file(follow_symlinks=False):
            out.setdefault(m.group(1), []).append(Path(entry.path))
    return out


def leftovers(log_dir: Path, known: Collection[Path]) -> list[Path]:
    """Engine logs in `log_dir` of shards not in `known` (an earlier agent's dropped
    shards), oldest first by the newest mtime among each one's files (rotated copies
    included). Only files named like engine logs count: nothing else there is ours."""
    dated = []
    for name, files in _copies(log_dir).items():
        path = log_dir / name
        if path in known:
            continue
        mtimes = []
        for f in files:
            try:
                mtimes.append(f.stat().st_mtime)
            except FileNotFoundError:
                continue
        if mtimes:
            dated.append((max(mtimes), name, path))
    return [path for _, _, path in sorted(dated)]


class EndedLogs:
    """Logs of the shards this agent dropped, oldest first; past the newest `keep`, removed.

    A replica id is never reused (a restart or replacement is a new replica), so without
    this every crash-loop try, scale-down and eviction left its log file for good. At
    start, the logs earlier agents left of shards they dropped are counted in first,
    oldest first (`leftovers`): the list is in memory only, and an agent restarted in a
    loop would otherwise never remove any. Only files named like engine logs are
    counted, so a log folder an operator shares with anything else keeps the rest.
    """

    def __init__(self, *, keep: int = DEFAULT_ENDED_KEEP) -> None:
        self._keep = keep
        self._paths: deque[Path] = deque()
        # The values masked in what of each log leaves the node (its engine's key and
        # secrets; none known for the logs earlier agents left).
        self._secrets: dict[Path, tuple[str, ...]] = {}

    def add(self, path: Path, secrets: tuple[str, ...] = ()) -> None:
        self._paths.append(path)
        self._secrets[path] = (*self._secrets.get(path, ()), *secrets)

    def secrets_of(self, path: Path) -> tuple[str, ...] | None:
        """The values to mask in an ended shard's log; None: not one kept here."""
        return self._secrets.get(path)

    def take_expired(self) -> list[Path]:
        """The logs beyond the newest `keep`, oldest first, forgotten here."""
        out = []
        while len(self._paths) > self._keep:
            path = self._paths.popleft()
            if path not in self._paths:
                self._secrets.pop(path, None)
            out.append(path)
        return out


def tidy(live: Collection[Path], expired: Collection[Path], *, max_bytes: int, keep: int) -> None:
    """Rotate the live shards' logs past `max_bytes`; remove the expired ones (never a
    live one: a shard listed again under its old identity writes to the same file)."""
    for path in live:
        if needs_rotation(path, max_bytes=max_bytes):
            rotate(path, keep=keep, max_bytes=max_bytes)
    for path in expired:
        if path not in live:
            remove(path, keep=keep)


class LogKeeper:
    """Rotation and expiry of the engine logs, one pass at a time: the supervisor's tick
    and the agent's log watch (every CHECK_S, agent/service.py) both call `tidy`, and two
    rotations of one file at once would shift its copies twice."""

    def __init__(self, *, max_bytes: int, keep: int, ended_keep: int) -> None:
        self.max_bytes = max_bytes
        self.keep = keep
        self._ended = EndedLogs(keep=ended_keep)
        self._lock = asyncio.Lock()

    def ended(self, path: Path, secrets: tuple[str, ...] = ()) -> None:
        """A dropped shard's log: removed once `ended_keep` newer ones have ended. Its
        `secrets` are masked when it is read (logtail.py) until then."""
        self._ended.add(path, secrets)

    def kept(self, path: Path, *, also: tuple[str, ...]) -> tuple[Path, tuple[str, ...]] | None:
        """An ended shard's log and the values to mask in it (its own, and `also`), while
        it is kept; None: not one of the ended logs kept."""
        secrets = self._ended.secrets_of(path)
        return None if secrets is None else (path, secrets + also)

    def found(self, log_dir: Path, known: Collection[Path]) -> None:
        """Count in the logs in `log_dir` of shards other than `known` (those adopted),
        as ended before any this agent drops; call once, at start."""
        for path in leftovers(log_dir, known):
            self._ended.add(path)

    async def tidy(self, live: Collection[Path]) -> None:
        """`tidy` in a thread (a copy of up to max_bytes must not hold the event loop)."""
        async with self._lock:
            expired = self._ended.take_expired()
            await asyncio.to_thread(tidy, live, expired, max_bytes=self.max_bytes, keep=self.keep)


def redact(lines: tuple[str, ...], secrets: Collection[str]) -> tuple[str, ...]:
    """`lines` with every occurrence of a secret value replaced by `***`."""
    found = sorted((s for s in secrets if s), key=len, reverse=True)
    if not found:
        return lines
    out = []
    for ln in lines:
        for s in found:
            ln = ln.replace(s, "***")
        out.append(ln)
    return tuple(out)


def _window(path: Path) -> tuple[bytes, bool]:
    """The last TAIL_WINDOW_BYTES of the log, its newest copy's end before the live file's
    when the live one holds less (just rotated: the engine may have died right after);
    and whether the window starts inside the log rather than at its start."""
    data = b""
    for part in (path, path.with_name(f"{path.name}.1")):
        try:
            with part.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                start = max(0, size - (TAIL_WINDOW_BYTES - len(data)))
                f.seek(start)
                data = f.read(size - start) + data
        except FileNotFoundError:
            if part == path:
                return b"", False
            return data, False
        if start > 0 or len(data) >= TAIL_WINDOW_BYTES:
            return data, start > 0
    return data, False


def tail(
    path: Path, *, lines: int = 20, max_line_chars: int = 300, secrets: Collection[str] = ()
) -> tuple[str, ...]:
    """The last `lines` lines of `path` (reads at most TAIL_WINDOW_BYTES), each cut to
    `max_line_chars`, with the `secrets` values masked (before the cut, so no prefix of
    one survives). A line break is `\\n` or `\\r` (a progress bar redraws with `\\r`).

    A last line longer than the window, which has no break at all, is kept by its end
    (`…` and its last `max_line_chars`): where an engine died inside an endless line,
    how it ended is at its end, and a tail without it would be empty."""
    data, cut = _window(path)
    endless = False
    if cut:
        # The window starts inside a line: its head may end a secret cut in two, which
        # no mask matches any more (and half a line says little anyway).
        breaks = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
        if breaks:
            data = data[min(breaks) + 1 :]
        else:
            # No break to drop up to: drop what may hold the end of a cut secret.
            longest = max((len(s.encode()) for s in secrets if s), default=1)
            data = data[longest - 1 :]
            endless = True
    text = data.decode("utf-8", errors="replace")
    if endless:
        (last,) = redact((text,), secrets)
        return ("…" + last[-(max_line_chars - 1) :],) if last.strip() else ()
    kept = redact(tuple(ln for ln in text.splitlines() if ln.strip())[-lines:], secrets)
    return tuple(ln[:max_line_chars] for ln in kept)
