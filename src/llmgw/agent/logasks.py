"""The controller's log asks answered (wire/logs.py; the reading is logtail.py).

An ask comes in a heartbeat reply; its answer goes in the next heartbeat, which the
heartbeater then sends at once rather than an interval later. The agent's own HTTP
surface serves no logs: it answers any local user without a token, and the logs are
mode 0600 (an engine may print what it was given).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from llmgw.agent.logtail import read_tail
from llmgw.runtime.logs import kv
from llmgw.wire.logs import MAX_TAIL_BYTES, LogAnswer, LogAsk

# A shard's log and the values masked in it; None: this node holds no log of it
# (Supervisor.log_source).
log = logging.getLogger(__name__)

Source = Callable[[str, int], tuple[Path, tuple[str, ...]] | None]


async def answer(ask: LogAsk, source: Source) -> LogAnswer:
    """One ask's answer; the file is read in a thread (up to MAX_TAIL_BYTES from its end)."""
    found = source(ask.replica_id, ask.rank)
    if found is None:
        return LogAnswer(id=ask.id, outcome="missing")
    path, secrets = found
    try:
        tail = await asyncio.to_thread(
            read_tail, path, lines=ask.tail, max_bytes=MAX_TAIL_BYTES, secrets=secrets
        )
    except FileNotFoundError:
        return LogAnswer(id=ask.id, outcome="missing")
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return LogAnswer(id=ask.id, outcome="unreadable", error=f"{path.name}: {why}")
    except Exception as exc:
        # Not expected: answered all the same, so the caller hears why, and logged whole.
        log.exception(kv("log ask failed", replica=ask.replica_id, rank=ask.rank))
        return LogAnswer(
            id=ask.id, outcome="unreadable", error=f"{path.name}: {type(exc).__name__}"
        )
    return LogAnswer(
        id=ask.id, outcome="found", lines=tail.lines, cut=tail.cut, last_open=tail.last_open
    )


async def answer_all(asks: tuple[LogAsk, ...], source: Source) -> tuple[LogAnswer, ...]:
    """The answers, in the asks' order (one at a time: a node has few asks waiting)."""
    return tuple([await answer(ask, source) for ask in asks])
