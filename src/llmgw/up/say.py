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

import sys

from llmgw.runtime.readergone import discard_the_rest


def say(text: str, *, err: bool = False) -> bool:
    """Print `text` and a newline to stdout (stderr with `err`); False when it could not."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):  # EPIPE (reader gone), EIO (terminal gone), closed
        discard_the_rest(stream)
        return False
    return True
