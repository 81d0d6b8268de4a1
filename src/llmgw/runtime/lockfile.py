"""One process per folder: an flock held for the process's lifetime.

flock, not a pid file: the kernel drops it when the process dies, however it
dies (SIGKILL included), so a crashed holder never blocks its successor. The
file carries the holder's pid, for the refusal message. Descriptors Python
opens are not inheritable, so children (engines) never hold it by accident.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import IO


class LockHeld(RuntimeError):
    """Another live process holds the lock; `holder_pid` is None when unreadable."""

    def __init__(self, path: Path, holder_pid: int | None) -> None:
        super().__init__(f"{path} is held by {holder_pid or 'another process'}")
        self.path = path
        self.holder_pid = holder_pid


class StateDirRefused(RuntimeError):
    """The state folder (or its lock) is a symlink or not a folder; the message is one line."""


def check_state_dir(path: Path, *, what: str = "state folder") -> None:
    """Create the folder if missing; refuse a symlink or anything but a folder.

    A symlink would send the lock and the state files wherever it points (one
    planted by someone else overwrites its target); a file is refused by name
    instead of as `[Errno 17] File exists`. Folders above it may be symlinks.
    `what` names the folder in the refusal ("log folder").
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            pass  # created meanwhile: looked at below
        except OSError as exc:
            raise StateDirRefused(f"cannot create the {what} {path}: {_why(exc)}") from None
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise StateDirRefused(
            f"the {what} {path} is a symbolic link; give the folder it points to "
            f"({os.path.realpath(path)}) instead"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirRefused(f"the {what} {path} exists but is not a folder")


def _why(exc: OSError) -> str:
    return (exc.strerror or str(exc)).lower()


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """os.open that refuses a symlink at `path` itself (StateDirRefused), never following it."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateDirRefused(f"{path} is a symbolic link; refusing to follow it") from None
        if exc.errno == errno.EISDIR:
            raise StateDirRefused(f"{path} is a folder; expected a file") from None
        raise


def hold_lock(path: Path, *, what: str = "state folder") -> IO[str]:
    """Take `path`'s lock or raise LockHeld; keep the returned file open to keep it.

    Its folder is checked first (check_state_dir, `what` naming it), and a
    symlinked lock file is refused (StateDirRefused), never followed; so is one
    that cannot be opened (a read-only folder), by name rather than as an errno.
    """
    check_state_dir(path.parent, what=what)
    # Append mode: opening must not erase the holder's pid before we know we hold the lock.
    try:
        fd = open_nofollow(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    except OSError as exc:
        raise StateDirRefused(f"cannot open the lock file {path}: {_why(exc)}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StateDirRefused(f"{path} is not a regular file")
    f = os.fdopen(fd, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        raise LockHeld(path, int(holder) if holder.isdigit() else None) from None
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
