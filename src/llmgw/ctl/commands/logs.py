"""`llmgw ctl logs REPLICA [--tail N] [--rank R] [--follow]`: an engine's log (docs/ctl.md).

The lines are printed raw, one per line, no table: made visible (ctl.shown: an escape
sequence in a log is shown as `\\x1b`, never acted on) and written through ctl's
streams, so `| head` ends it quietly as it does every command.

`--follow` polls: every `--interval` seconds it asks for the tail again and prints what
follows the lines it already printed (`new_lines`). The agent reads across a
copy-truncate rotation (the live log and its copies, newest last), so a rotation shows
no seam; what it loses (lines written between a copy and its truncate) is lost. When
more lines came than one tail holds, or the tail no longer overlaps what was printed, the
whole new tail is printed after a note on stderr that lines may be missing. A last line
still being written is held back until it ends. Lines repeated word for word can hide
new ones that repeat them: the overlap is found by content, the only thing a log kept
by copy-truncate keeps stable.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from llmgw.adminclient.errors import AdminError, AdminNotFound, AdminUnauthorized
from llmgw.ctl.context import Ctx
from llmgw.ctl.errors import CtlError
from llmgw.ctl.shown import visible
from llmgw.wire.logs import MAX_TAIL_LINES

# What --follow asks for each poll, at least: lines written between two polls beyond
# this show as a gap.
FOLLOW_TAIL = 1_000
# Lines that must match for `new_lines` to take a place in the tail as where the printed
# lines end: enough that a run of repeated lines rarely fools it, few enough that a
# rotated copy's marker line or lost lines further back do not matter.
OVERLAP_LINES = 50
# Exit status on Ctrl-C while following: 128 + SIGINT, as a shell reports it.
EXIT_INTERRUPTED = 130


def new_lines(printed: Sequence[str], tail: Sequence[str]) -> tuple[list[str], bool]:
    """The lines of `tail` that follow `printed` (the lines printed so far, oldest
    first, as many as the last tail held), and whether some may be missing.

    `printed` ends somewhere in `tail`: at the latest place where `tail` up to there ends
    with `printed`'s last OVERLAP_LINES lines (or as many as `tail` has before that place,
    when it starts inside them). None: more came than a tail holds, or the log was
    replaced; the whole tail is new, and some may be missing. The latest place: a line
    repeated word for word counts as already printed."""
    if not printed or not tail:
        return list(tail), False
    last = printed[-1]
    for end in range(len(tail), 0, -1):
        if tail[end - 1] != last:
            continue
        lo = end - min(end, len(printed), OVERLAP_LINES)
        if lo == 0 and 1 < end < len(printed):
            # The tail starts inside what was printed: its first line may be a rotated
            # copy's "bytes left out" marker, or a line the byte cap cut.
            lo = 1
        if list(tail[lo:end]) == list(printed[len(printed) - (end - lo) :]):
            return list(tail[end:]), False
    return list(tail), True


def _write(ctx: Ctx, lines: Sequence[str]) -> None:
    for line in lines:
        ctx.out.write(visible(line) + "\n")
    ctx.out.flush()


def logs(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.rank < 0:
        raise CtlError("--rank must be 0 or more")
    if args.follow and args.interval <= 0:
        raise CtlError("--interval must be above 0")
    client = ctx.client()
    got = client.replica_logs(args.replica, tail=args.tail, rank=args.rank)
    if got.cut:
        ctx.err.write("llmgw ctl: older lines left out (over the answer's byte limit)\n")
    if not args.follow:
        _write(ctx, got.lines)
        return 0
    # A line still being written is printed once it ends.
    done = got.lines[:-1] if got.last_open else got.lines
    _write(ctx, done)
    printed = list(done)
    tail = min(max(args.tail, FOLLOW_TAIL), MAX_TAIL_LINES)
    try:
        while True:
            ctx.sleep(args.interval)
            try:
                tail = max(args.tail, FOLLOW_TAIL)
                got = client.replica_logs(
                    args.replica, tail=min(tail, MAX_TAIL_LINES), rank=args.rank
                )
            except (AdminNotFound, AdminUnauthorized):
                raise
            except AdminError as exc:
                # A controller or agent that is away a moment: said, and asked again.
                ctx.err.write(f"llmgw ctl: {visible(exc)}; retrying\n")
                ctx.err.flush()
                continue
            done = got.lines[:-1] if got.last_open else got.lines
            fresh, gap = new_lines(printed, done)
            if gap:
                ctx.err.write("llmgw ctl: lines may be missing here (more than a poll reads)\n")
                ctx.err.flush()
            _write(ctx, fresh)
            printed = list(done)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
