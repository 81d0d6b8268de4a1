"""One request's attempts at replicas, and the one rule that says when to try again.

Until a byte has gone to the client, a connect error, timeout, 5xx or 429
answer, or the engine's 5xx error event before any output, is as safe to retry
elsewhere as nothing at all: it is retried on a *different* replica while
retries and deadline remain. `attempt` makes one attempt and decides (a
`Step`); `Attempts` keeps the request's attempts and holds the retry rule
(`Attempts.retry`).
"""

from __future__ import annotations

import enum
import io
from collections.abc import Sequence

from llmgw.router.errors import NoReplica, UpstreamError
from llmgw.router.http.answers import JSON, HeldAnswers
from llmgw.router.replicas.breaker import BreakerState, Outcome, classify_status
from llmgw.router.replicas.registry import Snapshot
from llmgw.router.request import enginepriority, lora
from llmgw.router.request.call import Call
from llmgw.router.request.inband import (
    MARK,
    ErrorFrameWatch,
    nothing_before_error,
    openers_only,
)
from llmgw.router.request.lora import Rename
from llmgw.router.upstream.base import HeaderLines, UpstreamReply, header_lines
from llmgw.router.wiring import Router
from llmgw.wire.errors import error_body

# Reads past the first chunk while a stream has sent only events without output: a
# Responses stream opens with four, each possibly a chunk of its own.
MAX_OPENER_READS = 6


class Failed:
    """The last retryable error answer, relayed if no other replica can be tried.

    The engine's Retry-After goes with it: a client (the openai package honours
    it) should wait as long as the engine asked, not retry blindly.
    """

    __slots__ = ("body", "content_type", "final", "retry_after", "status")

    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: str,
        retry_after: str | None = None,
        *,
        final: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.retry_after = retry_after
        # No client's retry can help (`x-should-retry: false`): the router's own fault.
        self.final = final

    def headers(self, rid: str, eid: str, *, final: bool) -> dict[str, str]:
        """The relayed failure's headers, from `eid` to the request `rid`; `final`
        (`Attempts.final`): with `x-should-retry: false`."""
        out = {"Content-Type": self.content_type, "x-request-id": rid, "x-llmgw-endpoint": eid}
        if self.retry_after is not None:
            out["Retry-After"] = self.retry_after
        if final:
            out["x-should-retry"] = "false"
        return out


class Step(enum.Enum):
    """What one attempt decided (`attempt`)."""

    RETRY = "retry"  # it failed before any byte reached the client: another replica
    RELAY = "relay"  # a whole answer (`Attempts.data`), whatever its status
    RELAY_FAILED = "relay failed"  # it failed and nothing is left: `Attempts.failed`
    STREAM = "stream"  # an event stream whose first bytes are in (`Attempts.first`)
    # A whole answer over max_answer_bytes, `Attempts.data` read of it (unbuffered.py).
    UNBUFFERED = "unbuffered"


class Attempts:
    """One request's attempts at replicas: what was tried, what is left, what went wrong.

    The retry rule lives in `retry()`; the attempt in progress (its reply, what
    was read of it, the endpoint's verdict) is kept here too, so a request
    allocates one object for all of it.
    """

    __slots__ = (
        "also",
        "data",
        "deadline",
        "failed",
        "first",
        "held",
        "kept",
        "last_error",
        "made",
        "mark",
        "outcome",
        "rename",
        "retries_left",
        "tried",
        "up",
        "watch",
    )

    def __init__(
        self, deadline: float, retries: int, mark: bytes = MARK, also: tuple[bytes, ...] = ()
    ) -> None:
        self.deadline = deadline
        # What opens an engine's error frame in this API's streams, and a second opening
        # looked for too (None: none; inband.py).
        self.mark = mark
        self.also = also
        self.retries_left = retries
        # Attempts begun (`begin`): more than one, and the router retried for the client.
        self.made = 0
        # Replicas not to choose again; a list only once there is one.
        self.tried: Sequence[str] = ()
        self.failed: Failed | None = None
        self.last_error = ""
        # The attempt in progress.
        self.outcome = Outcome.ABANDONED
        self.up: UpstreamReply | None = None
        self.data = b""
        # Bytes of the attempt's answer charged to the held answers' bound (`hold_within`),
        # given back once (`let_go`), or handed to the server with a large answer.
        self.held = 0
        # Bytes of `failed`'s body charged to the held answers' bound: it is held while
        # the request is retried elsewhere. Given back once (`drop_kept`), or handed to
        # the server with the answer that relays it.
        self.kept = 0
        self.first = b""
        self.watch: ErrorFrameWatch | None = None
        # A llama.cpp answer for a LoRA adapter: its name written back (router/request/lora.py).
        self.rename: Rename | None = None

    def skip(self, eid: str) -> None:
        """Leave `eid` out from now on (not an attempt: nothing was sent to it)."""
        if isinstance(self.tried, list):
            self.tried.append(eid)
        else:
            self.tried = [eid]

    def retry(self, eid: str, now: float, *, elsewhere: bool = True) -> bool:
        """Whether the failed attempt at `eid` may be followed by one elsewhere.

        Yes while retries are left, the deadline has not passed and (`elsewhere`)
        another replica may still be chosen; a yes counts one retry and leaves
        `eid` out from then on.
        """
        if self.retries_left > 0 and now < self.deadline and elsewhere:
            self.retries_left -= 1
            self.skip(eid)
            return True
        return False

    def final(self) -> bool:
        """Whether the failure kept for relaying is no client's to retry
        (`x-should-retry: false`): the router's own fault, or the router made more than
        one attempt already, each of the SDKs' retries (two by default) a round more."""
        failed = self.failed
        return (failed is not None and failed.final) or self.made > 1

    def exhausted(self, model: str) -> NoReplica:
        """The refusal once every replica of `model` was tried (`last_error` the last
        failure): a client's retry may fare better only after a single attempt."""
        why = f"every replica was tried ({self.last_error})"
        return NoReplica(model, why, again=self.made < 2)

    def begin(self) -> None:
        """A new attempt: nothing read, no verdict yet."""
        self.made += 1
        self.outcome = Outcome.ABANDONED
        self.up = None
        self.watch = None

    def let_go(self, answers: HeldAnswers) -> None:
        """The attempt's answer held no more: its charge given back (once: it zeroes)."""
        answers.held_bytes -= self.held
        self.held = 0

    def drop_kept(self, answers: HeldAnswers) -> None:
        """`failed`'s body held no more: its charge given back (once: it zeroes)."""
        answers.held_bytes -= self.kept
        self.kept = 0

    def answered(
        self, eid: str, up: UpstreamReply, data: bytes | None, answers: HeldAnswers
    ) -> None:
        """`eid` answered an error (a retryable status, `is_retryable`, or a Messages
        error) and `data` (None: a body over max_answer_bytes or the held answers'
        bound): the answer kept for relaying if no retry follows, with the attempt's
        charge for it (`kept`); the one it replaces given back."""
        code = up.status
        self.outcome = classify_status(code)
        self.drop_kept(answers)
        self.data = b""
        if code == 401 or code == 403:
            # The router's engine key, refused: the replica's failure, never
            # the client's, and the engine's body is not the client's to read.
            self.failed = engine_refused(code)
        elif data is None:
            self.failed = too_large(code)
            self.last_error = f"{eid} answered {code} with a body over the router's bounds"
            return
        else:
            self.failed = Failed(code, data, up.content_type, up.headers.get("Retry-After"))
            self.kept, self.held = self.held, 0
        self.last_error = f"{eid} answered {code}"


def is_retryable(status: int) -> bool:
    """Whether an engine's answer with `status` may be retried on another replica."""
    # 401/403: the engine refused the router's key for it (a replica restarted
    # with a new key the list does not carry yet); another replica may accept.
    return status >= 500 or status in (401, 403, 429)


def engine_refused(status: int) -> Failed:
    """What a client gets when the last replica tried refused the router's engine key
    (401/403): 502, the gateway's failure, in OpenAI's shape."""
    body = error_body(
        f"A replica refused the router's credentials for it (HTTP {status}); "
        "the router's operator must fix the engine key.",
        type="upstream_error",
        code="engine_refused_key",
    )
    return Failed(502, body, JSON, final=True)


def too_large(status: int) -> Failed:
    """What a client gets when the last replica tried answered an error whose body was
    over max_answer_bytes, or would have passed max_held_answer_bytes (unbuffered.py
    says why it is not relayed): 502, the gateway's failure, in OpenAI's shape."""
    body = error_body(
        f"A replica answered HTTP {status} with a body larger than the router holds "
        "(max_answer_bytes for one answer, max_held_answer_bytes for all held at once); "
        "it was not relayed.",
        type="upstream_error",
        code="answer_too_large",
    )
    return Failed(502, body, JSON)


async def hold_within(up: UpstreamReply, limit: int, answers: HeldAnswers, att: Attempts) -> bool:
    """Read the body into `att.data`, each chunk charged to `answers` as it comes in
    (`att.held`): True when it is all in within `limit` and `answers`' bound; else
    False, what was read of it in `att.data`, the rest unread. A declared Content-Length
    that would pass either is taken at its word: nothing is read.

    A body of one chunk is that chunk; a longer one is written into one buffer as it
    comes (`_joining`), not kept in pieces and joined: the pieces and their join were
    the answer twice over."""
    data = up.body_in(limit)
    if data is not None:
        # The usual answer, in with its head: no header looked up (bench/RESULTS.md,
        # "a `Headers` object and a generic `get`"). It is in memory already, so it is
        # held whatever the bound; the charge says so.
        att.held = len(data)
        answers.held_bytes += att.held
        att.data = data
        return True
    declared = up.headers.get("Content-Length")
    if declared is not None and declared.isdigit():
        size = int(declared)
        if size > limit or answers.held_bytes + size > answers.limit_bytes:
            att.data = b""
            return False
    first = b""
    buf: io.BytesIO | None = None
    size = 0
    try:
        while True:
            chunk = await up.chunk()
            if not chunk:
                break
            if buf is not None:
                buf.write(chunk)
            elif not first:
                first = chunk
            else:
                buf = _joining(first)
                buf.write(chunk)
                first = b""
            n = len(chunk)
            size += n
            answers.held_bytes += n
            if size > limit or answers.held_bytes > answers.limit_bytes:
                att.held = size
                att.data = first if buf is None else _joined(buf)
                return False
    except BaseException:
        # The engine broke off, or the client left: what was read goes, and its charge.
        answers.held_bytes -= size
        raise
    att.held = size
    att.data = first if buf is None else _joined(buf)
    return True


def _joining(first: bytes) -> io.BytesIO:
    """The buffer of a body that came in more than one chunk, `first` in it, grown as
    the rest comes (in place where it can: a large block's pages are remapped, not
    copied). Not sized at once to a declared length: that would take (and write zeroes
    over) memory its bound has not been charged with yet."""
    buf = io.BytesIO()
    buf.write(first)
    return buf


def _joined(buf: io.BytesIO) -> bytes:
    """What was written to `buf`, as bytes. CPython hands over the buffer's own bytes
    object when nothing else shares it (elsewhere: one copy, as a join was)."""
    return buf.getvalue()


def another(snaps: Sequence[Snapshot], tried: Sequence[str], eid: str) -> bool:
    """Whether a replica other than `eid` and those tried may still be chosen.

    Asked before dropping a held stream: unlike a 5xx answer's body, it cannot be
    kept for relaying once the connection is closed.
    """
    return any(
        s.id != eid and s.id not in tried and s.breaker is not BreakerState.OPEN for s in snaps
    )


async def attempt(
    st: Router, call: Call, att: Attempts, eid: str, snaps: Sequence[Snapshot]
) -> Step:
    """Send the request to `eid` and read until it is safe to decide (the module
    docstring); each failure names what the request falls back to when no retry may
    follow (`Attempts.retry`)."""
    clock = st.clock
    fallback = Step.RELAY_FAILED
    elsewhere = True
    error: UpstreamError | None = None
    try:
        up = att.up = await st.forward.post(
            st.urls[eid] + call.path,
            _body_for(st, call, att, eid),
            _head_for(st, call, eid),
            timeout_s=max(0.001, att.deadline - clock.monotonic()),
            endpoint_id=eid,
            idle_timeout_s=st.cfg.stream_idle_timeout_s,
        )
        limit = st.cfg.max_answer_bytes
        if is_retryable(up.status):
            whole = await hold_within(up, limit, st.answers, att)
            att.answered(eid, up, att.data if whole else None, st.answers)
        elif not up.is_event_stream:
            return await _whole_answer(st, call, att, eid, up)
        else:
            # The head waits for the first bytes: until they come nothing has
            # reached the client, so an engine that dies in prefill is still
            # retried elsewhere.
            watch = att.watch = ErrorFrameWatch(att.mark, also=att.also)
            openers = () if call.api is None else call.api.openers
            first = await _head(up, watch, openers)
            att.first = first if att.rename is None else att.rename.feed(first)
            marks = (att.mark, *att.also)
            if not (watch.endpoint_failure and nothing_before_error(first, marks, openers)):
                return Step.STREAM
            # The engine's 5xx error event before any output, and the head not
            # sent: as safe to retry as a 5xx status. A held stream cannot be
            # kept for later, so only when another replica may take it; else
            # it is relayed as is, and the relay keeps the verdict.
            att.outcome = Outcome.ENDPOINT_FAILURE
            att.last_error = f"{eid} sent error event {watch.code} before any output"
            elsewhere = another(snaps, att.tried, eid)
            fallback = Step.STREAM
    except UpstreamError as exc:
        att.outcome = Outcome.ENDPOINT_FAILURE
        att.last_error = str(exc)
        error = exc
    if att.retry(eid, clock.monotonic(), elsewhere=elsewhere):
        st.metrics.retry(st.served_name.get(call.model, call.model), eid)
        return Step.RETRY
    if error is not None:
        why = f"last attempt failed ({error})"
        raise NoReplica(call.model, why, again=att.made < 2) from error
    return fallback


async def _whole_answer(st: Router, call: Call, att: Attempts, eid: str, up: UpstreamReply) -> Step:
    """A whole answer that is not retried: RELAY once read within max_answer_bytes and
    the held answers' bound, else relayed as it arrives (UNBUFFERED), but for a
    Messages error answer, whose client reads only Anthropic's error shape: nothing of
    it has gone out, so it is the router's 502 (RELAY_FAILED, reshaped on the way out)
    rather than the engine's bytes unreshaped."""
    whole = await hold_within(up, st.cfg.max_answer_bytes, st.answers, att)
    if not whole:
        if up.status >= 400 and call.api is not None and call.api.anthropic:
            att.answered(eid, up, None, st.answers)
            return Step.RELAY_FAILED
        return Step.UNBUFFERED
    if att.rename is not None:
        att.data = att.rename.feed(att.data) + att.rename.flush()
    return Step.RELAY


async def _head(up: UpstreamReply, watch: ErrorFrameWatch, openers: tuple[bytes, ...]) -> bytes:
    """A stream's first bytes, read on while they hold only events without output (a
    chat stream's role opener, a Messages or Responses stream's start: inband.py): the
    first token, or the engine's error, is right behind. At most MAX_OPENER_READS more."""
    first = await up.chunk()
    watch.feed(first)
    reads = 0
    while first and not watch.seen and openers_only(first, openers):
        more = await up.chunk()
        watch.feed(more)
        first += more
        reads += 1
        if not more or reads == MAX_OPENER_READS:
            break
    return first


def _body_for(st: Router, call: Call, att: Attempts, eid: str) -> bytes:
    """The body `eid` gets: the client's, with the request's engine priority where the
    engine orders its queue by one (enginepriority.py), or for a LoRA adapter on
    llama.cpp the adapter selected by its id (lora.py), whose answer then gets its
    name back. A multipart upload (audio) goes as it came: a form has no JSON to select
    an adapter in, and llama-server, the one engine selected so, takes no upload (its
    404 is relayed)."""
    att.rename = None
    n = call.engine_priority
    if n is not None and eid in st.prioritized:
        return enginepriority.with_priority(call.body, n)
    if st.lora_ids and (call.api is None or not call.api.form):
        ids = st.lora_ids.get(eid)
        lora_id = ids.get(call.model) if ids is not None else None
        if lora_id is not None:
            att.rename = Rename(call.model)
            return lora.select(call.body, lora_id)
    return call.body


def _head_for(st: Router, call: Call, eid: str) -> HeaderLines:
    """The header lines `eid` gets: the call's, and its engine key where it has one
    (`Router.engine_auth`)."""
    auth = st.engine_auth.get(eid)
    if auth is None:
        return call.fwd
    return HeaderLines(call.fwd.lines + header_lines({"Authorization": auth}))
