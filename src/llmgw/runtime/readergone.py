"""A standard stream whose reader went away: its descriptor pointed at /dev/null.

A program that writes to a closed pipe (`| head -1`, `| tee` ended by the Ctrl-C) or a
full disk gets an OSError, and the text still buffered fails again when the interpreter
flushes at exit: Python then prints `Exception ignored … BrokenPipeError` after the
program has said what it had to. Once a write has failed, `discard_the_rest` points the
stream's descriptor at /dev/null, so the rest of the run (ctl's error line, up's stop)
and that last flush write nowhere instead of failing.
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import Protocol


class HasFileno(Protocol):
    def fileno(self) -> int: ...


def discard_the_rest(stream: HasFileno) -> None:
    """Point `stream`'s descriptor at /dev/null; nothing when it has none (closed)."""
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
