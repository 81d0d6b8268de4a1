"""A whole answer too large to hold: read up to `max_answer_bytes`, or relayed as it comes.

The router holds an engine's whole (non-stream) answer before it answers: its
usage is read from it, and it goes out with a Content-Length. Held without a
bound, an engine that answered hundreds of MB, declared 10 GB, or never ended
its chunked body made the router take in all of it, a copy or two over, for as
long as the request's deadline allowed (or until the kernel killed it), and a
slow client kept it all in memory until it had read the last byte.

So one answer is held up to `RouterConfig.max_answer_bytes`, and all held at
once up to `max_held_answer_bytes` (attempts.hold_within, http/answers.py
`HeldAnswers`). A larger one, or one that would pass the second bound, is
relayed as it arrives (`relay_rest`), with the backpressure of a stream: what
is held of it is bounded by the client's pace, not the answer's size. Its
usage is read from its last bytes (engines write `usage` last), and
lost only where they do not hold it: the answer is logged and counted either
way (`llmgw_router_unbuffered_answers_total`). Once its head has gone out,
nothing is retried, and an engine that breaks off leaves the client a body cut
short (a chunked answer without its last chunk), never a clean end.

A retryable error answer over either bound is not relayed (attempts.py): it is kept to
be relayed only if no retry follows, which is what holding it would cost; the
client gets the router's 502 instead (attempts.too_large). So does a Messages client
for any error answer over a bound: relayed as it comes, it could not be reshaped into
Anthropic's error shape, the only one its client reads. An error answer within them is
counted against the held bound like any other, a retryable one for as long as it is
kept (`Attempts.kept`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from llmgw.router.errors import UpstreamError, UpstreamTimeout
from llmgw.router.http.connection import Stream
from llmgw.router.metrics import DISCONNECTED, ENGINE_ERROR, OK, STREAM_BROKEN, TIMEOUT
from llmgw.router.replicas.breaker import Outcome, classify_status
from llmgw.router.request.attempts import Attempts
from llmgw.router.request.call import Call
from llmgw.router.request.tokens import Usage, usage_of
from llmgw.router.upstream.base import UpstreamReply
from llmgw.router.wiring import Router
from llmgw.runtime.logs import kv

log: Final = logging.getLogger(__name__)

# The last bytes of a relayed answer kept to read its usage from: an engine writes
# `usage` last, and it is a few hundred bytes.
TAIL_BYTES: Final = 64 * 1024
# What was read before the bound was passed goes out in pieces of this size, each
# framed and written on its own: framed whole, it would be copied whole once more.
PIECE_BYTES: Final = 256 * 1024
_KEY: Final = b'"usage"'
# Timer slack: the client's deadline timer fires at, not before, the deadline.
_DEADLINE_SLACK_S: Final = 0.05


async def relay_rest(st: Router, call: Call, att: Attempts, headers: dict[str, str]) -> Stream:
    """Relay `att.up`'s answer, of which `att.data` was read, as the rest arrives (the
    module docstring); the call's status, outcome and usage, and `att.outcome`, set."""
    up = att.up
    assert up is not None
    call.status = up.status
    read, att.data = att.data, b""  # held no longer than it takes to write it
    tail = read[-TAIL_BYTES:]
    _counted(st, call, up, len(read))
    resp = call.request.stream(up.status, headers)
    try:
        view = memoryview(read)
        for at in range(0, len(read), PIECE_BYTES):
            await resp.write(_renamed(att, view[at : at + PIECE_BYTES].tobytes()))
        del view, read
        att.let_go(st.answers)  # written out, as far as the client's transport's mark
        while chunk := await up.chunk():
            await resp.write(_renamed(att, chunk))
            tail = chunk[-TAIL_BYTES:] if len(chunk) >= TAIL_BYTES else (tail + chunk)[-TAIL_BYTES:]
        if att.rename is not None:
            await resp.write(att.rename.flush())
        await resp.write_eof()
    except UpstreamError as exc:
        late = isinstance(exc, UpstreamTimeout)
        late = late and st.clock.monotonic() >= att.deadline - _DEADLINE_SLACK_S
        att.outcome = Outcome.ABANDONED if late else Outcome.ENDPOINT_FAILURE
        call.result = TIMEOUT if late else STREAM_BROKEN
        # No last chunk: the client sees its answer cut short.
        log.warning(kv("answer cut", rid=call.rid, endpoint=up.endpoint_id, error=exc))
        return resp
    except ConnectionError:
        # The client went away; closing `up` (the proxy's finally) aborts the engine's work.
        att.outcome = Outcome.ABANDONED
        call.result = DISCONNECTED
        return resp
    except asyncio.CancelledError:
        # The same under handler cancellation (the proxy counts it a disconnect).
        att.outcome = Outcome.ABANDONED
        raise
    att.outcome = classify_status(up.status)
    call.result = OK if up.status < 300 else ENGINE_ERROR
    call.usage = tail_usage(tail, call)
    if call.usage is None:
        log.warning(kv("usage not read", rid=call.rid, why="none in the answer's last 64 KiB"))
    return resp


def _renamed(att: Attempts, chunk: bytes) -> bytes:
    return chunk if att.rename is None else att.rename.feed(chunk)


def tail_usage(tail: bytes, call: Call) -> Usage | None:
    """The usage in an answer's last bytes, read as if its object began at the last
    `"usage"` key (tokens.usage_of says why that holds); None where it does not."""
    at = tail.rfind(_KEY)
    if at < 0:
        return None
    doc = b"{" + tail[at:]
    return usage_of(doc) if call.api is None else call.api.usage_of(doc)


def _counted(st: Router, call: Call, up: UpstreamReply, read: int) -> None:
    """The answer counted and logged as relayed unbuffered, before a byte of it goes out:
    over max_answer_bytes, or else (held bytes and `read` of it) over the held bound."""
    model = st.served_name.get(call.model, call.model)
    st.metrics.unbuffered(model, up.endpoint_id)
    limit = st.cfg.max_answer_bytes
    declared = up.headers.get("Content-Length") or "-"
    over = read > limit or (declared.isdigit() and int(declared) > limit)
    event = "answer over max_answer_bytes" if over else "answers over max_held_answer_bytes"
    log.warning(
        kv(
            event,
            rid=call.rid,
            endpoint=up.endpoint_id,
            limit=limit if over else st.answers.limit_bytes,
            held=st.answers.held_bytes,
            declared=declared,
            relayed="as it arrives",
        )
    )
