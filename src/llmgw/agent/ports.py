"""Engine ports from the configured range (docs/agent.md, "Engine templates").

A port is given only if nothing on this agent holds it and a bind test says
the machine does not either (some other program may sit inside the range).
The search starts after the last port given and wraps around, so a port an
engine just left is not handed out again at once: routers may still hold the
old endpoint for a few seconds, and a new engine answering there would be
mistaken for the old one.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Collection

from llmgw.agent.errors import AgentError


class NoFreePort(AgentError):
    def __init__(self, lo: int, hi: int) -> None:
        super().__init__(f"no free port in {lo}-{hi}")


class RendezvousPortTaken(AgentError):
    """Rank 0 of a multi-node shard would listen on a port something here already holds.

    The port was chosen by the controller and the other ranks dial it, so the
    agent cannot pick another: the shard fails with this reason and the
    controller restarts the replica with a fresh port.
    """

    def __init__(self, port: int, holder: str) -> None:
        super().__init__(f"rendezvous port {port} is taken: {holder}")
        self.port = port


def port_is_free(port: int) -> bool:
    """True when a listener could bind `port` on every interface right now.

    SO_REUSEADDR mirrors what engine servers set, so a port in TIME_WAIT counts
    as free (they can take it) while one with a listener does not.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def parse_range(text: str) -> tuple[int, int]:
    """`21000-21099` → (21000, 21099), inclusive; raises ValueError with the reason."""
    lo_s, sep, hi_s = text.partition("-")
    try:
        lo, hi = int(lo_s), int(hi_s if sep else lo_s)
    except ValueError:
        raise ValueError(f"port range {text!r}: expected LOW-HIGH, e.g. 21000-21099") from None
    if not (1 <= lo <= hi <= 65535):
        raise ValueError(f"port range {text!r}: need 1 <= LOW <= HIGH <= 65535")
    return lo, hi


class PortAllocator:
    def __init__(self, lo: int, hi: int, *, is_free: Callable[[int], bool] = port_is_free) -> None:
        self.lo, self.hi = lo, hi
        self._is_free = is_free
        self._next = lo

    def is_free(self, port: int) -> bool:
        """Whether a listener could bind `port` right now (the injected check)."""
        return self._is_free(port)

    def allocate(self, taken: Collection[int]) -> int:
        """A port in range, not in `taken` (ports this agent's shards hold or will
        listen on: engine and rendezvous ports), bindable now."""
        size = self.hi - self.lo + 1
        for step in range(size):
            port = self.lo + (self._next - self.lo + step) % size
            if port in taken or not self._is_free(port):
                continue
            self._next = port + 1 if port < self.hi else self.lo
            return port
        raise NoFreePort(self.lo, self.hi)
