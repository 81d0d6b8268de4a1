"""Tell systemd (or any supervisor that speaks its notify protocol) how a program is doing.

With `Type=notify` systemd passes `$NOTIFY_SOCKET`, an AF_UNIX datagram socket (a
path, or `@name` in the abstract namespace); the protocol is one datagram of
`KEY=VALUE` lines per message, so no libsystemd is needed. A program sends
`READY=1` once it serves (systemd then starts what is ordered after it, and a
`systemctl start` returns), `STOPPING=1` when it begins to stop, and, when the unit
sets `WatchdogSec=` (systemd passes `$WATCHDOG_USEC`), `WATCHDOG=1` every half of
it: a program whose event loop hangs stops sending and is restarted.

`Notifier.take()` reads the variables and removes them from the environment, so
the processes a program starts afterwards (the agent's engines, the router's
workers) never speak for it. Without `$NOTIFY_SOCKET` every call does nothing.
A datagram that cannot be sent is logged and dropped: a supervisor that went away
must not stop the program.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import MutableMapping

from llmgw.runtime.logs import kv

log = logging.getLogger(__name__)

SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"


def address(value: str) -> str | None:
    """The socket address of a `$NOTIFY_SOCKET` value; None for one this cannot use.

    `@name` is Linux's abstract namespace (a leading NUL byte); a vsock address
    (`vsock:CID:PORT`, systemd in a VM's host) is not supported."""
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def watchdog_interval_s(usec: str | None, pid: str | None, own_pid: int) -> float | None:
    """Seconds between WATCHDOG=1 pings: half of `$WATCHDOG_USEC`; None for no watchdog
    (not set, not a positive integer, or `$WATCHDOG_PID` names another process)."""
    if not usec:
        return None
    if pid and pid != str(own_pid):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 / 2 if value > 0 else None


class Notifier:
    """Messages to one supervisor; every method is a no-op when there is none."""

    def __init__(self, socket_address: str | None, *, watchdog_s: float | None = None) -> None:
        # None: no supervisor listens (the program was not started with Type=notify).
        self.socket_address = socket_address
        # Seconds between WATCHDOG=1 pings; None: the unit sets no WatchdogSec.
        self.watchdog_s = watchdog_s

    @classmethod
    def take(cls, environ: MutableMapping[str, str] | None = None) -> Notifier:
        """The notifier `environ` (default os.environ) names; removes its variables."""
        env = os.environ if environ is None else environ
        raw = env.pop(SOCKET_ENV, None)
        usec = env.pop(WATCHDOG_USEC_ENV, None)
        pid = env.pop(WATCHDOG_PID_ENV, None)
        target = address(raw) if raw else None
        if raw and target is None:
            log.warning(kv("unsupported NOTIFY_SOCKET; not notifying", value=raw))
        watchdog = watchdog_interval_s(usec, pid, os.getpid()) if target else None
        return cls(target, watchdog_s=watchdog)

    def send(self, message: str) -> bool:
        """Send one datagram; whether it left (False also when there is no socket)."""
        if self.socket_address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                # Never wait on a supervisor: a full queue drops the message.
                sock.setblocking(False)
                sock.sendto(message.encode(), self.socket_address)
        except OSError as exc:
            log.warning(kv("sd_notify failed", message=message, error=exc.strerror or str(exc)))
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send(f"READY=1\nSTATUS={status}" if status else "READY=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    async def keep_alive(self) -> None:
        """Send WATCHDOG=1 every `watchdog_s` until cancelled; returns at once without one.

        Run on the program's event loop: a loop blocked for longer than WatchdogSec
        is the failure this reports."""
        if self.socket_address is None or self.watchdog_s is None:
            return
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_s)
