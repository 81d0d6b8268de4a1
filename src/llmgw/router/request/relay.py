"""An engine's event stream relayed to the client as it arrives.

Once the head is sent, bytes have reached the client and nothing is retried.
If the stream breaks, the client gets an error event in its API's shape and the
end of the stream, never a hang or a silent cut; if the client leaves, the
stream was complete when its final event had gone out (streamend.py), else it
was abandoned. `Tally` keeps what the stream leaves for metrics, whichever way
it ended, a cancellation included.

The endpoint's verdict: a stream relayed to its end is a success, unless it
carried the engine's own 5xx error event (inband.py). One that goes silent for
`stream_idle_timeout_s` ends like a broken one (`UpstreamTimeout`), the
endpoint's failure. One still producing when the request's own deadline passes
is cut the same way, but that is no verdict on the engine (ABANDONED).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

from llmgw.router.apis.catalog import Api
from llmgw.router.errors import UpstreamError, UpstreamTimeout, stream_error_frame
from llmgw.router.http.connection import Stream
from llmgw.router.metrics import DISCONNECTED, ENGINE_ERROR, OK, STREAM_BROKEN, TIMEOUT
from llmgw.router.replicas.breaker import Outcome
from llmgw.router.replicas.registry import Release
from llmgw.router.request.attempts import Attempts
from llmgw.router.request.call import Call
from llmgw.router.request.inband import ErrorFrameWatch
from llmgw.router.request.streamend import final_event_sent
from llmgw.router.request.tokens import StreamUsage
from llmgw.router.upstream.base import UpstreamReply
from llmgw.runtime.clock import Clock
from llmgw.runtime.logs import kv

log: Final = logging.getLogger(__name__)
# Timer slack: the client's deadline timer fires at, not before, the deadline.
_DEADLINE_SLACK_S: Final = 0.05


class Tally:
    """What one relayed stream leaves for metrics: its outcome (metrics.OUTCOMES), the
    first token's time (`ttft`, seconds; None before one), its usage and ITL child."""

    __slots__ = ("api", "itl", "result", "streamed", "ttft", "usage")

    def __init__(self, itl: Any, api: Api | None, release: Release) -> None:
        self.itl = itl
        # Each relayed event is one token fewer owed at the endpoint (Registry.acquire).
        self.streamed = release.streamed
        self.result = DISCONNECTED
        self.ttft: float | None = None
        # A passed-through API's stream: its usage and its broken-stream frame (apis.py).
        self.api = api
        if api is None or api.stream_usage is None:
            self.usage = StreamUsage()
        else:
            self.usage = StreamUsage(api.stream_usage().read)


async def relay(
    clock: Clock, call: Call, att: Attempts, tally: Tally, headers: dict[str, str]
) -> Stream:
    """Relay `att.up`'s event stream under `headers` as it arrives (see the module
    docstring); `att.outcome` becomes the endpoint's verdict. `att.first`: the first
    chunk, already read (b"": it was empty) and fed to `att.watch`."""
    headers["Cache-Control"] = "no-cache"
    # nginx (ingress-nginx by default) buffers proxied bodies unless told not to.
    headers["X-Accel-Buffering"] = "no"
    now = clock.monotonic
    up = att.up
    watch = att.watch
    assert up is not None
    assert watch is not None
    itl = tally.itl
    streamed = tally.streamed
    before = sent = b""
    try:
        resp = call.request.stream(up.status, headers)
        # From here bytes have reached the client: never retried.
        chunk = att.first
        last = 0.0
        if chunk:
            last = now()
            tally.ttft = last - call.t0
        while chunk:
            # Written before anything else is looked at: relay latency first.
            await resp.write(chunk)
            # The last two chunks written, for when the stream ends early (streamend.py).
            before, sent = sent, chunk
            tally.usage.feed(chunk)
            chunk = await up.chunk()
            if att.rename is not None:
                chunk = att.rename.feed(chunk) if chunk else att.rename.flush()
            if chunk:
                t = now()
                # Several events may arrive in one read: the gap is theirs to share.
                n = chunk.count(b"data:") or 1
                streamed(n)
                gap = (t - last) / n
                for _ in range(n):
                    itl.observe(gap)
                last = t
            watch.feed(chunk)
        await resp.write_eof()
    except UpstreamError as exc:
        late = isinstance(exc, UpstreamTimeout) and now() >= att.deadline - _DEADLINE_SLACK_S
        att.outcome = await _broken(resp, up, tally, exc, before=before, sent=sent, late=late)
        return resp
    except ConnectionError:
        # The client went away; closing `up` (the caller's finally) aborts the engine's work.
        att.outcome = gone(tally, before, sent)
        return resp
    except asyncio.CancelledError:
        # The same under handler cancellation; the caller reads the verdict from `tally`.
        att.outcome = gone(tally, before, sent)
        raise
    att.outcome = _ended(up, watch, tally)
    return resp


async def _broken(
    resp: Stream,
    up: UpstreamReply,
    tally: Tally,
    exc: UpstreamError,
    *,
    before: bytes,
    sent: bytes,
    late: bool,
) -> Outcome:
    """End a stream whose engine side broke (`exc`) after the client got `before` then
    `sent` last: complete if its final event had gone out, cut by the request's
    deadline (`late`: no verdict on the engine), else the endpoint's failure; the
    client gets an error event but in the first case, after what ends an event the
    engine left unfinished (`event_end`)."""
    if final_event_sent(before, sent):
        # The engine dropped the connection after its last event: complete.
        tally.result = OK
        await _end_quietly(resp)
        return Outcome.OK
    if late:
        verdict, why, code = Outcome.ABANDONED, "the request's deadline passed", 504
        tally.result = TIMEOUT
    else:
        why = f"upstream stream broke: {exc.detail}"
        verdict, code = Outcome.ENDPOINT_FAILURE, 502
        tally.result = STREAM_BROKEN
    log.warning(kv("stream ended early", endpoint=up.endpoint_id, error=exc))
    api = tally.api
    frame = stream_error_frame(why, code=code) if api is None else api.stream_error(why, code)
    frame = event_end(before, sent) + frame
    try:
        await resp.write(frame)
        await resp.write_eof()
    except ConnectionError:
        pass
    return verdict


def event_end(before: bytes, sent: bytes) -> bytes:
    """What ends the event the client's last bytes (`before` then `sent`) leave open,
    so that what is written next is an event of its own: nothing, LF, or two LFs.

    An engine that broke off inside an event (`data: {"id":"c","obj`) left its line
    open: the error event written straight after it joined that line, and the client
    read one event of broken JSON, never the error. Ended, the cut event still reaches
    the client broken, but the error event after it is whole. SSE ends a line with
    CRLF, LF or CR, and an event with an empty line; a CR last would take the LF
    written next as its own (CRLF), so one more LF is written then."""
    tail = (before[-4:] + sent[-4:])[-4:]
    if not tail:
        return b""
    ends = 0  # line ends at the tail's end, CRLF counting once
    i = len(tail)
    while ends < 2 and i > 0:
        if i >= 2 and tail[i - 2 : i] == b"\r\n":
            i -= 2
        elif tail[i - 1] in b"\r\n":
            i -= 1
        else:
            break
        ends += 1
    pad = b"\n" * (2 - ends)
    return b"\n" + pad if pad and tail.endswith(b"\r") else pad


def _ended(up: UpstreamReply, watch: ErrorFrameWatch, tally: Tally) -> Outcome:
    """The verdict on a stream relayed to its end: the endpoint's failure if it carried
    the engine's own 5xx error event (inband.py)."""
    tally.result = ENGINE_ERROR if watch.seen or up.status >= 300 else OK
    if watch.seen:
        log.warning(
            kv("engine error event", endpoint=up.endpoint_id, code=watch.code, error=watch.message)
        )
        if watch.endpoint_failure:
            return Outcome.ENDPOINT_FAILURE
    return Outcome.OK


def gone(tally: Tally, before: bytes, sent: bytes) -> Outcome:
    """The verdict on a stream whose client left: complete if its final event went out."""
    if final_event_sent(before, sent):
        tally.result = OK
        return Outcome.OK
    tally.result = DISCONNECTED
    return Outcome.ABANDONED


async def _end_quietly(resp: Stream) -> None:
    """End an answer whose client may already be gone."""
    with contextlib.suppress(ConnectionError):
        await resp.write_eof()
