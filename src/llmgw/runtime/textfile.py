"""A small text file read whole, with bounds: a program's config file or a secret's file.

`Path.read_text` reads until the file ends and blocks where the file does: a FIFO no one
writes to hung a program at start (and the router's reload on its event loop, so every
request with it), and `/dev/zero` or `/dev/urandom` named as a config grew memory until
the kernel killed the process. So the file is opened without blocking, taken only when
it is a regular file (a pipe cannot be read again on reload; a device may never end), and
read to at most `max_bytes` and as UTF-8. The checks are on what was opened, not on the
name, which can change in between.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

# A config file larger than this is not one (a fleet's, a router's with thousands of
# endpoints and keys, are kilobytes), and PyYAML takes seconds to parse each MiB.
CONFIG_MAX_BYTES = 4 * 1024 * 1024
# A secret's file larger than this is a mistake (a model file, a log), not a secret.
SECRET_MAX_BYTES = 64 * 1024

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class TextFileError(ValueError):
    """The file cannot be used; the message says why but not which file (callers name it).

    TextFileMissing: there is no file at the path (a caller may take that as empty)."""


class TextFileMissing(TextFileError):
    """No file at the path (or a symlink to none)."""


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 else f"{n // 1024} KiB"


def read(path: str | os.PathLike[str], *, max_bytes: int = CONFIG_MAX_BYTES) -> str:
    """The file's text, or TextFileError: cannot read, not a regular file, too large, not UTF-8."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as exc:
        raise TextFileMissing(f"cannot read: {exc.strerror}") from None
    except OSError as exc:
        raise TextFileError(f"cannot read: {exc.strerror or type(exc).__name__}") from None
    except ValueError:  # a NUL in the path
        raise TextFileError("cannot read: the path holds a NUL byte") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise TextFileError("is a folder, not a file")
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise TextFileError(f"not a regular file ({kind})")
    with os.fdopen(fd, "rb") as f:
        return read_stream(f, max_bytes=max_bytes)


def read_stream(stream: BinaryIO, *, max_bytes: int) -> str:
    """An open stream's text, read to at most `max_bytes` (standard input, a pipe: what
    the caller chose to read), or TextFileError: cannot read, too large, not UTF-8."""
    try:
        data = stream.read(max_bytes + 1)
    except OSError as exc:
        raise TextFileError(f"cannot read: {exc.strerror or type(exc).__name__}") from None
    if len(data) > max_bytes:
        raise TextFileError(f"larger than {_size(max_bytes)}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TextFileError(f"not UTF-8 text (byte {exc.start})") from None
