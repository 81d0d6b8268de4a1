"""The OpenAI proxy: parse once, choose, dispatch, relay.

One request's life:

1. key check, body read and JSON decoded once (intake.py: size, bytes in
   flight, slow bodies, depth);
2. `model` names the candidates; unknown → 404; known with no replica → held
   (waits.py);
3. the policy chooses (scores kept for the debug header and log);
4. `Registry.acquire()` → release, reported exactly once with the outcome;
5. until a byte has gone to the client, a connect error, timeout, 5xx or 429
   is retried on a *different* replica while retries and deadline remain
   (attempts.py);
6. a stream is relayed chunk by chunk as it arrives (relay.py); a whole answer
   goes back as one;
7. the request is counted once, whichever way it ended (accounting.py).

Cancellation (a client disconnect cancels the handler:
`FastProtocol.connection_lost`) can land on any await below; every release sits
in a `finally` that follows its acquire with no await in between.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from typing import Final

from llmgw.router.errors import (
    FlowRefused,
    KeyRevoked,
    ModelNotAllowed,
    ModelRemoved,
    NoReplica,
)
from llmgw.router.http.answers import HAND_OVER_BYTES, Hold, Whole, whole
from llmgw.router.http.connection import Answer, Request, Stream
from llmgw.router.metrics import DISCONNECTED, ENGINE_ERROR, OK, REJECTED, UNAVAILABLE
from llmgw.router.replicas.breaker import Outcome, classify_status
from llmgw.router.replicas.registry import Release, Snapshot
from llmgw.router.request import enginepriority
from llmgw.router.request.accounting import bound_usage, count, count_call, refused, tag
from llmgw.router.request.admission import admit, unknown_model
from llmgw.router.request.attempts import Attempts, Step, attempt
from llmgw.router.request.call import Call, request_id
from llmgw.router.request.inband import MARK
from llmgw.router.request.intake import ByteBudget, Intake, peer_of, read_json
from llmgw.router.request.intake import refused as logged_refusal
from llmgw.router.request.refusals import (
    bad_request,
    flow_refused,
    model_not_allowed,
    model_not_found,
    unauthorized,
    unavailable,
)
from llmgw.router.request.relay import Tally, relay
from llmgw.router.request.tenants import Charge, Tenant
from llmgw.router.request.tokens import Usage, usage_of
from llmgw.router.request.tracing import TRACEPARENT, Tracing, as_came
from llmgw.router.request.unbuffered import relay_rest
from llmgw.router.request.usagebound import completion_bound
from llmgw.router.request.waits import (
    CRITICAL,
    home_of,
    is_critical,
    key_in_force,
    must_queue,
    wait_for_replica,
    wait_turn,
)
from llmgw.router.routing.affinity import NO_KEY, route_key
from llmgw.router.routing.scheduler import Decision
from llmgw.router.upstream.base import HeaderLines, UpstreamReply, header_lines
from llmgw.router.wiring import Router
from llmgw.runtime.logs import kv
from llmgw.runtime.peers import share_of

log: Final = logging.getLogger(__name__)

EMBEDDINGS: Final = "/v1/embeddings"
# The proxied routes (http/routes.py); any other method on them is a 405.
POST_PATHS: Final = frozenset({"/v1/chat/completions", "/v1/completions", EMBEDDINGS})
# Endpoints, and content types per endpoint, whose answer lines `Proxy._lines` keeps.
_MAX_LINES: Final = 256
# What flow control makes of a request before its first attempt (Proxy._turn).
GO: Final = 0
WAIT: Final = 1
PLACE: Final = 2
# What an error answer costs a key's tokens and budget: the engine counted none.
NO_TOKENS: Final = Usage(prompt=0, completion=0, cached=0)


class Proxy:
    """Handlers for the proxied routes, and the routing every proxied request gets
    (`route`, the passed-through APIs' too); all state lives in Router."""

    def __init__(self, state: Router) -> None:
        self.state = state
        # Read once: max_inflight_body_bytes takes effect on restart.
        cfg = state.cfg
        self.budget = ByteBudget(
            cfg.max_inflight_body_bytes,
            each=share_of(
                cfg.max_inflight_body_bytes, cfg.client_share, at_least=cfg.upload_limit()
            ),
        )
        # Endpoint → content type → the answer's header lines but x-request-id
        # (`_lines_for`): the same for every answer of an endpoint.
        self._lines: dict[str, dict[str, bytes]] = {}

    async def answer(self, request: Request) -> Answer:
        """The proxied routes (chat, completions, embeddings); a stream is a `Stream`
        it has already sent."""
        st = self.state
        t0 = st.clock.monotonic()
        rid = request_id(request.headers.get("x-request-id"))
        path = request.path
        tenant: Tenant | None = None
        if st.keys.enabled:
            tenant = st.keys.check(request.headers.get("Authorization"))
            if tenant is None:
                return refused(st, unauthorized(), rid, path, t0)
        try:
            got = await read_json(request, st.cfg, self.budget, rid)
        except asyncio.CancelledError:
            count(st, rid, path, t0, status=499, outcome=DISCONNECTED)
            raise
        if type(got) is not Intake:
            assert isinstance(got, Whole)
            return refused(st, got, rid, path, t0)
        # Routing is awaited from here, not from a coroutine of its own: compiled, each
        # level of coroutine costs a generator and its environment per request, and a
        # pass through it each time the request resumes.
        try:
            call = self._call(request, got, rid, t0, tenant)
            if type(call) is not Call:
                assert isinstance(call, Whole)
                return call
            st.loads.started(call.model)
            try:
                return await self.route(call)
            finally:
                st.loads.finished(call.model)
        finally:
            got.release()

    def _call(
        self, request: Request, got: Intake, rid: str, t0: float, tenant: Tenant | None
    ) -> Call | Whole:
        """The request to route, or the router's refusal of it: no model, an unknown one,
        one its key may not use or has spent, a body nested too deeply to key."""
        st = self.state
        path = request.path
        doc = got.doc
        model = doc.get("model")
        if type(model) is not str or not model:
            msg = "You must provide a model parameter."
            return refused(st, bad_request(msg, param="model"), rid, path, t0)
        if model not in st.known_models:
            return unknown_model(st, model, rid, path, t0)
        charge = admit(st, tenant, model, got, rid, t0=t0, path=path)
        if isinstance(charge, Whole):
            return charge
        hashes = NO_KEY
        if st.policy.uses_prefix and path != EMBEDDINGS:
            # Content chain, and the session hint beside it (X-Session-ID, else the
            # OpenAI `user` field): affinity.py; routing works without either.
            try:
                hashes = route_key(doc, request.headers.get("x-session-id"))
            except RecursionError:
                why = "The JSON body of your request is nested too deeply."
                resp = logged_refusal(bad_request(why), rid, "json nested too deeply", request)
                if isinstance(charge, Charge):
                    charge.refund()
                return refused(st, resp, rid, path, t0)
        limit = doc.get("max_completion_tokens")
        if type(limit) is not int:
            limit = doc.get("max_tokens")
        return Call(
            request,
            rid=rid,
            path=path,
            t0=t0,
            model=model,
            body=got.body,
            hashes=hashes,
            streams=doc.get("stream") is True,
            charge=charge,
            tenant=tenant,
            max_tokens=limit if type(limit) is int else None,
            completion_most=completion_bound(limit, doc.get("n"), doc.get("prompt")),
            engine_priority=enginepriority.of(tenant, doc),
        )

    async def route(self, call: Call) -> Answer:
        """Choose, attempt, and relay what the attempts decided; every exit is counted.

        A streamed request counts as pending at its endpoint until its first token
        is in (`Snapshot.pending`): the live sign of a queue at the engine."""
        st = self.state
        model = call.model
        att = self._attempts(call)
        tally: Tally | None = None
        try:
            while True:
                snaps = st.registry.snapshots(model)
                peek = st.flow.enabled and not call.queued
                decision = st.policy.choose(snaps, call.hashes, att.tried, record=not peek)
                turn = self._turn(call, decision, snaps) if peek else GO
                if turn != GO:
                    decision, snaps = await self._flow(call, att, turn, decision, snaps)
                if decision.endpoint_id is None:
                    if att.failed is not None:
                        return self._relay_failed(call, att)
                    decision, snaps = await self._hold(call, att)
                eid = decision.endpoint_id or ""
                self._trace(call, att, decision)
                release = st.registry.acquire(eid, pending=call.streams, max_tokens=call.max_tokens)
                if release is None:
                    # Its half-open probe is taken or it just opened: another replica.
                    att.skip(eid)
                    continue
                call.eid = eid  # only now: `_finish` charges a call with an endpoint
                att.begin()  # no await from acquire to this try: release runs once
                try:
                    step = await attempt(st, call, att, eid, snaps)
                    release.started()  # the first token, the whole answer or a failure is in
                    if step is Step.STREAM:
                        tally = self._tally(call, att, release)
                        out = self._out_headers(call, att, decision, debug=_debug(call))
                        resp = await relay(st.clock, call, att, tally, out)
                        self._streamed(call, att, tally, decision, snaps)
                        return resp
                    if step is Step.UNBUFFERED:
                        return await self._unbuffered(call, att, decision, snaps)
                    # A retry: the loop's next turn (mypyc has no `continue` in try/finally).
                    if step is not Step.RETRY:
                        return self._whole(call, att, step, decision, snaps)
                finally:
                    release(att.outcome)
                    self._attempt_over(call, att)
        except NoReplica as exc:
            return self._unavailable(call, exc)
        except FlowRefused as exc:
            return self._flow_refused(call, exc)
        except KeyRevoked as exc:
            return self._revoked(call, exc)
        except ModelRemoved:
            return self._removed(call)
        except asyncio.CancelledError:
            self._disconnected(call, tally, decision, snaps)
            raise
        finally:
            self._finish(call, att, tally)

    def _attempts(self, call: Call) -> Attempts:
        """The call's attempts, with its engine header lines made (`_engine_head`)."""
        cfg = self.state.cfg
        self._engine_head(call)
        api = call.api
        if api is None:
            return Attempts(call.t0 + cfg.request_timeout_s, cfg.max_retries, MARK)
        deadline = call.t0 + cfg.request_timeout_s
        return Attempts(deadline, cfg.max_retries, api.error_mark, api.error_also)

    async def _flow(
        self, call: Call, att: Attempts, turn: int, decision: Decision, snaps: list[Snapshot]
    ) -> tuple[Decision, list[Snapshot]]:
        """The call's choice once flow control held it (`turn` WAIT: once granted) or
        placed it (PLACE): a new choice among the replicas as they are now, for a
        critical request among those where it starts soonest (FlowGate.exclude_for).
        `decision`: the choice asked before, whose prefix matches name its home."""
        st = self.state
        band = CRITICAL
        if turn == WAIT:
            band = await wait_turn(st, call, decision, att.deadline)
            snaps = st.registry.snapshots(call.model)
        left_out: Collection[str] = att.tried
        if band == CRITICAL:
            home = home_of(decision, snaps)
            # An engine's priority order helps only a request that carries its band there.
            ordered = st.prioritized if call.engine_priority is not None else ()
            left_out = st.flow.exclude_for(band, snaps, att.tried, home, ordered)
        return st.policy.choose(snaps, call.hashes, left_out), snaps

    def _turn(self, call: Call, decision: Decision, snaps: Sequence[Snapshot]) -> int:
        """What flow control makes of the call before its first attempt, asked once:
        WAIT when it holds it (others wait, or the chosen replica's load is at
        saturation: flowgate.py); PLACE for a critical request not held at saturation
        (it goes where it starts soonest: `FlowGate.exclude_for`); else GO. `decision` was
        asked without dispatching (a choice never sent must not teach the prefix index
        a holder); a call that goes where it says is dispatched there, the policy told."""
        st = self.state
        flow = st.flow
        least = decision.least
        if flow.waiting or (least is not None and least >= flow.saturated_load):
            call.queued = True
            if must_queue(st, call.model, least, snaps, tenant=call.tenant):
                return WAIT
            if is_critical(call.tenant):
                return PLACE
        st.policy.dispatched(decision, snaps, call.hashes)
        return GO

    def _attempt_over(self, call: Call, att: Attempts) -> None:
        """An attempt's reply closed (its engine's work aborted if unread) and, under
        flow control, its slot offered to the next waiter."""
        st = self.state
        if att.up is not None:
            att.up.close()
        if att.held:
            att.let_go(st.answers)
        flow = st.flow
        if flow.waiting or flow.reserved:
            flow.freed(call.model, st.registry.snapshots)

    def _streamed(
        self,
        call: Call,
        att: Attempts,
        tally: Tally,
        decision: Decision,
        snaps: Sequence[Snapshot],
    ) -> None:
        """A relayed stream's outcome; its prefix bookkeeping when served in full."""
        call.result = tally.result
        if att.outcome is Outcome.OK:
            self._served(call, decision, snaps, tally.usage.usage)

    def _disconnected(
        self, call: Call, tally: Tally | None, decision: Decision, snaps: Sequence[Snapshot]
    ) -> None:
        """The client disconnected (handler cancellation): its own outcome, never a 200,
        unless its stream's final event had gone out (streamend.py)."""
        call.result = DISCONNECTED
        if tally is not None and tally.result == OK:
            call.result = OK
            self._served(call, decision, snaps, tally.usage.usage)

    def _engine_head(self, call: Call) -> None:
        """The engine's header lines (`Call.fwd`): the call's head, the trace context
        (the client's passed on, or tracing's own span: tracing.py), the request id."""
        head = call.head
        headers = call.request.headers
        tracing = self.state.tracing
        if tracing is None:
            if TRACEPARENT in headers:  # here, not in as_came: no call when none came
                head += as_came(headers)
        else:
            call.span, lines = tracing.start(headers, call.path, call.model, call.rid)
            head += lines
        call.fwd = HeaderLines(head + call.rid_line)

    async def _hold(self, call: Call, att: Attempts) -> tuple[Decision, list[Snapshot]]:
        """No replica may be chosen: NoReplica if every one was tried, else wait for one
        as for a model with no replica (none at all, or only breakers refused: another
        request holds the half-open probe)."""
        st = self.state
        if att.last_error:
            raise att.exhausted(call.model)
        held_from = st.clock.monotonic()
        got = await wait_for_replica(
            st,
            call.model,
            call.hashes,
            t0=call.t0,
            deadline=att.deadline,
            peer=peer_of(call.request),
        )
        if call.span is not None:
            tracing_of(st).held(call.span, st.clock.monotonic() - held_from)
        key_in_force(st, call.tenant, call.model)
        return got

    def _trace(self, call: Call, att: Attempts, decision: Decision) -> None:
        """An attempt's span event (tracing on) and debug log line (debug on)."""
        st = self.state
        if call.span is not None:
            tries = st.cfg.max_retries - att.retries_left + 1
            tracing_of(st).attempt(call.span, decision, tries, att.last_error)
        if log.isEnabledFor(logging.DEBUG):
            why = decision.header()
            to = decision.endpoint_id
            log.debug(kv("route", rid=call.rid, model=call.model, to=to, why=why))

    def _tally(self, call: Call, att: Attempts, release: Release) -> Tally:
        """The metrics' side of a stream about to be relayed (relay.py)."""
        st = self.state
        up = att.up
        assert up is not None
        call.status = up.status
        itl = st.metrics.itl(st.served_name.get(call.model, call.model))
        return Tally(itl, call.api, release)

    def _whole(
        self,
        call: Call,
        att: Attempts,
        step: Step,
        decision: Decision,
        snaps: Sequence[Snapshot],
    ) -> Answer:
        """A whole answer: the engine's (RELAY), or the last failure kept (RELAY_FAILED)."""
        if step is Step.RELAY_FAILED:
            return self._relay_failed(call, att)
        up = att.up
        assert up is not None
        status = call.status = up.status
        att.outcome = classify_status(status)
        resp: Whole
        api = call.api
        if not _debug(call):
            # The usual answer: its head's lines mostly made already.
            lines = self._lines_for(call.eid, up, call.rid_line)
            if api is not None and api.anthropic:
                lines += _anthropic_rid_line(call.rid)
            if call.charge is not None:
                lines += call.charge.header_lines()
            resp = Whole(status, att.data, lines)
        else:
            resp = whole(status, att.data, self._out_headers(call, att, decision, debug=True))
        if att.held > HAND_OVER_BYTES:
            # The client's transport may keep it past the handler: so does its charge.
            resp.hold = Hold(self.state.answers, att.held)
            att.held = 0
        if status < 300:
            call.result = OK
            call.usage = usage_of(att.data) if api is None else api.usage_of(att.data)
        else:
            call.result = ENGINE_ERROR
        if att.outcome is Outcome.OK:
            self._served(call, decision, snaps, call.usage)
        return resp

    async def _unbuffered(
        self, call: Call, att: Attempts, decision: Decision, snaps: Sequence[Snapshot]
    ) -> Stream:
        """A whole answer over max_answer_bytes, relayed as it arrives (unbuffered.py)."""
        out = self._out_headers(call, att, decision, debug=_debug(call))
        resp = await relay_rest(self.state, call, att, out)
        if att.outcome is Outcome.OK:
            self._served(call, decision, snaps, call.usage)
        return resp

    def _served(
        self, call: Call, decision: Decision, snaps: Sequence[Snapshot], usage: Usage | None
    ) -> None:
        """The prefix bookkeeping of a request its endpoint served in full."""
        eid = call.eid
        stats = next((s.stats for s in snaps if s.id == eid), None)
        # The engine's cached_tokens checks the index's guess (feedback.py).
        cached = None if usage is None else usage.cached_reported
        self.state.policy.served(eid, call.hashes, stats, decision=decision, cached_tokens=cached)

    def _finish(self, call: Call, att: Attempts, tally: Tally | None) -> None:
        """Settle the key's charge, count the request, end its span: once, however it ended."""
        st = self.state
        if tally is not None:
            # A stream cut by a disconnect still had its first token and its usage.
            call.ttft, call.usage = tally.ttft, tally.usage.usage
        bound_usage(st, call)  # before it is charged or counted
        charge = call.charge
        if charge is not None:
            if not call.eid:
                charge.refund()  # no engine was asked: refused, or its client left
            elif call.usage is None and call.status >= 400 and call.result != DISCONNECTED:
                # Its engine answered an error, or none answered: no tokens to charge.
                # The estimate would have been spent again by each retry of the SDKs.
                charge.settle(NO_TOKENS)
            else:
                charge.settle(call.usage)
        if att.kept:
            # A failure kept for relaying that was not relayed (a retry answered).
            att.drop_kept(st.answers)
        count_call(st, call)
        if call.span is not None:
            retries = st.cfg.max_retries - att.retries_left
            code = 499 if call.result == DISCONNECTED else call.status
            tracing_of(st).end(
                call.span, endpoint=call.eid, status=code, outcome=call.result, retries=retries
            )

    def _relay_failed(self, call: Call, att: Attempts) -> Whole:
        """The last retryable failure, as the engine answered it (attempts.py), with its
        charge to the held answers' bound (`Attempts.kept`)."""
        failed = att.failed
        assert failed is not None
        call.status = failed.status
        call.result = ENGINE_ERROR
        head = failed.headers(call.rid, call.eid, final=att.final())
        resp = whole(failed.status, failed.body, head)
        if att.kept:
            resp.hold = Hold(self.state.answers, att.kept)
            att.kept = 0
        return resp

    def _unavailable(self, call: Call, exc: NoReplica) -> Whole:
        call.status = 503
        call.result = UNAVAILABLE
        return _limited(call, tag(unavailable(exc), call.rid))

    def _flow_refused(self, call: Call, exc: FlowRefused) -> Whole:
        call.status = exc.status
        call.result = UNAVAILABLE if exc.status == 503 else REJECTED
        return _limited(call, tag(flow_refused(exc), call.rid))

    def _revoked(self, call: Call, exc: KeyRevoked) -> Whole:
        call.result = REJECTED
        if isinstance(exc, ModelNotAllowed):
            # The key stays: its request is given back, as any refusal before an engine.
            call.status = 403
            return _limited(call, tag(model_not_allowed(exc.name, exc.model), call.rid))
        call.status = 401
        why = f"The API key {exc.name!r} was revoked, or expired, while the request waited."
        return tag(unauthorized(why), call.rid)

    def _removed(self, call: Call) -> Whole:
        call.status = 404
        call.result = REJECTED
        return _limited(call, tag(model_not_found(call.model), call.rid))

    def _out_headers(
        self, call: Call, att: Attempts, decision: Decision, *, debug: bool
    ) -> dict[str, str]:
        """The headers of our answer to a relayed one (a stream's, or any with
        `x-llmgw-debug: 1`, which adds the decision's scores and the worker)."""
        up = att.up
        assert up is not None
        out = {
            "Content-Type": up.content_type,
            "x-request-id": call.rid,
            "x-llmgw-endpoint": call.eid,
        }
        api = call.api
        if api is not None and api.anthropic:
            out["request-id"] = call.rid  # where the anthropic package reads it
        if call.charge is not None:
            out.update(call.charge.headers)
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


def _anthropic_rid_line(rid: str) -> bytes:
    """The request id where the anthropic package reads it (as `_out_headers` puts it)."""
    return b"".join((b"request-id: ", rid.encode("utf-8", "surrogateescape"), b"\r\n"))


def _limited(call: Call, resp: Whole) -> Whole:
    """The router's refusal of a routed request, with its key's x-ratelimit-* headers
    (as on every answer to a key with an RPM or TPM), its charge given back first when
    no engine was asked (`Proxy._finish` would, after the headers were written)."""
    charge = call.charge
    if charge is None:
        return resp
    if not call.eid:
        charge.refund()
    for name, value in charge.headers.items():
        resp = resp.with_header(name, value)
    return resp


def _debug(call: Call) -> bool:
    """Whether the client asked for the decision's scores (`x-llmgw-debug: 1`)."""
    return call.request.headers.get("x-llmgw-debug") == "1"


def tracing_of(st: Router) -> Tracing:
    """The router's tracer, where a span says tracing is on."""
    tracing = st.tracing
    assert tracing is not None
    return tracing
