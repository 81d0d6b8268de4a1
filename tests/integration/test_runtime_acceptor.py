"""runtime/acceptor.py: every waiting connection is accepted at once, on uvloop too."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
import uvloop

from llmgw.runtime.acceptor import PAUSE_S, Acceptor
from llmgw.testing.wait import until


class _Counting(asyncio.Protocol):
    made: list[asyncio.Transport]

    def __init__(self, made: list[Any]) -> None:
        self.made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.append(transport)


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    return sock


def _on_uvloop(coro: Callable[[], Any]) -> Any:
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(coro())
    finally:
        loop.close()


class _Scarce:
    """A listening socket out of descriptors for its first `fails` accepts."""

    def __init__(self, real: socket.socket, fails: int) -> None:
        self.real = real
        self.fails = fails
        self.calls: list[float] = []  # when accept() was called (monotonic)

    def fileno(self) -> int:
        return self.real.fileno()

    def setblocking(self, flag: bool) -> None:
        self.real.setblocking(flag)

    def accept(self) -> tuple[socket.socket, Any]:
        self.calls.append(time.monotonic())
        if self.fails:
            self.fails -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return self.real.accept()

    def close(self) -> None:
        self.real.close()


class TestAcceptor:
    """The acceptor takes every waiting connection and pauses when out of descriptors."""

    def test_connections_waiting_together_are_all_accepted_in_one_turn(self) -> None:
        """50 clients whose handshakes the kernel completed while the loop was busy are all
        taken on the next turn (uvloop's own server takes one per turn: 50 turns)."""

        async def main() -> tuple[int, int]:
            loop = asyncio.get_running_loop()
            sock = _listener()
            made: list[asyncio.Transport] = []
            acceptor = Acceptor(loop, sock, lambda: _Counting(made))
            acceptor.start()
            clients = [socket.create_connection(sock.getsockname()) for _ in range(50)]
            try:
                turns = 0
                while len(made) < 50 and turns < 200:
                    await asyncio.sleep(0)
                    turns += 1
                return len(made), turns
            finally:
                for c in clients:
                    c.close()
                acceptor.close()
                for t in made:
                    t.close()

        made, turns = _on_uvloop(main)
        assert made == 50
        assert turns <= 5, turns

    def test_close_stops_accepting_and_closes_the_socket(self) -> None:
        """Close stops accepting and closes the socket."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            sock = _listener()
            addr = sock.getsockname()
            made: list[asyncio.Transport] = []
            acceptor = Acceptor(loop, sock, lambda: _Counting(made))
            acceptor.start()
            acceptor.close()
            acceptor.close()  # twice is harmless
            assert sock.fileno() == -1
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(addr, timeout=2)

        _on_uvloop(main)

    def test_out_of_descriptors_pauses_accepting_then_resumes(
        self,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """EMFILE does not spin the loop on a socket that stays readable: accepting pauses
        for PAUSE_S (one warning), the client waits in the kernel's queue, then is served."""

        async def main() -> tuple[list[float], float]:
            loop = asyncio.get_running_loop()
            scarce = _Scarce(_listener(), fails=1)
            made: list[asyncio.Transport] = []
            acceptor = Acceptor(loop, scarce, lambda: _Counting(made))  # type: ignore[arg-type]
            acceptor.start()
            client = socket.create_connection(scarce.real.getsockname())
            t0 = loop.time()
            try:
                await until(lambda: made, timeout_s=5, every_s=0.01, what="the client accepted")
                return scarce.calls, loop.time() - t0
            finally:
                client.close()
                acceptor.close()
                for t in made:
                    t.close()

        with caplog.at_level(logging.WARNING, logger="llmgw.runtime.acceptor"):
            calls, waited = _on_uvloop(main)
        # One failed accept, then none until the pause was over (the loop did not spin):
        # the client's, and the one that found the queue empty.
        assert len(calls) == 3
        assert calls[1] - calls[0] >= PAUSE_S * 0.9
        assert waited >= PAUSE_S * 0.9
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1
        assert "not accepting" in warnings[0]
        assert "Too many open files" in warnings[0]
