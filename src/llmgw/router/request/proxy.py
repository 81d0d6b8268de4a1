"""The OpenAI proxy: parse once, choose, dispatch, relay.

One request's life:

1. key check, body read and JSON decoded once (intake.py: size, bytes in
   flight, slow bodies, depth);
2. `model` names the candidates; unknown → 404; known with no replica → held;
3. the policy chooses (scores kept for the debug header and log);
4. `Registry.acquire()` → release, reported exactly once with the outcome;
5. until a byte has gone to the client, a connect error, timeout, 5xx or 429
   is retried on a *different* replica while retries and deadline remain:
   `Proxy._attempt` makes one attempt and decides (a `Step`), `Attempts`
   keeps the request's attempts and holds the one retry rule;
6. a stream is relayed chunk by chunk as it arrives; if it breaks, the client
   gets an OpenAI error event and `[DONE]`, never a hang or a silent cut.

Cancellation (a client disconnect cancels the handler: `handler_cancellation`
in app.py under aiohttp's server, `FastProtocol.connection_lost` under the fast
one) can land on any await below; every release sits in a `finally`
that follows its acquire with no await in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import random
from collections.abc import Sequence
from typing import Any, Final

from llmgw.router.apis import anthropic
from llmgw.router.apis.catalog import ROUTES as API_ROUTES
from llmgw.router.apis.catalog import Api
from llmgw.router.errors import (
    FlowRefused,
    HoldQueueFull,
    NoReplica,
    UpstreamError,
    UpstreamTimeout,
    stream_error_frame,
)
from llmgw.router.http.answers import JSON, Whole, json_whole, whole
from llmgw.router.http.connection import Answer, FastRequest, FastStream
from llmgw.router.metrics import (
    DISCONNECTED,
    ENGINE_ERROR,
    OK,
    REJECTED,
    STREAM_BROKEN,
    TIMEOUT,
    UNAVAILABLE,
)
from llmgw.router.replicas.breaker import BreakerState, Outcome, classify_status
from llmgw.router.replicas.registry import Release, Snapshot
from llmgw.router.request import lora
from llmgw.router.request.flow import ANONYMOUS, DEFAULT_BAND
from llmgw.router.request.holding import (
    held_too_long,
    hold_until,
    retry_after_s,
    unplaceable_retry_after_s,
)
from llmgw.router.request.inband import (
    MARK,
    ErrorFrameWatch,
    nothing_before_error,
    role_opener_only,
)
from llmgw.router.request.intake import ByteBudget, Intake, peer_of, read_json, refused
from llmgw.router.request.lora import Rename
from llmgw.router.request.refusals import (
    bad_request,
    error_response,
    flow_refused,
    model_not_found,
    unauthorized,
    unavailable,
)
from llmgw.router.request.streamend import final_event_sent
from llmgw.router.request.tenants import Charge, Tenant
from llmgw.router.request.tokens import StreamUsage, Usage, usage_of
from llmgw.router.request.tracing import Tracing, passed_on
from llmgw.router.routing.affinity import NO_KEY, RouteKey, route_key
from llmgw.router.routing.scheduler import Decision
from llmgw.router.upstream.base import HeaderLines, UpstreamReply, header_lines
from llmgw.router.wiring import Router
from llmgw.runtime.logs import kv
from llmgw.runtime.peers import Peer, share_of
from llmgw.wire.errors import error_body

log: Final = logging.getLogger(__name__)
# The access log (RouterConfig.access_log): one line per request when enabled, whatever
# the process's log level (the setting is what turns it on and off).
access_log: Final = logging.getLogger("llmgw.router.access")
access_log.setLevel(logging.INFO)

# Request ids the router makes: 96 random bits from a generator seeded once per process
# (reseeded in a forked child), not os.urandom, which is a system call per request.
# Unique, not secret: they name requests in logs and headers.
_ids: Final = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def _auth_lines(auth: str) -> bytes:
    """An engine's Authorization header line (its api_key: `Router.engine_auth`)."""
    return header_lines({"Authorization": auth})


def _request_id() -> str:
    # 24 hex digits; to_bytes().hex() costs under half of a format spec.
    return _ids.getrandbits(96).to_bytes(12, "big").hex()


def request_id(given: str | None) -> str:
    """The client's x-request-id when it is one line, else a new id (passthrough.py)."""
    if not given or "\n" in given or "\r" in given:
        return _request_id()
    return given


# While held, look again this often even without a list change: a breaker leaving
# its cooldown makes a replica available without anyone saying so.
HOLD_POLL_S: Final = 0.5
EMBEDDINGS: Final = "/v1/embeddings"
# The first of the header lines of every request to an engine (`HeaderLines`).
_JSON_LINE: Final = b"Content-Type: application/json\r\n"
# Endpoints, and content types per endpoint, whose answer lines `Proxy._lines` keeps.
_MAX_LINES: Final = 256


class _Tally:
    """What one relayed stream leaves for metrics: its outcome, usage and ITL child."""

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


class _Failed:
    """The last retryable error answer, relayed if no other replica can be tried.

    The engine's Retry-After goes with it: a client (the openai package honours
    it) should wait as long as the engine asked, not retry blindly.
    """

    __slots__ = ("body", "content_type", "retry_after", "status")

    def __init__(
        self, status: int, body: bytes, content_type: str, retry_after: str | None = None
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.retry_after = retry_after


class Step(enum.Enum):
    """What one attempt decided (`Proxy._attempt`)."""

    RETRY = "retry"  # it failed before any byte reached the client: another replica
    RELAY = "relay"  # a whole answer (`Attempts.data`), whatever its status
    RELAY_FAILED = "relay failed"  # it failed and nothing is left: `Attempts.failed`
    STREAM = "stream"  # an event stream whose first bytes are in (`Attempts.first`)


class Attempts:
    """One request's attempts at replicas: what was tried, what is left, what went wrong.

    The retry rule lives in `retry()`; the attempt in progress (its reply, what
    was read of it, the endpoint's verdict) is kept here too, so a request
    allocates one object for all of it.
    """

    __slots__ = (
        "data",
        "deadline",
        "failed",
        "first",
        "last_error",
        "mark",
        "outcome",
        "rename",
        "retries_left",
        "tried",
        "up",
        "watch",
    )

    def __init__(self, deadline: float, retries: int, mark: bytes = MARK) -> None:
        self.deadline = deadline
        # What opens an engine's error frame in this API's streams (inband.py).
        self.mark = mark
        self.retries_left = retries
        # Replicas not to choose again; a list only once there is one.
        self.tried: Sequence[str] = ()
        self.failed: _Failed | None = None
        self.last_error = ""
        # The attempt in progress.
        self.outcome = Outcome.ABANDONED
        self.up: UpstreamReply | None = None
        self.data = b""
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

    def begin(self) -> None:
        """A new attempt: nothing read, no verdict yet."""
        self.outcome = Outcome.ABANDONED
        self.up = None
        self.watch = None


def _is_retryable(status: int) -> bool:
    # 401/403: the engine refused the router's key for it (a replica restarted
    # with a new key the list does not carry yet); another replica may accept.
    return status >= 500 or status in (401, 403, 429)


def _engine_refused(status: int) -> _Failed:
    """What a client gets when the last replica tried refused the router's engine key
    (401/403): 502, the gateway's failure, in OpenAI's shape."""
    body = error_body(
        f"A replica refused the router's credentials for it (HTTP {status}); "
        "the router's operator must fix the engine key.",
        type="upstream_error",
        code="engine_refused_key",
    )
    return _Failed(502, body, JSON)


def _another(snaps: Sequence[Snapshot], tried: Sequence[str], eid: str) -> bool:
    """Whether a replica other than `eid` and those tried may still be chosen.

    Asked before dropping a held stream: unlike a 5xx answer's body, it cannot be
    kept for relaying once the connection is closed.
    """
    return any(
        s.id != eid and s.id not in tried and s.breaker is not BreakerState.OPEN for s in snaps
    )


class Proxy:
    """Handlers for the OpenAI routes, under either HTTP server; all state lives in Router."""

    def __init__(self, state: Router) -> None:
        self.state = state
        # Read once: max_inflight_body_bytes takes effect on restart.
        cfg = state.cfg
        self.budget = ByteBudget(
            cfg.max_inflight_body_bytes,
            each=share_of(
                cfg.max_inflight_body_bytes, cfg.client_share, at_least=cfg.max_body_bytes
            ),
        )
        # Endpoint → content type → the answer's header lines but x-request-id
        # (`_lines`): the same for every answer of an endpoint.
        self._lines: dict[str, dict[str, bytes]] = {}

    async def answer(self, request: FastRequest) -> Answer:
        """The proxied routes (chat, completions, embeddings); a stream is a `FastStream`
        it has already sent."""
        st = self.state
        t0 = self.state.clock.monotonic()
        headers = request.headers
        rid = headers.get("x-request-id")
        if not rid or "\n" in rid or "\r" in rid:
            # Echoed in header lines (ours, the engine's): one line or none of it.
            rid = _request_id()
        path = request.path
        tenant: Tenant | None = None
        if st.keys.enabled:
            tenant = st.keys.check(headers.get("Authorization"))
            if tenant is None:
                return self._refused(unauthorized(), rid, path, t0)
        try:
            got = await read_json(request, st.cfg, self.budget, rid)
        except asyncio.CancelledError:
            self._done(rid, path, "", "", 499, DISCONNECTED, t0, None, None)
            raise
        if type(got) is not Intake:
            assert isinstance(got, Whole)
            return self._refused(got, rid, path, t0)
        # What follows is inline, not a coroutine of its own: compiled, each level of
        # coroutine costs a generator and its environment per request, and a pass
        # through it each time the request resumes.
        try:
            body = got.body
            doc = got.doc
            model = doc.get("model")
            if type(model) is not str or not model:
                msg = "You must provide a model parameter."
                return self._refused(bad_request(msg, param="model"), rid, path, t0)
            if model not in st.known_models:
                if st.awaiting_list:
                    why = "the router has not received its endpoint list from the controller yet"
                    resp = unavailable(NoReplica(model, why, retry_after_s=5))
                    return self._refused(resp, rid, path, t0, outcome=UNAVAILABLE)
                # Not the asked-for name as a label: anyone could mint series with it.
                return self._refused(model_not_found(model), rid, path, t0)
            charge: Charge | None = None
            if tenant is not None and tenant.guarded:
                admitted = st.tenants.admit(tenant, model, len(body))
                if isinstance(admitted, Whole):
                    return self._refused(admitted, rid, path, t0, tenant=tenant)
                charge = admitted
            hashes = NO_KEY
            if st.policy.uses_prefix and path != EMBEDDINGS:
                # Content chain, and the session hint beside it (X-Session-ID, else the
                # OpenAI `user` field): affinity.py; routing works without either.
                try:
                    hashes = route_key(doc, headers.get("x-session-id"))
                except RecursionError:
                    why = "The JSON body of your request is nested too deeply."
                    resp = refused(bad_request(why), rid, "json nested too deeply", request)
                    return self._refused(resp, rid, path, t0)
            st.usage.started(model)
            try:
                streams = doc.get("stream") is True
                limit = doc.get("max_completion_tokens")
                if type(limit) is not int:
                    limit = doc.get("max_tokens")
                return await self._route(
                    request,
                    path,
                    body,
                    model,
                    hashes,
                    rid,
                    t0,
                    streams,
                    charge=charge,
                    tenant=tenant,
                    max_tokens=limit if type(limit) is int else None,
                )
            finally:
                st.usage.finished(model)
        finally:
            got.release()

    async def _route(
        self,
        request: FastRequest,
        path: str,
        body: bytes,
        model: str,
        hashes: RouteKey,
        rid: str,
        t0: float,
        streams: bool = False,
        head: bytes = _JSON_LINE,
        api: Api | None = None,
        charge: Charge | None = None,
        tenant: Tenant | None = None,
        max_tokens: int | None = None,
    ) -> Answer:
        """Choose, attempt, and relay what the attempts decided; every exit is counted.

        A streamed request counts as pending at its endpoint until its first token
        is in (`Snapshot.pending`): the live sign of a queue at the engine.
        `head`: the engine's header lines before the request id; `api`: a
        passed-through API's rules (apis.py), None for the proxy's own routes; `charge`:
        a limited key's (tenants.py), whose headers the answer carries and which the
        engine's usage settles; `tenant`: the request's key, for the access log;
        `max_tokens`: the request's, owed at its endpoint until streamed (scheduler.py)."""
        st = self.state
        mark = MARK if api is None else api.error_mark
        att = Attempts(t0 + st.cfg.request_timeout_s, st.cfg.max_retries, mark)
        # The request id as a header line: in the engine's request and our answer's.
        rid_line = b"".join((b"x-request-id: ", rid.encode("utf-8", "surrogateescape"), b"\r\n"))
        tracing = st.tracing
        span: Any = None
        if tracing is None:
            # The client's trace context goes on unchanged (tracing.py).
            tp = request.headers.get("traceparent")
            if tp is not None:
                head += passed_on(tp, request.headers.get("tracestate"))
        else:
            span, trace_lines = tracing.start(request.headers, path, model, rid)
            head += trace_lines
        fwd = HeaderLines(head + rid_line)
        eid = ""
        status = 503
        ttft: float | None = None
        # The answer's outcome for metrics and the access log (metrics.OUTCOMES).
        result = UNAVAILABLE
        usage: Usage | None = None
        tally: _Tally | None = None
        flow = st.flow
        queued = False  # flow control is asked once, before the first attempt
        try:
            while True:
                snaps = st.registry.snapshots(model)
                decision = st.policy.choose(snaps, hashes, att.tried)
                least = decision.least
                if (
                    not queued
                    and flow.enabled
                    and (flow.waiting or (least is not None and least >= flow.saturated_load))
                ):
                    queued = True
                    if self._must_queue(model, least, snaps):
                        await self._wait_turn(model, tenant, att.deadline)
                        continue  # granted: choose again, among replicas as they are now
                if decision.endpoint_id is None:
                    if att.failed is not None:
                        status = att.failed.status
                        result = ENGINE_ERROR
                        return self._relay_failed(att.failed, rid, eid)
                    if att.last_error:
                        raise NoReplica(model, f"every replica was tried ({att.last_error})")
                    # None at all, or only breakers refused (another request holds the
                    # half-open probe): wait for one, as for a model with no replica.
                    held_from = st.clock.monotonic()
                    decision, snaps = await self._hold(
                        model, hashes, t0, att.deadline, peer_of(request)
                    )
                    if span is not None:
                        tracing_of(st).held(span, st.clock.monotonic() - held_from)
                eid = decision.endpoint_id or ""
                if span is not None:
                    tries = st.cfg.max_retries - att.retries_left + 1
                    tracing_of(st).attempt(span, decision, tries, att.last_error)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug(kv("route", rid=rid, model=model, to=eid, why=decision.header()))
                release = st.registry.acquire(eid, pending=streams, max_tokens=max_tokens)
                if release is None:
                    # Its half-open probe is taken or it just opened: another replica.
                    att.skip(eid)
                    continue
                # No await between acquire and this try: release runs exactly once.
                att.begin()
                try:
                    step = await self._attempt(att, model, eid, path, body, fwd, snaps)
                    # The first token is in, or the whole answer, or a failure.
                    release.started()
                    # A retry falls through to the next turn of the loop (no `continue`
                    # here: mypyc compiles this module and has none inside try/finally).
                    if step is not Step.RETRY:
                        if step is Step.RELAY_FAILED:
                            assert att.failed is not None
                            status = att.failed.status
                            result = ENGINE_ERROR
                            return self._relay_failed(att.failed, rid, eid)
                        up = att.up
                        assert up is not None
                        debug = request.headers.get("x-llmgw-debug") == "1"
                        status = up.status
                        resp: Answer
                        if step is Step.RELAY:
                            att.outcome = classify_status(status)
                            if not debug:
                                # The usual answer: its head's lines mostly made already.
                                lines = self._lines_for(eid, up, rid_line)
                                if charge is not None:
                                    lines += charge.header_lines()
                                resp = Whole(status, att.data, lines)
                            else:
                                out = self._out_headers(up, rid, eid, decision, debug, charge)
                                resp = whole(status, att.data, out)
                            if status < 300:
                                result = OK
                                usage = (
                                    usage_of(att.data) if api is None else api.usage_of(att.data)
                                )
                            else:
                                result = ENGINE_ERROR
                        else:
                            itl = st.metrics.itl(st.served_name.get(model, model))
                            tally = _Tally(itl, api, release)
                            out = self._out_headers(up, rid, eid, decision, debug, charge)
                            resp, att.outcome, ttft = await self._stream(
                                request, att, up, out, t0, tally
                            )
                            result, usage = tally.result, tally.usage.usage
                        if att.outcome is Outcome.OK:
                            self._served(eid, hashes, snaps, decision, usage)
                        return resp
                finally:
                    release(att.outcome)
                    if att.up is not None:
                        att.up.close()
                    if flow.waiting:
                        flow.freed(model, st.registry.snapshots)
        except NoReplica as exc:
            status = 503
            result = UNAVAILABLE
            return _tag(unavailable(exc), rid)
        except FlowRefused as exc:
            status = exc.status
            result = UNAVAILABLE if status == 503 else REJECTED
            return _tag(flow_refused(exc), rid)
        except asyncio.CancelledError:
            # The client disconnected (handler cancellation): its own outcome, never a 200,
            # unless its stream's final event had gone out (streamend.py).
            result = DISCONNECTED
            if tally is not None and tally.result == OK:
                result = OK
                self._served(eid, hashes, snaps, decision, tally.usage.usage)
            raise
        finally:
            if tally is not None:
                # A stream cut by a disconnect still had its first token and its usage.
                ttft, usage = tally.ttft, tally.usage.usage
            if charge is not None:
                charge.settle(usage)
            self._done(
                rid,
                path,
                st.served_name.get(model, model),
                eid,
                status,
                result,
                t0,
                ttft,
                usage,
                tenant,
            )
            if span is not None:
                retries = st.cfg.max_retries - att.retries_left
                code = 499 if result == DISCONNECTED else status
                tracing_of(st).end(span, endpoint=eid, status=code, outcome=result, retries=retries)

    def _must_queue(self, model: str, least: float | None, snaps: Sequence[Snapshot]) -> bool:
        """Whether flow control holds this request: its model's replicas are all at
        capacity, or others already wait for them (and it must not pass them)."""
        flow = self.state.flow
        return flow.queued(model) or flow.saturated(least, snaps)

    async def _wait_turn(self, model: str, tenant: Tenant | None, deadline: float) -> None:
        """Wait in flow control's queue for `model` (flowgate.py); FlowRefused at its bounds."""
        st = self.state
        if tenant is None:
            band, who = DEFAULT_BAND, ANONYMOUS
        else:
            band, who = tenant.key.priority, tenant.team or tenant.name
        snapshots = st.registry.snapshots
        await st.flow.wait_turn(
            model,
            band,
            who,
            deadline=deadline,
            still_saturated=lambda: not st.flow.below_capacity(snapshots(model)),
        )

    def _served(
        self,
        eid: str,
        hashes: RouteKey,
        snaps: Sequence[Snapshot],
        decision: Decision,
        usage: Usage | None,
    ) -> None:
        """The prefix bookkeeping of a request `eid` served in full."""
        stats = next((s.stats for s in snaps if s.id == eid), None)
        # The engine's cached_tokens checks the index's guess (feedback.py).
        cached = None if usage is None else usage.cached_reported
        self.state.policy.served(eid, hashes, stats, decision=decision, cached_tokens=cached)

    async def _attempt(
        self,
        att: Attempts,
        model: str,
        eid: str,
        path: str,
        body: bytes,
        fwd: HeaderLines,
        snaps: Sequence[Snapshot],
    ) -> Step:
        """Send the request to `eid` and read until it is safe to decide.

        Until a byte has gone to the client a connect error, timeout, 5xx or 429
        answer, or the engine's 5xx error event before any output, is as safe to
        retry elsewhere as nothing at all; each failure names what the request
        falls back to when no retry may follow (`Attempts.retry`).
        """
        st = self.state
        clock = st.clock
        fallback = Step.RELAY_FAILED
        elsewhere = True
        error: UpstreamError | None = None
        auth = st.engine_auth.get(eid)
        att.rename = None
        if st.lora_ids:
            ids = st.lora_ids.get(eid)
            lora_id = ids.get(model) if ids is not None else None
            if lora_id is not None:
                body = lora.select(body, lora_id)
                att.rename = Rename(model)
        try:
            up = att.up = await st.forward.post(
                st.urls[eid] + path,
                body,
                fwd if auth is None else HeaderLines(fwd.lines + _auth_lines(auth)),
                timeout_s=max(0.001, att.deadline - clock.monotonic()),
                endpoint_id=eid,
                idle_timeout_s=st.cfg.stream_idle_timeout_s,
            )
            code = up.status
            if _is_retryable(code):
                data = await up.read()
                att.outcome = classify_status(code)
                if code == 401 or code == 403:
                    # The router's engine key, refused: the replica's failure, never
                    # the client's, and the engine's body is not the client's to read.
                    att.failed = _engine_refused(code)
                else:
                    retry_after = up.headers.get("Retry-After")
                    att.failed = _Failed(code, data, up.content_type, retry_after)
                att.last_error = f"{eid} answered {code}"
            elif not up.is_event_stream:
                att.data = await up.read()
                if att.rename is not None:
                    att.data = att.rename.feed(att.data) + att.rename.flush()
                return Step.RELAY
            else:
                # The head waits for the first bytes: until they come nothing has
                # reached the client, so an engine that dies in prefill is still
                # retried elsewhere.
                watch = att.watch = ErrorFrameWatch(att.mark)
                first = await up.chunk()
                watch.feed(first)
                if first and not watch.seen and role_opener_only(first):
                    # A chat stream's role opener carries no token; the first
                    # token, or the engine's error, is right behind.
                    more = await up.chunk()
                    watch.feed(more)
                    first += more
                att.first = first if att.rename is None else att.rename.feed(first)
                if not (watch.endpoint_failure and nothing_before_error(first)):
                    return Step.STREAM
                # The engine's 5xx error event before any output, and the head not
                # sent: as safe to retry as a 5xx status. A held stream cannot be
                # kept for later, so only when another replica may take it; else
                # it is relayed as is, and _stream keeps the verdict.
                att.outcome = Outcome.ENDPOINT_FAILURE
                att.last_error = f"{eid} sent error event {watch.code} before any output"
                elsewhere = _another(snaps, att.tried, eid)
                fallback = Step.STREAM
        except UpstreamError as exc:
            att.outcome = Outcome.ENDPOINT_FAILURE
            att.last_error = str(exc)
            error = exc
        if att.retry(eid, clock.monotonic(), elsewhere=elsewhere):
            st.metrics.retry(model, eid)
            return Step.RETRY
        if error is not None:
            raise NoReplica(model, f"last attempt failed ({error})") from error
        return fallback

    def _refused(
        self,
        resp: Whole,
        rid: str,
        path: str,
        t0: float,
        *,
        outcome: str = REJECTED,
        tenant: Tenant | None = None,
    ) -> Whole:
        """The router's own answer before any routing (4xx, or 503 before the first list)."""
        self._done(rid, path, "", "", resp.status, outcome, t0, None, None, tenant)
        return _tag(resp, rid)

    def _out_headers(
        self,
        up: UpstreamReply,
        rid: str,
        eid: str,
        decision: Decision,
        debug: bool,
        charge: Charge | None = None,
    ) -> dict[str, str]:
        """The headers of our answer to a relayed one (a stream's, or any with
        `x-llmgw-debug: 1`, which adds the decision's scores and the worker)."""
        out = {"Content-Type": up.content_type, "x-request-id": rid, "x-llmgw-endpoint": eid}
        if charge is not None:
            out.update(charge.headers)
        if debug:
            out["x-llmgw-scores"] = decision.header()
            if self.state.worker_index is not None:
                out["x-llmgw-worker"] = str(self.state.worker_index)
        return out

    def _lines_for(self, eid: str, up: UpstreamReply, rid_line: bytes) -> bytes:
        """The header lines of a relayed answer (a `Whole`'s): as `_out_headers` would
        make them, from the lines kept for the endpoint and content type."""
        ctype = up.content_type
        by_type = self._lines.get(eid)
        if by_type is None:
            if len(self._lines) >= _MAX_LINES:
                self._lines.clear()  # endpoints that left: a cache, not a record
            by_type = self._lines[eid] = {}
        fixed = by_type.get(ctype)
        if fixed is None:
            if len(by_type) >= _MAX_LINES:
                by_type.clear()  # an engine answering with ever new content types
            fields = {"Content-Type": ctype, "x-llmgw-endpoint": eid}
            fixed = by_type[ctype] = header_lines(fields)
        return fixed + rid_line

    def _done(
        self,
        rid: str,
        path: str,
        model: str,
        eid: str,
        status: int,
        outcome: str,
        t0: float,
        ttft: float | None,
        usage: Usage | None,
        tenant: Tenant | None = None,
    ) -> None:
        """Count the request once (metrics.OUTCOMES) and write its access-log line (which
        names the key and its team, never the key itself)."""
        st = self.state
        duration = st.clock.monotonic() - t0
        if outcome == DISCONNECTED:
            # nginx's convention: the client closed the connection before the answer.
            status = 499
        st.metrics.request_done(model, eid, status, duration, ttft, outcome)
        if usage is not None:
            st.metrics.tokens(model, usage.prompt, usage.completion, usage.cached)
        if tenant is not None:
            # Per team on /metrics (never per key: bounded series); per key in the
            # usage report, for requests that reached a model (tokenusage.py).
            st.metrics.team_done(tenant.team, model, outcome, usage)
            if model:
                st.token_counts.count(tenant.name, tenant.team, model, usage)
        if st.cfg.access_log:
            access_log.info(
                kv(
                    "request",
                    request_id=rid,
                    model=model,
                    endpoint=eid,
                    path=path,
                    status=status,
                    outcome=outcome,
                    ttft_s=None if ttft is None else round(ttft, 6),
                    duration_s=round(duration, 6),
                    prompt_tokens=None if usage is None else usage.prompt,
                    completion_tokens=None if usage is None else usage.completion,
                    cached_tokens=None if usage is None else usage.cached,
                    key=None if tenant is None else tenant.name,
                    team=None if tenant is None else tenant.team,
                )
            )

    async def _hold(
        self, model: str, hashes: RouteKey, t0: float, deadline: float, peer: Peer | None
    ) -> tuple[Decision, list[Snapshot]]:
        """Wait for a replica of `model` (scale from zero); NoReplica when none comes."""
        st = self.state
        clock = st.clock
        hold_s = st.cfg.hold_timeout_s
        hold_deadline = min(deadline, t0 + hold_s)
        # A probe is waited for at most one first cooldown (holding.hold_until).
        probe_wait_until = clock.monotonic() + st.cfg.breaker.cooldown_s
        snaps = st.registry.snapshots(model)
        opened = {s.id: s.opened_total for s in snaps}
        try:
            with st.holding.hold(model, peer):
                while True:
                    now = clock.monotonic()
                    look = st.outlook.get(model)
                    until = hold_until(
                        snaps,
                        now=now,
                        deadline=hold_deadline,
                        opened=opened,
                        outlook=look,
                        probe_wait_until=probe_wait_until,
                    )
                    if until is None and not snaps and look is not None:
                        st.holding.refused(model)
                        raise NoReplica(
                            model,
                            f"it cannot be placed: {look.reason}",
                            retry_after_s=unplaceable_retry_after_s(look),
                            code="model_unplaceable",
                        )
                    if until is None:
                        raise NoReplica(
                            model,
                            "the probe of its open breaker failed",
                            retry_after_s=retry_after_s(snaps),
                        )
                    left = until - now
                    if left > 0:
                        await st.holding.wait_changed(timeout_s=min(left, HOLD_POLL_S))
                    # Also once the wait is over: its end may be the moment a probe opens.
                    snaps = st.registry.snapshots(model)
                    decision = st.policy.choose(snaps, hashes, ())
                    if decision.endpoint_id is not None:
                        return decision, snaps
                    if left > 0:
                        continue
                    if clock.monotonic() < hold_deadline:
                        after = retry_after_s(snaps)
                        raise NoReplica(
                            model,
                            f"every replica's breaker is open (next probe in about {after}s)",
                            retry_after_s=after,
                        )
                    raise NoReplica(model, held_too_long(hold_s, look), retry_after_s=5)
        except HoldQueueFull as exc:
            why = (
                "too many requests from this client address are already waiting"
                if exc.share
                else "too many requests are already waiting"
            )
            raise NoReplica(model, why) from None

    async def _stream(
        self,
        request: FastRequest,
        att: Attempts,
        up: UpstreamReply,
        out_headers: dict[str, str],
        t0: float,
        tally: _Tally,
    ) -> tuple[Answer, Outcome, float | None]:
        """Relay an event stream as it arrives; the outcome is the endpoint's verdict.

        `att.first` is the stream's first chunk, already read (b"": it was empty)
        and already fed to `att.watch`.

        A stream that ends cleanly but carried the engine's own 5xx error event is
        the endpoint's failure too (inband.py). One that goes silent for
        `stream_idle_timeout_s` ends here like a broken one (`UpstreamTimeout`).
        One still producing when the request's own deadline passes is cut the same
        way, but that is no verdict on the engine (ABANDONED, not a failure).
        """
        out_headers["Cache-Control"] = "no-cache"
        # nginx (ingress-nginx by default) buffers proxied bodies unless told not to.
        out_headers["X-Accel-Buffering"] = "no"
        resp: FastStream
        now = self.state.clock.monotonic
        watch = att.watch
        assert watch is not None
        ttft: float | None = None
        scan = tally.usage
        itl = tally.itl
        streamed = tally.streamed
        before = sent = b""
        try:
            resp = request.stream(up.status, out_headers)
            # From here bytes have reached the client: never retried.
            chunk = att.first
            last = 0.0
            if chunk:
                last = now()
                ttft = tally.ttft = last - t0
            while chunk:
                # Written before anything else is looked at: relay latency first.
                await resp.write(chunk)
                # The last two chunks written, for when the stream ends early (streamend.py).
                before, sent = sent, chunk
                scan.feed(chunk)
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
        except UpstreamError as exc:
            if final_event_sent(before, sent):
                # The engine dropped the connection after its last event: complete.
                tally.result = OK
                await _end_quietly(resp)
                return resp, Outcome.OK, ttft
            # Timer slack: the client's deadline timer fires at, not before, `deadline`.
            if isinstance(exc, UpstreamTimeout) and now() >= att.deadline - 0.05:
                verdict, why, code = Outcome.ABANDONED, "the request's deadline passed", 504
                tally.result = TIMEOUT
            else:
                why = f"upstream stream broke: {exc.detail}"
                verdict, code = Outcome.ENDPOINT_FAILURE, 502
                tally.result = STREAM_BROKEN
            log.warning(kv("stream ended early", endpoint=up.endpoint_id, error=exc))
            api = tally.api
            frame = (
                stream_error_frame(why, code=code) if api is None else api.stream_error(why, code)
            )
            try:
                await resp.write(frame)
                await resp.write_eof()
            except ConnectionError:
                pass
            return resp, verdict, ttft
        except ConnectionError:
            # The client went away; closing `up` (the caller's finally) aborts the engine's work.
            return resp, self._gone(tally, before, sent), ttft
        except asyncio.CancelledError:
            # The same under handler cancellation; `_route` reads the verdict from `tally`.
            att.outcome = self._gone(tally, before, sent)
            raise
        try:
            await resp.write_eof()
        except ConnectionError:
            return resp, self._gone(tally, before, sent), ttft
        tally.result = ENGINE_ERROR if watch.seen or up.status >= 300 else OK
        if watch.seen:
            log.warning(
                kv(
                    "engine error event",
                    endpoint=up.endpoint_id,
                    code=watch.code,
                    error=watch.message,
                )
            )
            if watch.endpoint_failure:
                return resp, Outcome.ENDPOINT_FAILURE, ttft
        return resp, Outcome.OK, ttft

    @staticmethod
    def _gone(tally: _Tally, before: bytes, sent: bytes) -> Outcome:
        """The verdict on a stream whose client left: complete if its final event went out."""
        if final_event_sent(before, sent):
            tally.result = OK
            return Outcome.OK
        tally.result = DISCONNECTED
        return Outcome.ABANDONED

    def _relay_failed(self, failed: _Failed, rid: str, eid: str) -> Whole:
        headers = {
            "Content-Type": failed.content_type,
            "x-request-id": rid,
            "x-llmgw-endpoint": eid,
        }
        if failed.retry_after is not None:
            headers["Retry-After"] = failed.retry_after
        return whole(failed.status, failed.body, headers)

    async def models(self, request: FastRequest) -> Whole:
        """GET /v1/models: every known model, OpenAI's list shape."""
        st = self.state
        names = st.known_models
        if st.keys.enabled:
            tenant = st.keys.check(request.headers.get("Authorization"))
            if tenant is None:
                return self._refused(unauthorized(), "", request.path, st.clock.monotonic())
            if tenant.models is not None:
                names = names & tenant.models
        data: list[dict[str, Any]] = [_model_object(m) for m in sorted(names)]
        return json_whole({"object": "list", "data": data})

    async def model(self, request: FastRequest) -> Whole:
        """GET /v1/models/{model}: one known model (the openai package's models.retrieve)."""
        st = self.state
        allowed: frozenset[str] | None = None
        if st.keys.enabled:
            tenant = st.keys.check(request.headers.get("Authorization"))
            if tenant is None:
                return self._refused(unauthorized(), "", request.path, st.clock.monotonic())
            allowed = tenant.models
        model = request.match_info["model"]
        if model not in st.known_models or (allowed is not None and model not in allowed):
            return self._refused(
                model_not_found(model), "", request.path, self.state.clock.monotonic()
            )
        return json_whole(_model_object(model))

    async def no_route(self, request: FastRequest) -> Whole:
        """Any other /v1 request: OpenAI's 404 (or 405 on a served path; Anthropic's shape on
        its Messages paths), not aiohttp's text."""
        path, method = request.path, request.method
        t0 = self.state.clock.monotonic()
        allowed = (
            "POST"
            if path in POST_PATHS or path in API_ROUTES
            else "GET"
            if path.startswith("/v1/models")
            else ""
        )
        api = API_ROUTES.get(path)
        if api is not None and api.anthropic:
            # Anthropic's clients read errors in their API's shape (anthropic.py).
            msg = f"Method {method} is not allowed on {path}; use POST."
            resp = whole(405, anthropic.error_body(405, msg), {"Allow": "POST"}, content_type=JSON)
        elif allowed:
            resp = error_response(
                405,
                f"Method {method} is not allowed on {path}; use {allowed}.",
                type="invalid_request_error",
                code="method_not_allowed",
                headers={"Allow": allowed},
            )
        else:
            resp = error_response(
                404,
                f"Invalid URL ({method} {path}).",
                type="invalid_request_error",
                code="unknown_url",
            )
        # `path` is the caller's: logged, never a label.
        return self._refused(resp, "", path, t0)


# The proxied routes (app.py); any other method on them is a 405.
POST_PATHS: Final = frozenset({"/v1/chat/completions", "/v1/completions", EMBEDDINGS})


def _model_object(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "llmgw"}


async def _end_quietly(resp: FastStream) -> None:
    """End an answer whose client may already be gone."""
    with contextlib.suppress(ConnectionError):
        await resp.write_eof()


def tracing_of(st: Router) -> Tracing:
    """The router's tracer, where a span says tracing is on."""
    tracing = st.tracing
    assert tracing is not None
    return tracing


def _tag(resp: Whole, rid: str) -> Whole:
    return resp.with_header("x-request-id", rid)
