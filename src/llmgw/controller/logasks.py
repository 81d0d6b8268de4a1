"""Engine logs asked of agents, waiting for their answers (wire/logs.py).

The controller never calls an agent: an agent serves loopback only and reaches the
controller, not the other way round (docs/architecture.md). So an operator's
`GET /admin/replicas/{id}/logs` leaves an ask here for the replica's node; each
heartbeat reply to that node carries its waiting asks, and the agent's next heartbeat,
sent at once, carries the answers, which wake the waiting request. An ask is repeated
in every reply until answered or given up (a lost reply is no lost ask), and only the
node's own heartbeat can answer it: the answers are taken after the heartbeat was
accepted, so a second agent claiming the node's name (409) answers nothing.

Leader only: agents heartbeat the leader, so an ask left on a standby would never be
answered (the API answers 503 there instead).

    LogAskRefused          why an ask cannot be made
    ├── TooManyAsks        the node already has MAX_PER_NODE waiting
    └── NoAnswer           the agent did not answer in time (down, or too old to know)
"""

from __future__ import annotations

import asyncio
import secrets

from llmgw.wire.logs import LogAnswer, LogAsk

# Asks one node may have waiting at once: each answer may carry up to MAX_TAIL_BYTES
# of log in one heartbeat, whose body the controller bounds.
MAX_PER_NODE = 4


class LogAskRefused(Exception):
    pass


class TooManyAsks(LogAskRefused):
    pass


class NoAnswer(LogAskRefused):
    pass


class LogAsks:
    """The asks waiting per node, each with the future its request awaits."""

    def __init__(self, *, max_per_node: int = MAX_PER_NODE) -> None:
        self._max = max_per_node
        self._waiting: dict[str, dict[str, tuple[LogAsk, asyncio.Future[LogAnswer]]]] = {}

    def pending(self, node: str) -> tuple[LogAsk, ...]:
        """What the next heartbeat reply to `node` carries, oldest first."""
        return tuple(ask for ask, fut in self._waiting.get(node, {}).values() if not fut.done())

    def answered(self, node: str, answers: tuple[LogAnswer, ...]) -> None:
        """Wake the requests whose asks `node` answered; other ids are ignored (given up
        already, or another node's)."""
        waiting = self._waiting.get(node, {})
        for answer in answers:
            entry = waiting.get(answer.id)
            if entry is not None and not entry[1].done():
                entry[1].set_result(answer)

    async def ask(
        self, node: str, *, replica_id: str, rank: int, tail: int, timeout_s: float
    ) -> LogAnswer:
        """The answer of `node`'s agent; TooManyAsks, or NoAnswer after `timeout_s`."""
        waiting = self._waiting.setdefault(node, {})
        if len(waiting) >= self._max:
            raise TooManyAsks(f"node {node} already has {len(waiting)} log requests waiting")
        ask = LogAsk(id=secrets.token_hex(8), replica_id=replica_id, rank=rank, tail=tail)
        future: asyncio.Future[LogAnswer] = asyncio.get_running_loop().create_future()
        waiting[ask.id] = (ask, future)
        # No await between here and try: the ask is removed exactly once, however the
        # request ends (answered, timed out, or its client gone).
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise NoAnswer(f"no answer from the agent on node {node} in {timeout_s:g}s") from None
        finally:
            del waiting[ask.id]
            if not waiting:
                self._waiting.pop(node, None)
