"""Engine logs on request (`llmgw ctl logs`, docs/controller.md "Replica logs").

The agent serves nothing off its node (its HTTP surface is loopback only), so a log
travels the way everything else does: the controller's heartbeat reply carries a
`LogAsk`, and the agent's next heartbeat, sent at once, carries the `LogAnswer`.
An agent that does not know the fields ignores the ask; the controller then answers
its caller 504 once the ask expires.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

# `tail`: lines asked for, by default and at most.
DEFAULT_TAIL_LINES = 100
MAX_TAIL_LINES = 10_000
TailLines = Annotated[int, msgspec.Meta(ge=1, le=MAX_TAIL_LINES)]
# A replica's ranks are its nodes: far fewer. Bounds the query parameter.
MAX_RANK = 100_000
# Bytes of log one answer reads at most (the newest): a long tail of long lines comes
# back shorter, with `cut` set. Bounds a heartbeat carrying answers.
MAX_TAIL_BYTES = 512 * 1024


class LogAsk(msgspec.Struct, frozen=True, kw_only=True):
    """In a HeartbeatReply: send the last `tail` lines of this shard's engine log."""

    # The controller's name for this ask; the answer carries it back.
    id: str
    replica_id: str
    rank: Annotated[int, msgspec.Meta(ge=0)]
    tail: TailLines = DEFAULT_TAIL_LINES


class LogAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """In a Heartbeat: the answer to one LogAsk."""

    id: str
    # found: `lines` is the tail; missing: this node holds no log of that shard (never
    # ran here, or removed: only the newest `ended_logs_keep` ended shards keep theirs);
    # unreadable: the file could not be read (`error` says why).
    outcome: Literal["found", "missing", "unreadable"]
    # Oldest first, without line breaks; the shard's key and secrets masked as `***`.
    lines: tuple[str, ...] = ()
    # True: the byte cap left older lines out (fewer lines than asked came back).
    cut: bool = False
    # True: the last line has no line break yet (the engine is still writing it).
    last_open: bool = False
    error: str = ""


class ReplicaLogs(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /admin/replicas/{id}/logs` (admin token only)."""

    replica: str
    rank: int
    node: str
    # Oldest first, without line breaks; the engine's key and secrets masked as `***`.
    lines: tuple[str, ...]
    # True: the byte cap (MAX_TAIL_BYTES) left older lines out: fewer than asked came.
    cut: bool
    # True: the last line has no line break yet (`ctl logs --follow` holds it back).
    last_open: bool = False
