"""Messages between a router's supervisor and its workers (`--workers N`).

Each worker has one Unix socket pair with the supervisor, inherited at start.
Frames are a 4-byte big-endian length and a msgpack body: one of the tagged
structs below. These never leave the host and both ends are the same
installed program, so they live here rather than in `llmgw.wire`.

Supervisor → worker: `Setup` (first, once), `Reload`, `Listed`, `Observed`,
`Ask`. Worker → supervisor: `Ready`, `Ask` (for the whole router's /metrics or
usage), `AskReply` (to the supervisor's asks).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import struct
from collections.abc import Callable
from typing import Literal

import msgspec

from llmgw.router.config import RouterConfig
from llmgw.router.replicas.registry import Stats
from llmgw.wire.endpoints import EndpointList
from llmgw.wire.leases import LeaseAnswer
from llmgw.wire.usage import TokenUsage, UsageReport

log = logging.getLogger(__name__)

_LEN = struct.Struct(">I")
# Bigger than any endpoint list or metrics page a router should ever carry.
MAX_FRAME = 256 * 1024 * 1024

# What an Ask wants: this worker's metrics text, its usage report (and start a
# new interval, or not), or — from a worker — the whole router's, or what became of
# the config file's last load (the supervisor's watcher's, as JSON).
AskWhat = Literal["metrics", "usage", "usage_peek", "config"]
# A worker's answer to "usage" and "usage_peek" (msgpack): its report, and its token
# counts since the last "usage" (tokenusage.TokenCounts.drain; none for a peek).
WorkerUsage = tuple[UsageReport, list[TokenUsage]]


class Setup(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Everything a new worker needs before it serves: sent once, first."""

    index: int
    workers: int
    # Columns of the shared in-flight table (shared.py).
    capacity: int
    router_id: str
    cfg: RouterConfig
    # The controller's last list; None when endpoints come from the file (or none yet).
    listed: EndpointList | None
    slots: dict[str, int]
    # The last scrape of each endpoint, so a restarted worker is not blind until the next.
    stats: dict[str, Stats]
    # The controller's last lease answer, so a restarted worker has its share at once,
    # and the number of the report it answered (`Leased.report`).
    lease: LeaseAnswer | None = None
    lease_report: int = 0


class Reload(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """A new configuration the supervisor loaded and validated."""

    cfg: RouterConfig
    slots: dict[str, int]


class Listed(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """A new endpoint list from the controller."""

    listed: EndpointList
    slots: dict[str, int]


class Leased(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """After each usage report: the controller's lease answer, if it came.

    Each worker enforces the router's whole RPM and TPM shares and budget allowances
    on the key rows all workers share (workers/keytable.py).
    """

    # False: the report failed; the workers only check whether their lease expired.
    delivered: bool
    # None when not delivered, or when the controller leases nothing.
    answer: LeaseAnswer | None = None
    # The number of the report answered: its "usage" Ask's (an allowance counts from it).
    report: int = 0


class Observed(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """One successful scrape of one endpoint."""

    id: str
    stats: Stats


class Ready(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """The worker serves the shared socket."""

    pid: int


class Learned(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """A worker's prefix-index records since its last batch (endpoint, chain, capacity
    units), forwarded by the supervisor to every other worker (prefix.PrefixIndex.journal)."""

    records: list[tuple[str, tuple[int, ...], int | None]]


class Ask(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    seq: int
    what: AskWhat
    # A "usage" ask's report number, counted by the supervisor from 1 (keytable.py).
    report: int = 0


class AskReply(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    seq: int
    body: bytes


Message = Setup | Reload | Listed | Leased | Observed | Ready | Learned | Ask | AskReply

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def frame(msg: Message) -> bytes:
    """A message as it goes on the wire: its length, then its msgpack body."""
    body = _encoder.encode(msg)
    return _LEN.pack(len(body)) + body


class ChannelClosed(Exception):
    """The other end went away (or sent something that is not a frame)."""


class Channel:
    """One end of a supervisor–worker socket pair: send, receive, and ask-and-wait."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._seq = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self.closed = False

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=MAX_FRAME)
        return cls(reader, writer)

    def send(self, msg: Message) -> None:
        """Queue a frame; to a closed or closing end it is dropped (the reader notices)."""
        self.send_frame(frame(msg))

    def send_frame(self, data: bytes) -> None:
        """Queue a frame made once by `frame()` (one message to several workers)."""
        if self.closed or self._writer.is_closing():
            return
        self._writer.write(data)

    def backlog(self) -> int:
        """Bytes sent but not yet taken by the other end (the kernel's buffer aside)."""
        return self._writer.transport.get_write_buffer_size()

    async def receive(self) -> Message:
        try:
            head = await self._reader.readexactly(_LEN.size)
            (size,) = _LEN.unpack(head)
            if size > MAX_FRAME:
                self._lost()
                raise ChannelClosed(f"frame of {size} bytes")
            return _decoder.decode(await self._reader.readexactly(size))
        except asyncio.IncompleteReadError as exc:
            self._lost()
            raise ChannelClosed("the other end closed the channel") from exc
        except (ConnectionError, msgspec.DecodeError) as exc:
            self._lost()
            raise ChannelClosed(str(exc) or type(exc).__name__) from exc

    async def ask(self, what: AskWhat, *, timeout_s: float, report: int = 0) -> bytes:
        """Send an Ask and wait for its AskReply (delivered by whoever runs `serve`)."""
        if self.closed:
            raise ChannelClosed("closed")
        seq = next(self._seq)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[seq] = fut
        try:
            self.send(Ask(seq=seq, what=what, report=report))
            async with asyncio.timeout(timeout_s):
                return await fut
        finally:
            self._waiting.pop(seq, None)

    def answered(self, msg: AskReply) -> None:
        fut = self._waiting.get(msg.seq)
        if fut is not None and not fut.done():
            fut.set_result(msg.body)

    async def serve(self, handle: Callable[[Message], None]) -> None:
        """Receive until the other end closes (ChannelClosed): Answers resolve asks, the
        rest go to `handle`, which must not block: what needs an await runs as a task
        (an ask answered on this same channel would otherwise wait on itself)."""
        while True:
            msg = await self.receive()
            if isinstance(msg, AskReply):
                self.answered(msg)
            else:
                handle(msg)

    def _lost(self) -> None:
        self.closed = True
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(ChannelClosed("the other end went away"))

    def close(self) -> None:
        self._lost()
        with contextlib.suppress(Exception):
            self._writer.close()
