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
from pathlib import Path
from typing import IO


class LockHeld(RuntimeError):
    """Another live process holds the lock; `holder_pid` is None when unreadable."""

    def __init__(self, path: Path, holder_pid: int | None) -> None:
        super().__init__(f"{path} is held by {holder_pid or 'another process'}")
        self.path = path
        self.holder_pid = holder_pid


def hold_lock(path: Path) -> IO[str]:
    """Take `path`'s lock or raise LockHeld; keep the returned file open to keep it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # "a+": opening must not erase the holder's pid before we know we hold the lock.
    f = path.open("a+")
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
