"""The last lines of a shard's engine log, for an operator (`llmgw ctl logs`, docs/agent.md).

Unlike `logfiles.tail` (the few lines a failed shard reports, from one small window),
this serves up to `MAX_LINES` lines, so it reads from the end backwards, chunk by chunk,
and stops at whichever comes first: enough lines, `max_bytes` read, or the oldest
rotated copy's start. A file of any size costs at most `max_bytes` of reading; the
agent runs it in a thread all the same (a slow disk must not hold its event loop).

Rotation is copy-truncate (logfiles.rotate): just after one, the live file holds a line
or two and the rest is in `.1`, then `.2`… So the read goes on into the copies, newest
first, and a copy whose last line has no line break is ended with one (the next file
starts a new line). Lines lost between a copy and its truncate stay lost.

A line break is `\\n` only: a progress bar's `\\r` redraws are one line, as `less`
shows them. The last line may have no break yet (the engine is writing it): it is
served as it is. Bytes that are not UTF-8 become `\\ufffd`.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from llmgw.agent.logfiles import redact

DEFAULT_LINES = 100
MAX_LINES = 10_000
# What one answer reads at most: the lines asked for, or fewer if they are longer.
DEFAULT_MAX_BYTES = 512 * 1024
# Read backwards this much at a time.
CHUNK_BYTES = 64 * 1024
# Rotated copies looked into at most (`.1` … `.N`): more than any log_keep in use.
MAX_COPIES = 100


@dataclass(frozen=True, kw_only=True)
class Tail:
    # The last lines, oldest first, without their line breaks.
    lines: tuple[str, ...]
    # True: older bytes exist that the byte cap left out, and fewer lines than asked
    # came back (or the one line shown is the end of a longer one, shown with `…`).
    cut: bool
    # True: the last line has no line break yet (the engine is still writing it).
    last_open: bool = False


def _parts(path: Path) -> list[Path]:
    """The live log, then its rotated copies newest first, as far as they go."""
    out = [path]
    for n in range(1, MAX_COPIES + 1):
        copy = path.with_name(f"{path.name}.{n}")
        if not copy.is_file():
            break
        out.append(copy)
    return out


def _read_back(path: Path, *, lines: int, max_bytes: int) -> tuple[bytes, bool]:
    """The newest bytes of the log and its copies, joined oldest first; and whether the
    read stopped before the oldest copy's start (so the first line may be partial).

    Stops once more than `lines` line breaks are in hand (the first, partial, line is
    then dropped anyway) or `max_bytes` are read."""
    parts = _parts(path)
    pieces: list[bytes] = []  # newest first
    breaks = 0
    budget = max_bytes
    for part in parts:
        try:
            f = part.open("rb")
        except FileNotFoundError:
            continue  # the live file gone (a copy just shifting): the copies may remain
        with f:
            pos = f.seek(0, os.SEEK_END)
            part_chunks: list[bytes] = []
            while pos > 0 and budget > 0 and breaks <= lines:
                n = min(CHUNK_BYTES, pos, budget)
                pos -= n
                f.seek(pos)
                chunk = f.read(n)
                part_chunks.append(chunk)
                budget -= len(chunk)
                breaks += chunk.count(b"\n")
            data = b"".join(reversed(part_chunks))
        if data and pieces and not data.endswith(b"\n"):
            data += b"\n"  # a copy ends where the next file starts a new line
            breaks += 1
        pieces.append(data)
        if pos > 0:
            return b"".join(reversed(pieces)), True
        if breaks > lines or budget <= 0:
            break
    # Stopped at a file's start: the first line is whole unless an older copy exists.
    oldest_reached = len(pieces) == len(parts)
    return b"".join(reversed(pieces)), not oldest_reached and breaks <= lines


def read_tail(
    path: Path,
    *,
    lines: int = DEFAULT_LINES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    secrets: Collection[str] = (),
) -> Tail:
    """The last `lines` lines of the log at `path` and its rotated copies (module
    docstring), reading at most `max_bytes`, with every `secrets` value masked.

    FileNotFoundError when neither the log nor any copy exists."""
    if lines < 1 or max_bytes < 1:
        raise ValueError("lines and max_bytes must be at least 1")
    if not path.exists() and not path.with_name(f"{path.name}.1").exists():
        raise FileNotFoundError(path)
    data, partial = _read_back(path, lines=lines, max_bytes=max_bytes)
    last_open = bool(data) and not data.endswith(b"\n")
    if not last_open:
        data = data[:-1]
    if not data:
        return Tail(lines=(), cut=False)
    raw = data.split(b"\n")
    endless = False
    if partial:
        if len(raw) > 1:
            raw = raw[1:]  # starts inside a line: half a line, or half a secret
        else:
            # One line longer than the byte cap: its end, minus what may end a secret.
            longest = max((len(s.encode()) for s in secrets if s), default=1)
            raw = [raw[0][longest - 1 :]]
            endless = True
    text = tuple(b.decode("utf-8", errors="replace") for b in raw[-lines:])
    kept = redact(text, secrets)
    if endless:
        return Tail(lines=("…" + kept[0],), cut=True, last_open=last_open)
    return Tail(lines=kept, cut=partial and len(kept) < lines, last_open=last_open)
