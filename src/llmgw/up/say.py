"""`llmgw up`'s own messages while it stops: a gone reader must never stop the stop.

`llmgw up | tee up.log`, then Ctrl-C: the terminal's Ctrl-C ends `tee` too, and up's
"stopping…" met a closed pipe. The BrokenPipeError left `main`'s `finally` before
`Up.stop()` ran, and every program up had started (each in a session of its own, so
the Ctrl-C never reached them) ran on, engines included. What up says from its
error handler on is therefore written with `say`, which never raises: a stream that
cannot take the message is pointed at /dev/null, so neither the rest of the stop nor
the interpreter's flush at exit (`Exception ignored … BrokenPipeError`) fails on it.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import TextIO


def say(text: str, *, err: bool = False) -> bool:
    """Print `text` and a newline to stdout (stderr with `err`); False when it could not."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):  # EPIPE (reader gone), EIO (terminal gone), closed
        _discard_the_rest(stream)
        return False
    return True


def _discard_the_rest(stream: TextIO) -> None:
    """Point the stream's descriptor at /dev/null (module docstring)."""
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
