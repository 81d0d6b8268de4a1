"""The controller's heartbeat reply as this agent reads it: shard by shard.

Controllers are upgraded before agents (docs/operations.md#which-versions-run-together),
so a reply may hold a shard this version cannot read: an engine kind added since, a
kind of secret reference it does not know. Read as one strict struct, one such shard
made the agent refuse the whole reply at every beat: nothing started or stopped on the
node, and each beat counted as failed. Read shard by shard, one it cannot read is not
started and is reported failed with the reason, as a shard the node policy refuses; one
it already runs is left as it is (never stopped for being listed); the rest is acted on.

A shard without a readable identity (replica_id, rank) cannot be reported or kept
apart from the others: the reply is refused whole, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from typing import Annotated

import msgspec

from llmgw.wire.agent import HeartbeatReply, ShardSpec, ShardStatus
from llmgw.wire.logs import LogAsk


class _Entries(msgspec.Struct, frozen=True, kw_only=True):
    """HeartbeatReply with its shards undecoded, each read on its own."""

    shards: tuple[msgspec.Raw, ...]
    interval_s: float = 2.0
    log_asks: tuple[msgspec.Raw, ...] = ()


class _Identity(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    rank: Annotated[int, msgspec.Meta(ge=0)]


class UnreadShard(msgspec.Struct, frozen=True, kw_only=True):
    """A shard the reply lists that this agent cannot read."""

    replica_id: str
    rank: int
    # What could not be read, in msgspec's words ("Invalid enum value 'x' - at `$.engine`").
    reason: str

    @property
    def key(self) -> tuple[str, int]:
        return (self.replica_id, self.rank)


class ReadReply(HeartbeatReply, frozen=True, kw_only=True):
    """A reply as the agent read it: the shards it can run, and those it cannot read."""

    unread: tuple[UnreadShard, ...] = ()


def read_reply(body: bytes) -> ReadReply:
    """The reply in `body`; raises msgspec.DecodeError when it cannot be read at all."""
    got = msgspec.json.decode(body, type=_Entries)
    shards: list[ShardSpec] = []
    unread: list[UnreadShard] = []
    for raw in got.shards:
        try:
            shards.append(msgspec.json.decode(raw, type=ShardSpec))
        except msgspec.ValidationError as exc:
            who = msgspec.json.decode(raw, type=_Identity)
            unread.append(UnreadShard(replica_id=who.replica_id, rank=who.rank, reason=str(exc)))
    asks: list[LogAsk] = []
    for raw in got.log_asks:
        # An ask it cannot read (a field a newer controller added as required) goes
        # unanswered: the operator's request times out, the shards are acted on.
        with contextlib.suppress(msgspec.ValidationError):
            asks.append(msgspec.json.decode(raw, type=LogAsk))
    return ReadReply(
        shards=tuple(shards),
        interval_s=got.interval_s,
        unread=tuple(unread),
        log_asks=tuple(asks),
    )


def failed_statuses(
    unread: Collection[UnreadShard], running: Collection[tuple[str, int]]
) -> list[ShardStatus]:
    """Each unread shard the agent does not run, reported failed with its reason."""
    return [
        ShardStatus(
            replica_id=u.replica_id,
            rank=u.rank,
            state="failed",
            log_tail=(f"llmgw agent: this agent cannot read the shard (upgrade it): {u.reason}",),
        )
        for u in unread
        if u.key not in running
    ]
