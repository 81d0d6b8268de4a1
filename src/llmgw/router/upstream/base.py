"""The seam between the proxy and the engines, and what every upstream client shares.

The proxy sends each request through a `Forwarder` and reads the answer through
an `UpstreamReply`. `fast.FastUpstream`, the lean HTTP/1.1 pool, implements
the seam; `llmgw.testing.forwarder` is an in-memory one for unit tests. The
scrape loop and the controller client use aiohttp's session
(`aiohttp_client.Upstream`), which shares `translate` but is no `Forwarder`.

Errors: a client raises only the router's own (`router.errors`). An exception
from the transport underneath (asyncio, the socket, aiohttp) becomes one of them
in `translate`, the one place that decides which; the proxy never catches a
transport's type.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator, Mapping
from typing import Final, NoReturn, cast

from mypy_extensions import mypyc_attr

from llmgw.router.errors import (
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamError,
    UpstreamTimeout,
)

# Below uvicorn's default keep-alive (5 s, what vLLM runs): a pooled connection the
# engine is about to close is dropped by us first instead of failing a request.
KEEPALIVE_S: Final = 4.0
JSON: Final = "application/json"
EVENT_STREAM: Final = "text/event-stream"


# Compiled by mypyc with the router's hot modules (compiled.py); tests' fakes
# subclass these from Python.
def header_lines(fields: Mapping[str, str]) -> bytes:
    """`Name: value` and CRLF per field, in utf-8 with surrogateescape (a value that
    came in as bytes goes out as those bytes); ValueError naming the first field that
    holds a line break, which would smuggle a header."""
    parts: list[str] = []
    if type(fields) is dict:
        # A plain dict: compiled, iterated as a dict, without the generic iterator and
        # tuple unpacking a Mapping takes.
        plain = cast("dict[str, str]", fields)
        for name, value in plain.items():
            parts += (name, ": ", value, "\r\n")
    else:
        for name, value in fields.items():
            parts += (name, ": ", value, "\r\n")
    n = len(parts) // 4
    text = "".join(parts)
    # Each line ends in one CRLF: any other CR or LF is in a name or a value (counted
    # over all the lines, not tested field by field).
    if text.count("\n") != n or text.count("\r") != n:
        _refuse_breaks(fields)
    return text.encode("utf-8", "surrogateescape")


def _refuse_breaks(fields: Mapping[str, str]) -> NoReturn:
    for name, value in fields.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"header {name!r} holds a line break")
    raise ValueError("a header holds a line break")


class HeaderLines(Mapping[str, str]):
    """Request headers as the lines that go on the wire, each `Name: value` and CRLF,
    written by the caller, who vouches that no name or value holds a line break.

    The fast client sends `lines` as they are; the proxy's headers for an engine are
    the same for every request but the id, so rendering a dict of them per request
    (its cost is in bench/RESULTS.md) is skipped.
    As a mapping (the other clients, tests) the lines are read back.
    """

    __slots__ = ("_map", "lines")

    def __init__(self, lines: bytes) -> None:
        self.lines = lines
        self._map: dict[str, str] | None = None

    def _items(self) -> dict[str, str]:
        got = self._map
        if got is None:
            got = {}
            for line in self.lines.decode("utf-8", "surrogateescape").split("\r\n"):
                if line:
                    name, _, value = line.partition(":")
                    got[name] = value.strip()
            self._map = got
        return got

    def __getitem__(self, key: str) -> str:
        return self._items()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def __repr__(self) -> str:
        return f"HeaderLines({self.lines!r})"


@mypyc_attr(allow_interpreted_subclasses=True)
class ReplyHead:
    """An engine's answer whose head has arrived; the body is read through it.

    What every reply derives from its head is written here once for all clients;
    a subclass sets `endpoint_id`, `status` and `_content_type = None`, and
    provides `headers`, `read`, `chunk` and `close`. The proxy holds replies as this
    class, not as a Protocol: compiled, its attributes and methods are then direct
    reads and calls, where a Protocol's were generic lookups (bench/RESULTS.md,
    "Figures once quoted in the router's source").

    Release semantics, the same for every client: a body read to its end gives
    the connection back to the pool by itself; `close()` on a reply that is not
    finished drops the connection (which is how an engine learns to abort), and
    is a no-op on a finished one, so the proxy calls it in every `finally`.
    """

    __slots__ = ("_content_type", "endpoint_id", "status")

    _content_type: str | None
    endpoint_id: str
    status: int

    @property
    def headers(self) -> Mapping[str, str]:
        raise NotImplementedError

    @property
    def content_type(self) -> str:
        """The engine's Content-Type; JSON when it gave none."""
        ct = self._content_type
        if ct is None:
            ct = self._content_type = self.headers.get("Content-Type") or JSON
        return ct

    @property
    def is_event_stream(self) -> bool:
        return self.content_type.startswith(EVENT_STREAM)

    async def read(self) -> bytes:
        """The whole body."""
        raise NotImplementedError

    async def chunk(self) -> bytes:
        """Whatever body bytes have arrived (waiting for at least one); b"" at the end."""
        raise NotImplementedError

    def body_in(self, limit: int) -> bytes | None:
        """The whole body, taken, when all of it has arrived already and it is at most
        `limit` bytes; else None, nothing taken (read on with `chunk`). A client that
        cannot tell answers None."""
        return None

    def close(self) -> None:
        raise NotImplementedError

    def release(self) -> None:
        self.close()


# The reply type of the seam (the name the proxy and the clients use).
UpstreamReply = ReplyHead


@mypyc_attr(allow_interpreted_subclasses=True)
class Forwarder:
    """The proxy's client: one request out, the reply once its head is in.

    A client subclasses this and implements `_send`; `post` is the one signature
    the proxy calls.
    """

    connect_timeout_s: float

    async def start(self) -> None:
        """Called once inside the event loop before the first `post`."""

    async def close(self) -> None:
        """Called once at exit."""

    def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout_s: float,
        endpoint_id: str,
        idle_timeout_s: float | None = None,
    ) -> Awaitable[UpstreamReply]:
        """Send one request and wait for the response head (not the body).

        `timeout_s` bounds the whole exchange, body included; `idle_timeout_s`
        (None: no bound) the silence between body bytes once the head is in, so
        a stalled stream ends long before the request's deadline. Failures are
        `UpstreamError`s naming `endpoint_id`.
        """
        return self._send(
            url,
            body,
            headers,
            timeout_s=timeout_s,
            endpoint_id=endpoint_id,
            idle_timeout_s=idle_timeout_s,
        )

    def _send(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout_s: float,
        endpoint_id: str,
        idle_timeout_s: float | None,
    ) -> Awaitable[UpstreamReply]:
        raise NotImplementedError


def describe(exc: BaseException) -> str:
    """An exception as one short line for an error message."""
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:200]


def translate(
    exc: BaseException, endpoint_id: str, *, started: bool, timeout: str
) -> UpstreamError:
    """A transport's exception as the router's own; `timeout` says what ran out.

    A timeout is `UpstreamTimeout`. Anything else before the response started
    (refused, reset, a pooled connection closed under us) is
    `UpstreamConnectError`: the engine produced nothing for this request, so
    another replica may take it. After it started, `UpstreamBroken`.
    """
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(endpoint_id, timeout)
    if started:
        return UpstreamBroken(endpoint_id, describe(exc))
    return UpstreamConnectError(endpoint_id, describe(exc))
