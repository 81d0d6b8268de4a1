"""A TCP relay a test can cut: what a router behind it sees as its controller
going away (connections reset, new ones refused) while the controller runs on."""

from __future__ import annotations

import contextlib
import socket
import threading


class CutWire:
    """Relays 127.0.0.1:`port` to `target`; `cut()` ends every connection and refuses more."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.is_cut = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self.is_cut:
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(self._target, timeout=5)
                except OSError:
                    client.close()
                    continue
                # The timeout was for connecting: a long-poll is silent for seconds, and
                # a recv that timed out would cut the wire while it is meant to be whole.
                upstream.settimeout(None)
                self._open += [client, upstream]
            self._relay(client, upstream)

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        """Carry one accepted connection's bytes both ways (a subclass may do more)."""
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            self.is_cut = True
            for s in self._open:
                close_socket(s)
            self._open.clear()

    def close(self) -> None:
        self.cut()
        close_socket(self._listener)
        self._thread.join(timeout=5)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    close_socket(src)
    close_socket(dst)


def close_socket(s: socket.socket) -> None:
    """Shut `s` down both ways and close it, whatever state it is in."""
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
