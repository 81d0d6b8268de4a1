"""An in-memory `Forwarder`: engines that answer from a script, for the proxy's unit tests.

Each endpoint id gets a script of answers, played one per request in order;
the last one repeats. An answer is one of:

- `reply(status, body)`: a whole answer (a 5xx or 429 as well as a 200);
- `stream(chunks, fail_after=None)`: an event stream; `fail_after=n` breaks it
  (`UpstreamBroken`) after its first n chunks, so 0 fails before the first;
- `refuse()`: nothing reached the engine (`UpstreamConnectError`);
- any of them with `delay_s`, the time before the head comes, and streams with
  `gap_s` between chunks.

Time passes on the event loop: under `llmgw.testing.vtime.run` it is the fake
clock's, so a delay of 30 s takes none. A delay longer than the request's
`timeout_s` ends in `UpstreamTimeout` when the timeout runs out, and a gap
longer than `idle_timeout_s` likewise, as the real clients do.

`calls` records every request (endpoint, URL, body, headers, timeout), and each
reply says whether it was `closed` before its body ended (how an engine learns
to abort).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from multidict import CIMultiDict, CIMultiDictProxy

from llmgw.router.errors import UpstreamBroken, UpstreamConnectError, UpstreamTimeout
from llmgw.router.upstream.base import EVENT_STREAM, JSON, Forwarder, ReplyHead


@dataclass(frozen=True, kw_only=True)
class Scripted:
    """One scripted answer; build it with `reply`, `stream` or `refuse`."""

    status: int = 200
    body: bytes = b""
    chunks: tuple[bytes, ...] = ()
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0
    gap_s: float = 0.0
    fail_after: int | None = None
    refused: bool = False
    is_stream: bool = False


def reply(
    status: int = 200,
    body: bytes = b'{"ok": true}',
    *,
    content_type: str = JSON,
    headers: Mapping[str, str] | None = None,
    delay_s: float = 0.0,
) -> Scripted:
    return Scripted(
        status=status,
        body=body,
        content_type=content_type,
        headers=tuple((headers or {}).items()),
        delay_s=delay_s,
    )


def stream(
    chunks: Sequence[bytes],
    *,
    status: int = 200,
    fail_after: int | None = None,
    delay_s: float = 0.0,
    gap_s: float = 0.0,
) -> Scripted:
    return Scripted(
        status=status,
        chunks=tuple(chunks),
        content_type=EVENT_STREAM,
        fail_after=fail_after,
        delay_s=delay_s,
        gap_s=gap_s,
        is_stream=True,
    )


def refuse(*, delay_s: float = 0.0) -> Scripted:
    return Scripted(refused=True, delay_s=delay_s)


@dataclass(frozen=True)
class Call:
    endpoint_id: str
    url: str
    body: bytes
    headers: dict[str, str]
    timeout_s: float
    idle_timeout_s: float | None


class FakeReply(ReplyHead):
    """An answer in play; the proxy reads it like a real client's reply."""

    __slots__ = ("_answer", "_deadline", "_headers", "_idle_s", "_next", "closed", "finished")

    def __init__(
        self, answer: Scripted, endpoint_id: str, deadline: float, idle_s: float | None
    ) -> None:
        self._answer = answer
        self._deadline = deadline
        self._idle_s = idle_s
        self._next = 0
        self._content_type = None
        self.endpoint_id = endpoint_id
        self.status = answer.status
        hdrs: CIMultiDict[str] = CIMultiDict(answer.headers)
        hdrs.setdefault("Content-Type", answer.content_type)
        self._headers = CIMultiDictProxy(hdrs)
        self.finished = False  # the body was read to its end
        self.closed = False  # close() came before that

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._headers

    async def read(self) -> bytes:
        if not self._answer.is_stream:
            self.finished = True
            return self._answer.body
        parts = []
        while chunk := await self.chunk():
            parts.append(chunk)
        return b"".join(parts)

    async def chunk(self) -> bytes:
        answer = self._answer
        if not answer.is_stream:
            if self.finished:
                return b""
            self.finished = True
            return answer.body
        i = self._next
        if answer.fail_after is not None and i >= answer.fail_after:
            raise UpstreamBroken(self.endpoint_id, "connection lost (scripted)")
        if i >= len(answer.chunks):
            self.finished = True
            return b""
        if i and answer.gap_s:
            await self.elapse(answer.gap_s, body=True)
        self._next = i + 1
        return answer.chunks[i]

    def close(self) -> None:
        if not self.finished:
            self.closed = True

    release = close

    async def elapse(self, delay_s: float, *, body: bool) -> None:
        loop = asyncio.get_running_loop()
        left = self._deadline - loop.time()
        idle = self._idle_s if body and self._idle_s is not None else left
        limit = min(left, idle)
        if delay_s < limit:
            await asyncio.sleep(delay_s)
            return
        await asyncio.sleep(max(0.0, limit))
        if idle < left:
            raise UpstreamTimeout(self.endpoint_id, f"no data for {idle:g}s")
        raise UpstreamTimeout(self.endpoint_id, "no response in time")


class FakeForwarder(Forwarder):
    """Scripted engines by endpoint id; see the module docstring."""

    def __init__(self, scripts: Mapping[str, Sequence[Scripted]] | None = None) -> None:
        self.connect_timeout_s = 3.0
        self._scripts: dict[str, list[Scripted]] = {}
        self._played: dict[str, int] = {}
        self.calls: list[Call] = []
        self.replies: list[FakeReply] = []
        for eid, answers in (scripts or {}).items():
            self.script(eid, *answers)

    def script(self, endpoint_id: str, *answers: Scripted) -> None:
        """Replace `endpoint_id`'s script; the last answer repeats once the others are played."""
        if not answers:
            raise ValueError("a script needs at least one answer")
        self._scripts[endpoint_id] = list(answers)
        self._played[endpoint_id] = 0

    def tried(self) -> list[str]:
        """Endpoint ids in the order requests were sent to them."""
        return [c.endpoint_id for c in self.calls]

    async def _send(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout_s: float,
        endpoint_id: str,
        idle_timeout_s: float | None,
    ) -> FakeReply:
        self.calls.append(Call(endpoint_id, url, body, dict(headers), timeout_s, idle_timeout_s))
        script = self._scripts.get(endpoint_id)
        if script is None:
            raise LookupError(f"no answer scripted for endpoint {endpoint_id!r}")
        n = self._played[endpoint_id]
        self._played[endpoint_id] = n + 1
        answer = script[min(n, len(script) - 1)]
        loop = asyncio.get_running_loop()
        up = FakeReply(answer, endpoint_id, loop.time() + timeout_s, idle_timeout_s)
        if answer.delay_s:
            await up.elapse(answer.delay_s, body=False)
        if answer.refused:
            raise UpstreamConnectError(endpoint_id, "connection refused (scripted)")
        self.replies.append(up)
        return up
