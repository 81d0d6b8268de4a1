"""ctl's standard output and error as the process has them: a failed write is a ctl error.

`llmgw ctl events | head -1` closes the pipe after one line, `>/dev/full` fails every
write, and a terminal set to ASCII or Latin-1 cannot encode ctl's `·` or a name's `é`.
Written to directly, each ended ctl in a Python traceback (BrokenPipeError, OSError,
UnicodeEncodeError). Through `Output` they become errors.ReaderGone (main exits 141, as
a shell reports a program SIGPIPE ended, and says nothing: the reader chose to stop) and
errors.OutputFailed (one line, exit 1); characters the stream's encoding lacks are
written as backslash escapes. A stream the process was started without (`2>&-`) takes
every write and keeps nothing.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import TextIO

from llmgw.ctl.errors import OutputFailed, ReaderGone
from llmgw.runtime.readergone import discard_the_rest


class Output(io.TextIOBase, TextIO):
    """One standard stream whose write failures are ctl's errors (module docstring)."""

    def __init__(self, stream: TextIO | None, *, name: str) -> None:
        self._stream = stream
        self._name = name
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")

    def write(self, s: str) -> int:
        if self._stream is None:
            return len(s)
        with self._translated():
            return self._stream.write(s)

    def flush(self) -> None:
        if self._stream is not None:
            with self._translated():
                self._stream.flush()

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def fileno(self) -> int:
        if self._stream is None:
            raise io.UnsupportedOperation(f"{self._name} is closed")
        return self._stream.fileno()

    # TextIOBase declares `encoding` an attribute; rich reads it to choose ASCII boxes.
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except BrokenPipeError as exc:
            discard_the_rest(self)
            raise ReaderGone(f"the reader of {self._name} went away") from exc
        except OSError as exc:
            discard_the_rest(self)
            why = exc.strerror or type(exc).__name__
            raise OutputFailed(f"cannot write to {self._name}: {why}") from exc
