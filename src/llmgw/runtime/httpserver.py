"""The HTTP server's own edge: limits, and answers given before any handler runs.

aiohttp answers a request it cannot parse (header line too long, too many
headers, bad characters, a smuggling attempt such as both Content-Length and
Transfer-Encoding, a bad method) from `RequestHandler.handle_error`: plain text,
and a logged traceback per request. `EdgeHandler` is that request handler with
three changes, installed as the listening socket's protocol by `serve_app`:

- every such answer is the program's JSON error body (`ErrorBody`, by default
  the OpenAI error object every program speaks) and costs one log line;
- a head (request line and headers) must arrive within `header_timeout_s` of
  its first byte, or the connection gets a 408 and is closed (slow clients);
  aiohttp itself bounds only the idle time before a request (`idle_timeout_s`);
- past `max_connections` open client connections, a new one is answered 503
  with `Retry-After` and closed at once, without a handler, while the
  established ones keep being served.

The handler relies on a few of aiohttp's `RequestHandler` attributes (the
waiter for the next request, the parsed-message queue); the hostile tests
(tests/integration/test_hostile_*.py) pin the behaviour on the installed version.
"""

from __future__ import annotations

import asyncio
import logging
import re
import resource
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

from aiohttp import web
from aiohttp.web_request import BaseRequest

from llmgw.runtime.logs import kv
from llmgw.runtime.peers import Peer, Peers
from llmgw.wire.errors import error_body

log = logging.getLogger(__name__)

# (status, message) → the JSON body of an error answer.
ErrorBody = Callable[[int, str], bytes]

# Descriptors kept out of the client-connection budget whatever the limit: the
# listening socket, logs, the state file, scrapes, the controller's long-poll.
FD_RESERVE = 64
# A connection refused mid-body keeps reading and dropping what its client still sends
# for at most this long (nginx's lingering_time is 30 s): a client that sends its whole
# body before it reads would otherwise meet a reset, and lose the answer with it.
LINGER_MAX_S = 10.0
# Where aiohttp's parser message starts quoting the client's bytes.
_ECHO = re.compile(r"[\s:]*\bb['\"]")


def openai_error(status: int, message: str) -> bytes:
    """The OpenAI error object for an answer the server gives before any handler."""
    # 501 is the request's fault (a transfer coding no server here implements), not
    # the server's: a client must not retry it as a server error.
    kind = "invalid_request_error" if status < 500 or status == 501 else "server_error"
    return error_body(message, type=kind, code=_CODES.get(status))


_CODES = {
    400: "bad_http_request",
    408: "request_timeout",
    413: "request_too_large",
    431: "headers_too_large",
    500: "internal_error",
    501: "not_implemented",
    503: "too_many_connections",
    504: "timeout",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLimits:
    """What one client may hold of the server; every field has a setting in the router's config."""

    # A keep-alive connection with no request for this long is closed (aiohttp's
    # default is an hour: idle sockets would pin file descriptors).
    idle_timeout_s: float = 75.0
    # Once a request's first byte has arrived, its whole head must within this.
    header_timeout_s: float = 10.0
    # Open client connections; also capped by the open-file limit (connection_cap).
    max_connections: int = 10_000
    # aiohttp's parser limits: one line (request line or header), headers per request.
    max_line_bytes: int = 8190
    max_headers: int = 128
    # Inflate gzip/deflate request bodies (the router does not: a small body can
    # inflate to gigabytes, and OpenAI's API takes plain JSON).
    decompress: bool = True
    # The part of each shared budget (connections here) one client address may hold
    # (runtime/peers.py); 1.0: no division.
    client_share: float = 1.0


def raise_nofile_limit() -> int:
    """Raise the soft open-file limit to the hard one; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return soft if soft != resource.RLIM_INFINITY else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning(kv("cannot raise the open-file limit", soft=soft, hard=hard, error=exc))
        return soft
    return hard


def nofile_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 20 if soft == resource.RLIM_INFINITY else int(soft)


def connection_cap(configured: int, nofile: int) -> int:
    """Client connections allowed: `configured`, at most half the open-file limit less a reserve.

    The other half is the headroom for the upstream side: each request in flight
    holds an engine connection, and the upstream pools keep idle ones.
    """
    return max(1, min(configured, nofile // 2 - FD_RESERVE))


def _canned(status: int, body: bytes, extra: str = "") -> bytes:
    """A complete HTTP/1.1 answer written straight to a transport (no handler, then close)."""
    phrase = HTTPStatus(status).phrase
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def late_answer(limits: ServerLimits, error: ErrorBody) -> bytes:
    """The 408 to a head that did not arrive within `header_timeout_s`, its body `error`'s."""
    why = f"The request head did not arrive within {limits.header_timeout_s:g}s."
    return _canned(408, error(408, why))


def _one_line(text: str, limit: int = 200) -> str:
    out = " ".join(text.split())
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _without_echo(text: str) -> str:
    """aiohttp's parser message without the client's bytes it quotes (`...: b'...'`)."""
    head = _ECHO.split(text, maxsplit=1)[0].strip()
    return head or text


class Edge:
    """What every connection of one server shares: limits, the error body, the count."""

    def __init__(self, limits: ServerLimits, error: ErrorBody, *, name: str) -> None:
        self.limits = limits
        self.error = error
        self.name = name
        self.max_connections = connection_cap(limits.max_connections, nofile_limit())
        self.open = 0
        self.refused_total = 0
        self.peers = Peers(max_connections=self.max_connections, share=limits.client_share)
        self.full_answer = _canned(
            503,
            error(503, "The server has too many open connections; retry shortly."),
            "Retry-After: 1\r\n",
        )
        self.share_answer = _canned(
            503,
            error(
                503,
                "This client address has too many open connections "
                f"(at most {self.peers.max_conns_each}); retry shortly.",
            ),
            "Retry-After: 1\r\n",
        )
        # How long a connection refused mid-body reads and drops the rest before
        # closing, once nothing more comes; and at most, while the client still sends.
        self.linger_s = min(2.0, limits.header_timeout_s)
        self.linger_max_s = LINGER_MAX_S
        # Connections refused past the cap that read and drop the client's first
        # bytes before closing (so it reads the 503, not a reset): bounded, since each
        # holds a descriptor outside the cap.
        self.refused_lingering = 0
        self.max_refused_lingering = max(1, min(256, self.max_connections // 4))
        self.late_answer = late_answer(limits, error)

    def handler_kwargs(self) -> dict[str, Any]:
        lim = self.limits
        return {
            "keepalive_timeout": lim.idle_timeout_s,
            "max_line_size": lim.max_line_bytes,
            "max_field_size": lim.max_line_bytes,
            "max_headers": lim.max_headers,
            "auto_decompress": lim.decompress,
            # An unread body is drained (up to this) so the connection can be reused;
            # a client that trickles it would hold the slot for as long.
            "lingering_time": self.linger_s,
            "access_log": None,
        }


class EdgeHandler(web.RequestHandler):
    """aiohttp's request handler: JSON pre-handler errors, a head timeout, a connection cap."""

    __slots__ = ("_counted", "_edge", "_head_timer", "_lingering", "peer")

    def __init__(self, manager: web.Server, *, edge: Edge, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._edge = edge
        self._head_timer: asyncio.TimerHandle | None = None
        self._counted = False
        self._lingering = False  # refused past a cap, reading and dropping before it closes
        # The client address's tally (runtime/peers.py); None until counted.
        self.peer: Peer | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        edge = self._edge
        got = transport.get_extra_info("peername")
        addr = got[0] if isinstance(got, tuple) else None
        full = edge.open >= edge.max_connections
        peer = None if full else edge.peers.enter(addr)
        if peer is None:
            edge.refused_total += 1
            log.warning(
                kv(
                    "refused connection",
                    server=edge.name,
                    status=503,
                    peer=addr,
                    open=edge.open,
                    max_connections=edge.max_connections if full else edge.peers.max_conns_each,
                    why="server full" if full else "client address at its share",
                )
            )
            # uvloop's transports are not asyncio.Transport subclasses: cast, not isinstance.
            tcp = cast(asyncio.Transport, transport)
            tcp.write(edge.full_answer if full else edge.share_answer)
            self._force_close = True  # what the client sends is dropped (data_received)
            if edge.refused_lingering >= edge.max_refused_lingering or not tcp.can_write_eof():
                tcp.close()
                return
            # As the router's server does (router/http/connection.py): closed with the
            # client's request unread, the kernel's reset could destroy the 503 before
            # it is read.
            edge.refused_lingering += 1
            self._lingering = True
            tcp.write_eof()
            self._loop.call_later(edge.linger_s, tcp.close)
            return
        edge.open += 1
        self._counted = True
        self.peer = peer
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._lingering:
            self._lingering = False
            self._edge.refused_lingering -= 1
        if self._counted:
            self._counted = False
            self._edge.open -= 1
            if self.peer is not None:
                self._edge.peers.leave(self.peer)
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        """No complete head is queued or being handled: bytes now start a new request."""
        waiter = self._waiter
        if waiter is not None:
            return not waiter.done()
        return self._request_count == 0 and not self._messages

    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close:
            return
        if self._head_timer is None and self._between_requests():
            self._head_timer = self._loop.call_later(
                self._edge.limits.header_timeout_s, self._head_late
            )
        super().data_received(data)
        if self._head_timer is not None and not self._between_requests():
            self._cancel_head_timer()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport is None or not self._between_requests():
            return
        peer = transport.get_extra_info("peername")
        log.warning(
            kv(
                "refused request",
                server=self._edge.name,
                status=408,
                peer=peer[0] if isinstance(peer, tuple) else peer,
                why="head not complete within header_timeout_s",
            )
        )
        transport.write(self._edge.late_answer)
        self.force_close()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The program's JSON error instead of aiohttp's text; one log line, not a traceback.

        A handler that raised (500) is a bug of ours: that one keeps its traceback.
        """
        if status == 500 and exc is not None:
            log.error(kv("handler failed", server=self._edge.name, path=request.path), exc_info=exc)
            text = "The server had an error while processing your request."
        else:
            why = _without_echo(message or (str(getattr(exc, "message", "") or exc or "")))
            text = _one_line(f"Bad HTTP request: {why}" if status == 400 else why or "error")
            log.warning(
                kv(
                    "refused request",
                    server=self._edge.name,
                    status=status,
                    peer=request.remote,
                    why=_one_line(why or HTTPStatus(status).phrase, 120),
                )
            )
        if request.writer.output_size > 0:
            raise ConnectionError("the answer had started; the connection is closed instead")
        resp = web.Response(
            status=status, body=self._edge.error(status, text), content_type="application/json"
        )
        resp.force_close()
        return resp


def protocol_factory(server: web.Server, edge: Edge) -> Callable[[], EdgeHandler]:
    """What `loop.create_server` calls per accepted connection."""
    loop = asyncio.get_running_loop()
    kwargs = edge.handler_kwargs()

    def make() -> EdgeHandler:
        return EdgeHandler(server, loop=loop, edge=edge, **kwargs)

    return make
