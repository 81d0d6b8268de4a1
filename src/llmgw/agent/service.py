"""The agent: GPUs, engines and heartbeats wired together, as three loops.

- supervise: every `interval_s`, poll GPU health and tick the supervisor
  (reap exits, probe health, rotate logs, persist state);
- heartbeat: report, and apply the answer's desired set (and send the engine logs it
  asks for, logasks.py, with the next beat, at once);
- log watch: every `logfiles.CHECK_S`, rotate the engine logs past their limit
  (an engine writing fast would pass it by a whole tick's output, agent/logfiles.py).

They run in one TaskGroup on one event loop, so the supervisor is only ever
touched from the loop thread and needs no lock.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from llmgw.agent import logasks, logfiles
from llmgw.agent.config import AgentConfig
from llmgw.agent.gpus.base import GpuInventory
from llmgw.agent.heartbeat import Heartbeater, HeartbeatSender
from llmgw.agent.hostmem import host_memory_mib
from llmgw.agent.probe import HealthProbe
from llmgw.agent.replyread import ReadReply, UnreadShard, failed_statuses
from llmgw.agent.supervisor import Supervisor
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.runtime.logs import kv
from llmgw.runtime.repeats import FailureLog
from llmgw.wire.agent import GPU, Heartbeat, HeartbeatReply, ShardStatus
from llmgw.wire.logs import LogAnswer, LogAsk

log = logging.getLogger(__name__)


class ControllerView(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    # Unix seconds of the last accepted heartbeat; None before the first.
    last_ok_at: float | None
    consecutive_failures: int
    last_error: str | None


class AgentStatus(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /status`: what this agent sees (for people and tests, not a wire contract)."""

    node: str
    address: str
    inventory: str
    agent_started_at: float
    gpus: tuple[GPU, ...]
    shards: tuple[ShardStatus, ...]
    controller: ControllerView


class Agent:
    def __init__(
        self,
        *,
        config: AgentConfig,
        inventory: GpuInventory,
        supervisor: Supervisor,
        client: HeartbeatSender,
        probe: HealthProbe,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.inventory = inventory
        self.supervisor = supervisor
        self._client = client
        self._probe = probe
        self._clock = clock
        self.clock = clock
        self.started_at = clock.wall()
        # The last Heartbeat.seq built; each build takes the next (a retry after a
        # failed send is a new build, which is fine: only the order matters).
        self.seq = 0
        # Set when the loops died of an unexpected error (app.py); the process exits 1.
        self.crashed = False
        # Set when they stopped because the state folder was refused at run time (a
        # symlink planted at the state file's temp name): one line, exit 2, as at start.
        self.refusal: str | None = None
        # Shards the last reply listed that this agent cannot read (replyread.py).
        self._unread: tuple[UnreadShard, ...] = ()
        # A full disk fails every tick and every log pass: said once, then every few
        # minutes with a count, and once when it clears (runtime/repeats.py).
        self._tick_failures = FailureLog(
            "supervise tick failed",
            cleared="supervise tick works again",
            count_as="ticks_failed",
            logger=log,
            level=logging.ERROR,
        )
        self._log_failures = FailureLog(
            "engine log rotation failed",
            cleared="engine log rotation works again",
            count_as="passes_failed",
            logger=log,
            level=logging.ERROR,
        )
        # The log asks of the last reply not yet answered (logasks.py), and the answers
        # the next heartbeat carries; the heartbeater reads them just before building it.
        self._asks: tuple[LogAsk, ...] = ()
        self._answers: tuple[LogAnswer, ...] = ()
        self.heartbeater = Heartbeater(
            client=client,
            build=self.heartbeat,
            on_reply=self._on_reply,
            interval_s=config.interval_s,
            prepare=self._answer_asks,
            hurry=lambda: bool(self._asks),
            clock=clock,
        )

    def heartbeat(self) -> Heartbeat:
        self.seq += 1
        return Heartbeat(
            node=self.config.node,
            address=self.config.address,
            gpus=self.inventory.gpus(),
            fabrics=self.config.fabric,
            labels=dict(self.config.label),
            shards=self.statuses(),
            agent_started_at=self.started_at,
            seq=self.seq,
            port_range=self.config.ports,
            policy=self.supervisor.policy,
            host_memory_mib=host_memory_mib(self.config.host_memory_mib),
            log_answers=self._answers,
        )

    async def _answer_asks(self) -> None:
        self._answers = await logasks.answer_all(self._asks, self.supervisor.log_source)

    def _on_reply(self, reply: HeartbeatReply) -> None:
        unread = reply.unread if isinstance(reply, ReadReply) else ()
        before = {u.key for u in self._unread}
        for u in unread:
            if u.key not in before:
                log.error(
                    kv(
                        "shard not started, cannot read it",
                        replica=u.replica_id,
                        rank=u.rank,
                        error=u.reason,
                    )
                )
        self._unread = unread
        self.supervisor.apply(reply.shards, unread={u.key for u in unread})
        # Delivered: an ask the reply repeats before its request saw the answer is not
        # read again (nor is the next beat hurried for it).
        sent = {a.id for a in self._answers}
        self._asks = tuple(a for a in reply.log_asks if a.id not in sent)
        self._answers = ()

    def statuses(self) -> tuple[ShardStatus, ...]:
        """The supervisor's shards and those listed that this agent cannot read, sorted."""
        running = self.supervisor.statuses()
        failed = failed_statuses(self._unread, {(s.replica_id, s.rank) for s in running})
        return tuple(sorted((*running, *failed), key=lambda s: (s.replica_id, s.rank)))

    def status(self) -> AgentStatus:
        hb = self.heartbeater
        return AgentStatus(
            node=self.config.node,
            address=self.config.address,
            inventory=self.inventory.kind,
            agent_started_at=self.started_at,
            gpus=self.inventory.gpus(),
            # The engines' keys go to the controller only, never to this page.
            shards=tuple(msgspec.structs.replace(st, api_key="") for st in self.statuses()),
            controller=ControllerView(
                url=self._client.url,
                last_ok_at=hb.last_ok_at,
                consecutive_failures=hb.failures,
                last_error=hb.last_error,
            ),
        )

    async def supervise_tick(self) -> None:
        await self.inventory.refresh()
        await self.supervisor.tick()

    async def supervise_step(self) -> None:
        """One supervise tick, its failure logged and retried next tick."""
        try:
            await self.supervise_tick()
        except OSError as exc:
            # A full disk or an unreadable /proc entry must not end supervision:
            # the engines still need watching.
            self._tick_failures.failed(str(exc), now=self._clock.monotonic())
            return
        self._tick_failures.worked()

    async def _supervise(self) -> None:
        while True:
            await self.supervise_step()
            # An engine call that ends (a sleep, a wake) is acted on at once: a swap's
            # wake follows its sleep without waiting out the interval.
            await self.supervisor.wait_call_finished(timeout_s=self.config.interval_s)

    async def tidy_step(self) -> None:
        """One pass of log rotation, its failure logged and retried next pass."""
        try:
            await self.supervisor.tidy_logs()
        except OSError as exc:
            self._log_failures.failed(str(exc), now=self._clock.monotonic())
            return
        self._log_failures.worked()

    async def _watch_logs(self) -> None:
        while True:
            await self.tidy_step()
            await asyncio.sleep(logfiles.CHECK_S)

    async def run(self) -> None:
        """The loops until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._supervise())
            tg.create_task(self.heartbeater.run())
            tg.create_task(self._watch_logs())

    async def close(self) -> None:
        """After run() ends: stop engines if configured to, then release resources."""
        if self.config.stop_engines_on_exit:
            log.info("stopping engines on exit")
            await self.supervisor.stop_all()
        await self._client.close()
        await self._probe.close()
        await self.supervisor.close()
        self.inventory.close()
