"""Each request counted once: metrics, token counts per team and key, the access log.

Every way a request ends comes here exactly once: refused before routing
(`refused`), or routed, whatever became of it (`Proxy.route`'s `finally`).
"""

from __future__ import annotations

import logging
from typing import Final

from llmgw.router.http.answers import Whole
from llmgw.router.metrics import DISCONNECTED, REJECTED
from llmgw.router.request.call import Call
from llmgw.router.request.tenants import Tenant
from llmgw.router.request.tokens import Usage
from llmgw.router.request.usagebound import PROMPT_FLOOR_TOKENS, bounded
from llmgw.router.wiring import Router
from llmgw.runtime.logs import kv

# The access log (RouterConfig.access_log): one line per request when enabled, whatever
# the process's log level (the setting is what turns it on and off).
access_log: Final = logging.getLogger("llmgw.router.access")
access_log.setLevel(logging.INFO)
log: Final = logging.getLogger(__name__)


def count(
    st: Router,
    rid: str,
    path: str,
    t0: float,
    *,
    status: int,
    outcome: str,
    model: str = "",
    eid: str = "",
    ttft: float | None = None,
    usage: Usage | None = None,
    tenant: Tenant | None = None,
) -> None:
    """Count the request once (metrics.OUTCOMES) and write its access-log line (which
    names the key and its team, never the key itself). `model` is the served name,
    "" for a request that reached none; `eid` "" for one no endpoint answered."""
    duration = st.clock.monotonic() - t0
    if outcome == DISCONNECTED:
        # nginx's convention: the client closed the connection before the answer.
        status = 499
    st.metrics.request_done(model, eid, status, duration, ttft_s=ttft, outcome=outcome)
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


def bound_usage(st: Router, call: Call) -> None:
    """The call's usage held to what its request could have used (usagebound.py); what
    was cut off counted in llmgw_router_usage_clipped_tokens_total and logged."""
    usage = call.usage
    if usage is None or (
        usage.prompt <= PROMPT_FLOOR_TOKENS and usage.completion <= call.completion_most
    ):
        return  # the usual answer: two comparisons
    got, cut = bounded(usage, body_bytes=len(call.body), completion_most=call.completion_most)
    if not cut:
        return
    call.usage = got
    model = st.served_name.get(call.model, call.model)
    st.metrics.usage_clipped(model, call.eid, cut)
    log.warning(
        kv(
            "usage clipped",
            request_id=call.rid,
            model=model,
            endpoint=call.eid,
            prompt=usage.prompt,
            completion=usage.completion,
            counted_prompt=got.prompt,
            counted_completion=got.completion,
        )
    )


def count_call(st: Router, call: Call) -> None:
    """Count a routed request (`count`) with what it learned on its way."""
    count(
        st,
        call.rid,
        call.path,
        call.t0,
        status=call.status,
        outcome=call.result,
        model=st.served_name.get(call.model, call.model),
        eid=call.eid,
        ttft=call.ttft,
        usage=call.usage,
        tenant=call.tenant,
    )


def refused(
    st: Router,
    resp: Whole,
    rid: str,
    path: str,
    t0: float,
    *,
    outcome: str = REJECTED,
    tenant: Tenant | None = None,
    anthropic: bool = False,
) -> Whole:
    """The router's own answer before any routing (4xx, or 503 before the first list),
    counted, with the request id on it (`tag`)."""
    count(st, rid, path, t0, status=resp.status, outcome=outcome, tenant=tenant)
    return tag(resp, rid, anthropic=anthropic)


def tag(resp: Whole, rid: str, *, anthropic: bool = False) -> Whole:
    """`resp` with the request's id on it; an `anthropic` answer (Anthropic's shape) has
    it also as `request-id`, where the anthropic package reads it: without it, the
    `request_id` of the package's answers and errors is None, not the access log's id."""
    resp = resp.with_header("x-request-id", rid)
    return resp.with_header("request-id", rid) if anthropic else resp
