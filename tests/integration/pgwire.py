"""A relay between a controller and PostgreSQL that can lose the answer to one COMMIT.

A connection that drops after the server committed but before the client read the
answer is a write whose outcome the client cannot know: the driver raises, and the
row is in the database all the same. `lose_commit_after(b"INSERT INTO api_keys")`
lets the next transaction that sends those bytes reach the server whole, COMMIT
included, then cuts that connection without relaying the answer.

The relay reads the protocol's plain bytes: give the controller `sslmode=disable`
(`url`). Only the connections of the program pointed at the relay pass through it.
"""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit

from tests.integration.cutwire import CutWire, close_socket

# The simple-query message psycopg sends for Connection.commit(): 'Q', length, text.
_COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"


class PgWire(CutWire):
    """Relays 127.0.0.1:`port` to the server of `url`; see the module docstring."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._url = parts
        # Bytes that arm a connection; None: nothing to lose.
        self._trigger: bytes | None = None
        # Set once a COMMIT's answer was lost.
        self.lost = threading.Event()
        super().__init__(parts.port or 5432, parts.hostname or "127.0.0.1")

    @property
    def url(self) -> str:
        """The server's URL with the relay's port, plain text on the wire."""
        netloc = self._url.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        at = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
        query = "&".join(q for q in (self._url.query, "sslmode=disable") if q)
        return urlunsplit((self._url.scheme, at, self._url.path, query, ""))

    def lose_commit_after(self, trigger: bytes) -> None:
        """The next transaction sending `trigger` commits; its answer never comes back."""
        with self._lock:
            self.lost.clear()
            self._trigger = trigger

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        # Set before a COMMIT goes up: nothing the server says after it comes back.
        muted = threading.Event()
        threading.Thread(target=self._upstream, args=(client, server, muted), daemon=True).start()
        threading.Thread(target=_pump, args=(server, client, muted), daemon=True).start()

    def _upstream(
        self, client: socket.socket, server: socket.socket, muted: threading.Event
    ) -> None:
        armed = False
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                break
            if not data:
                break
            with self._lock:
                trigger = self._trigger
                if trigger is not None and trigger in data:
                    armed = True
                if armed and _COMMIT in data:
                    self._trigger = None
                    armed = False
                    cut = True
                else:
                    cut = False
            if cut:
                muted.set()
                self.lost.set()
            try:
                server.sendall(data)
            except OSError:
                break
            if cut:
                # The server's answer is dropped by _pump (muted), which then closes both
                # sockets; this is for a server slower than the answer's arrival.
                time.sleep(0.3)
                close_socket(client)
                close_socket(server)
                return
        close_socket(client)
        close_socket(server)


def _pump(src: socket.socket, dst: socket.socket, muted: threading.Event) -> None:
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            break
        if not data or muted.is_set():
            break
        try:
            dst.sendall(data)
        except OSError:
            break
    close_socket(src)
    close_socket(dst)
