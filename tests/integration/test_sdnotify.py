"""systemd's notify protocol against a real AF_UNIX datagram socket, from each real program.

A test binds the socket systemd would (a path, or `@name` in the abstract
namespace), starts the program with `$NOTIFY_SOCKET` naming it, and reads what
arrives: READY=1 once the program serves, WATCHDOG=1 when `$WATCHDOG_USEC` is
set, STOPPING=1 after SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.runtime.sdnotify import Notifier
from llmgw.testing import Program, start_program
from tests.integration.router_fixtures import base_config, write_config

pytestmark = pytest.mark.slow


class NotifySocket:
    """What systemd holds: a datagram socket, and every message that reached it."""

    def __init__(self, sock: socket.socket, env_value: str) -> None:
        self.sock = sock
        # What goes into $NOTIFY_SOCKET: a path, or "@name".
        self.env_value = env_value
        self.messages: list[str] = []

    def wait_for(self, line: str, *, timeout_s: float = 30.0) -> list[str]:
        """Read datagrams until one has `line` among its lines; all read so far."""
        deadline = time.monotonic() + timeout_s
        while not any(line in m.splitlines() for m in self.messages):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {line!r} within {timeout_s}s; got {self.messages}")
            self.sock.settimeout(left)
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
        return self.messages


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    try:
        yield NotifySocket(sock, str(path))
    finally:
        sock.close()


@pytest.fixture
def abstract_socket() -> Iterator[NotifySocket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"llmgw-test-{os.getpid()}-{time.monotonic_ns()}"
    sock.bind("\0" + name)
    try:
        yield NotifySocket(sock, "@" + name)
    finally:
        sock.close()


def _env(notify: NotifySocket, watchdog_usec: int | None = None) -> dict[str, str]:
    env = {"NOTIFY_SOCKET": notify.env_value}
    if watchdog_usec is not None:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    return env


def _stop_and_expect_stopping(prog: Program, notify: NotifySocket) -> None:
    prog.signal(signal.SIGTERM)
    notify.wait_for("STOPPING=1")
    # Waited for, not stopped again: a second SIGTERM after the loop closed would kill it.
    assert prog.proc.wait(timeout=30) == 0


class TestNotifier:
    """The notifier itself: one datagram per message, to a path or an abstract name."""

    def test_ready_reaches_a_path_socket(self, notify_socket: NotifySocket) -> None:
        """READY=1 arrives as its own line in one datagram."""
        env = _env(notify_socket)
        assert Notifier.take(env).ready("serving")
        assert notify_socket.wait_for("READY=1") == ["READY=1\nSTATUS=serving"]

    def test_abstract_namespace(self, abstract_socket: NotifySocket) -> None:
        """`@name` is the abstract namespace: the leading @ becomes a NUL byte."""
        assert Notifier.take(_env(abstract_socket)).stopping()
        assert abstract_socket.wait_for("STOPPING=1") == ["STOPPING=1"]

    def test_take_removes_the_variables(self, notify_socket: NotifySocket) -> None:
        """What the program starts afterwards inherits none of the three variables."""
        env = {**_env(notify_socket, 4_000_000), "WATCHDOG_PID": str(os.getpid()), "X": "1"}
        notifier = Notifier.take(env)
        assert env == {"X": "1"}
        assert notifier.watchdog_s == 2.0

    def test_watchdog_for_another_pid_is_not_ours(self, notify_socket: NotifySocket) -> None:
        """`$WATCHDOG_PID` naming another process means this one sends no pings."""
        env = {**_env(notify_socket, 4_000_000), "WATCHDOG_PID": str(os.getpid() + 1)}
        assert Notifier.take(env).watchdog_s is None

    def test_no_socket_is_silent(self) -> None:
        """Without $NOTIFY_SOCKET nothing is sent and nothing fails."""
        assert not Notifier.take({}).ready()

    def test_unsupported_address_is_ignored(self) -> None:
        """A vsock address is not ours to speak: no message, no error."""
        assert not Notifier.take({"NOTIFY_SOCKET": "vsock:2:1234"}).ready()

    def test_gone_socket_is_logged_not_raised(self, tmp_path: Path) -> None:
        """A supervisor that went away never stops the program."""
        assert not Notifier.take({"NOTIFY_SOCKET": str(tmp_path / "gone")}).ready()

    async def test_keep_alive_pings(self, notify_socket: NotifySocket) -> None:
        """WATCHDOG=1 goes out at once and then every half of WATCHDOG_USEC."""
        notifier = Notifier.take(_env(notify_socket, 100_000))
        task = asyncio.create_task(notifier.keep_alive())
        try:
            got = await asyncio.to_thread(notify_socket.wait_for, "WATCHDOG=1")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert got[0] == "WATCHDOG=1"


class TestProgramsNotify:
    """Each real program tells the socket it is ready, pings its watchdog and stops."""

    def test_sim_engine(self, notify_socket: NotifySocket, tmp_path: Path) -> None:
        """The sim-engine sends READY=1, WATCHDOG=1, then STOPPING=1 on SIGTERM."""
        args = ["sim-engine", "--port", "0", "--model", "m"]
        with start_program(args, env=_env(notify_socket, 200_000), log_dir=tmp_path) as prog:
            notify_socket.wait_for("READY=1")
            notify_socket.wait_for("WATCHDOG=1")
            _stop_and_expect_stopping(prog, notify_socket)

    def test_controller_and_agent(
        self, notify_socket: NotifySocket, abstract_socket: NotifySocket, tmp_path: Path
    ) -> None:
        """The controller (path socket) and an agent (abstract socket) both report ready;
        the agent's engines never inherit its socket."""
        args = ["controller", "--port", "0", "--database", "memory://"]
        with start_program(args, env=_env(notify_socket, 400_000), log_dir=tmp_path) as ctl:
            notify_socket.wait_for("READY=1")
            notify_socket.wait_for("WATCHDOG=1")
            agent_args = [
                "agent",
                "--controller",
                ctl.url,
                "--node",
                "n1",
                "--gpus",
                "1xH100-80G",
                "--state-dir",
                str(tmp_path / "agent"),
                "--address",
                "127.0.0.1",
            ]
            env = _env(abstract_socket)
            with start_program(agent_args, env=env, log_dir=tmp_path) as agent:
                assert abstract_socket.wait_for("READY=1")[0].startswith("READY=1")
                _stop_and_expect_stopping(agent, abstract_socket)
            _stop_and_expect_stopping(ctl, notify_socket)

    @pytest.mark.parametrize("workers", [1, 2])
    def test_router(self, notify_socket: NotifySocket, tmp_path: Path, workers: int) -> None:
        """The router (one process, or a supervisor and its workers) sends READY=1 once."""
        path = write_config(tmp_path / "router.yaml", base_config(endpoints=[]))
        args = ["router", "--config", str(path), "--port", "0", "--workers", str(workers)]
        with start_program(args, env=_env(notify_socket, 400_000), log_dir=tmp_path) as prog:
            notify_socket.wait_for("WATCHDOG=1")
            _stop_and_expect_stopping(prog, notify_socket)
        ready = [m for m in notify_socket.messages if "READY=1" in m.splitlines()]
        assert len(ready) == 1, notify_socket.messages
