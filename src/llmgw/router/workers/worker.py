"""One worker of a router started with `--workers N` (supervisor.py starts it).

A worker serves the listening socket its supervisor bound, with the same app
as a one-process router, minus the host's chores: it does not scrape engines,
watch the config file, follow the controller or report usage. The supervisor
does those once for the host and sends the results (ipc.py); the worker
applies them exactly where a one-process router applies its own loops'
results (`Router.apply_config`, `apply_list`, `Registry.observe`).

A worker whose channel to the supervisor closes (the supervisor died) stops
gracefully: a worker must never outlive its router.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

import msgspec

from llmgw.router.errors import RouterConfigError
from llmgw.router.wiring import Router
from llmgw.router.workers.ipc import (
    Ask,
    AskReply,
    AskWhat,
    Channel,
    ChannelClosed,
    Learned,
    Leased,
    Listed,
    Message,
    Observed,
    Ready,
    Reload,
    Setup,
    WorkerUsage,
)
from llmgw.router.workers.shared import SharedInflight
from llmgw.runtime.logs import kv

log = logging.getLogger(__name__)

# How long a worker waits for the whole router's /metrics or usage.
ASK_TIMEOUT_S = 5.0
# How often a worker sends what its prefix index learned to the other workers.
LEARN_FLUSH_S = 0.02


class WorkerSpec(msgspec.Struct, frozen=True):
    """The hidden `--worker` argument: `index,listen_fd,channel_fd,table_fd`."""

    index: int
    listen_fd: int
    channel_fd: int
    table_fd: int

    @classmethod
    def parse(cls, text: str) -> WorkerSpec:
        try:
            index, lfd, cfd, tfd = (int(x) for x in text.split(","))
        except ValueError:
            raise RouterConfigError(f"--worker {text!r}: want index,fd,fd,fd") from None
        return cls(index, lfd, cfd, tfd)

    def arg(self) -> str:
        return f"{self.index},{self.listen_fd},{self.channel_fd},{self.table_fd}"


class WorkerLink:
    """The worker's end of its channel: applies what the supervisor sends, answers asks."""

    def __init__(self, channel: Channel, setup: Setup, shared: SharedInflight) -> None:
        self.channel = channel
        self.setup = setup
        self.shared = shared
        self.state: Router | None = None
        # Set when the supervisor goes away: the worker stops (serve_app's stop_event).
        self.lost = asyncio.Event()

    def attach(self, state: Router) -> None:
        """Start applying to `state` (built from `setup`), with the setup's list and stats."""
        self.state = state
        s = self.setup
        state.worker_index = s.index
        if s.lease is not None:
            state.leased(s.lease, s.lease_report)
        if s.listed is not None:
            state.apply_list(s.listed)
        for eid, stats in s.stats.items():
            state.registry.observe(eid, stats)
        # Every worker learns what every worker sent where: without it each index saw
        # 1/N of the traffic, and on bench/routing.py's cache-starved variant two
        # workers lost about 6 points of engine hit rate against one.
        state.prefix.journal = []

    async def _share_learned(self) -> None:
        st = self.state
        assert st is not None
        while True:
            await asyncio.sleep(LEARN_FLUSH_S)
            journal = st.prefix.journal
            if journal:
                st.prefix.journal = []
                self.channel.send(Learned(records=journal))

    async def run(self) -> None:
        sharing = asyncio.create_task(self._share_learned())
        try:
            await self.channel.serve(self._handle)
        except ChannelClosed as exc:
            log.warning(kv("supervisor gone, stopping", worker=self.setup.index, error=exc))
        finally:
            sharing.cancel()
            # However the loop ends, this worker can no longer hear its supervisor (nor
            # notice it die): it stops rather than serve on, orphaned or stale.
            self.lost.set()

    def ready(self) -> None:
        self.channel.send(Ready(pid=os.getpid()))

    async def ask(self, what: AskWhat) -> bytes:
        """The whole router's metrics page or usage report, from the supervisor."""
        return await self.channel.ask(what, timeout_s=ASK_TIMEOUT_S)

    def _handle(self, msg: Message) -> None:
        try:
            self._apply(msg)
        except Exception:  # one message must not end the channel
            # As a one-process router whose reload fails: what it had stays in force.
            # The channel keeps being read, so the supervisor's death is still noticed.
            log.exception(kv("cannot apply a message from the supervisor", kind=type(msg).__name__))

    def _apply(self, msg: Message) -> None:
        st = self.state
        assert st is not None
        if isinstance(msg, Observed):
            # The supervisor logs a restart once for the host; each worker forgets.
            if st.registry.observe(msg.id, msg.stats):
                st.engine_restarted(msg.id)
            st.observed(msg.id)
        elif isinstance(msg, Listed):
            self.shared.slots = msg.slots
            st.apply_list(msg.listed)
        elif isinstance(msg, Leased):
            if msg.delivered:
                st.leased(msg.answer, msg.report)
            st.lease_expire()
        elif isinstance(msg, Reload):
            self.shared.slots = msg.slots
            st.apply_config(msg.cfg)
        elif isinstance(msg, Learned):
            st.prefix.replay(msg.records)
        elif isinstance(msg, Ask):
            self.channel.send(AskReply(seq=msg.seq, body=self._answer(st, msg)))
        else:
            log.warning(kv("unexpected message from the supervisor", kind=type(msg).__name__))

    @staticmethod
    def _answer(st: Router, ask: Ask) -> bytes:
        if ask.what == "metrics":
            return st.metrics.render()
        reset = ask.what == "usage"
        answer: WorkerUsage = (
            st.usage_report(reset=reset, report=ask.report),
            st.token_counts.drain() if reset else [],
        )
        return msgspec.msgpack.encode(answer)


async def connect(spec: WorkerSpec) -> tuple[WorkerLink, socket.socket]:
    """The channel, the Setup that comes first on it, the table and the listening socket."""
    # Only the supervisor reloads; SIGHUP's default action would end this process.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    chan_sock = socket.socket(fileno=spec.channel_fd)
    channel = await Channel.open(chan_sock)
    first = await channel.receive()
    if not isinstance(first, Setup):
        raise ChannelClosed(f"expected Setup, got {type(first).__name__}")
    shared = SharedInflight(
        spec.table_fd, workers=first.workers, index=spec.index, capacity=first.capacity
    )
    shared.slots = first.slots
    listen = socket.socket(fileno=spec.listen_fd)
    listen.setblocking(False)
    return WorkerLink(channel, first, shared), listen
