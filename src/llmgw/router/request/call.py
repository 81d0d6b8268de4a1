"""One routed request: what it asked for, and what became of it.

`Call` is made once the body is read and the model is known (proxy.py for the
OpenAI routes, apis/passthrough.py for the passed-through ones). The request's
own facts never change after that; what routing learns (the endpoint, the
status, the outcome, the first token's time, the usage) is written into it as
it happens, so the one place that counts the request (accounting.py) reads it
all from here, whichever way the request ended.

Request ids are made here too: every request has one, echoed in the engine's
request and in the answer.
"""

from __future__ import annotations

import os
import random
from typing import Any, Final

from llmgw.router.apis.catalog import Api
from llmgw.router.http.connection import Request
from llmgw.router.metrics import UNAVAILABLE
from llmgw.router.request.tenants import Charge, Tenant
from llmgw.router.request.tokens import Usage
from llmgw.router.request.usagebound import DEFAULT_COMPLETION_TOKENS
from llmgw.router.routing.affinity import NO_KEY, RouteKey
from llmgw.router.upstream.base import HeaderLines

# Request ids the router makes: 96 random bits from a generator seeded once per process
# (reseeded in a forked child), not os.urandom, which is a system call per request.
# Unique, not secret: they name requests in logs and headers.
_ids: Final = random.Random()
os.register_at_fork(after_in_child=_ids.seed)

# The first of the header lines of every request to an engine (`HeaderLines`).
JSON_LINE: Final = b"Content-Type: application/json\r\n"
# A call's engine header lines before `Proxy.route` writes them.
_UNSET_LINES: Final = HeaderLines(b"")


def new_request_id() -> str:
    """A request id of the router's own: 24 hex digits."""
    # to_bytes().hex() costs under half of a format spec.
    return _ids.getrandbits(96).to_bytes(12, "big").hex()


def request_id(given: str | None) -> str:
    """The client's x-request-id when it is one line of printable text (tabs too), else
    a new id: it is echoed in header lines (ours, the engine's), so one line or none of
    it. Bytes that are not UTF-8 (the parser keeps them as surrogates) are no text: the
    trace exporter could not encode such an id, and logged a traceback for each request
    that sent one. Spaces and tabs at its ends are HTTP's optional whitespace, not the
    id's (the parser drops only the leading ones): kept, they went into the engine's
    request, the answer, the access log and the trace, where a search for the id the
    client logged misses it."""
    if given is not None:
        given = given.strip(" \t")
    if not given or not (given.isprintable() or given.replace("\t", " ").isprintable()):
        return new_request_id()
    return given


class Call:
    """One request on its way through routing (see the module docstring).

    Given: `request`, `rid`, `path`, `t0` (the clock's monotonic time it came in),
    `model` (as the client named it), `body` (as the engine gets it), `hashes`
    (its route key, affinity.py), `streams` (it asked for an event stream), `head`
    (the engine's header lines before the request id), `api` (a passed-through
    API's rules, apis/; None for the proxy's own routes), `charge` (a limited key's,
    tenants.py: its headers go on the answer, the engine's usage settles it),
    `tenant` (the request's key, for the access log), `max_tokens` (the request's,
    owed at its endpoint until streamed: scheduler.py; None when it set none),
    `engine_priority` (the `priority` an endpoint with priority scheduling gets,
    enginepriority.py; None: the body as sent), `completion_most` (the most
    completion tokens its answer may count, usagebound.py).

    Learned: `eid` (the endpoint answering; "" before one is chosen), `status`
    (the client's; 503 until something else is known), `result` (the outcome for
    metrics and the access log, metrics.OUTCOMES), `ttft` (seconds to the first
    token of a stream; None: no stream, or no token), `usage` (the engine's token
    counts; None: unknown), `span` (tracing's, None when tracing is off) and the
    header lines made once per request (`rid_line`, `fwd`).
    """

    __slots__ = (
        "api",
        "body",
        "charge",
        "completion_most",
        "eid",
        "engine_priority",
        "fwd",
        "hashes",
        "head",
        "max_tokens",
        "model",
        "path",
        "queued",
        "request",
        "result",
        "rid",
        "rid_line",
        "span",
        "status",
        "streams",
        "t0",
        "tenant",
        "ttft",
        "usage",
    )

    def __init__(
        self,
        request: Request,
        *,
        rid: str,
        path: str,
        t0: float,
        model: str,
        body: bytes,
        hashes: RouteKey = NO_KEY,
        streams: bool = False,
        head: bytes = JSON_LINE,
        api: Api | None = None,
        charge: Charge | None = None,
        tenant: Tenant | None = None,
        max_tokens: int | None = None,
        engine_priority: int | None = None,
        completion_most: int = DEFAULT_COMPLETION_TOKENS,
    ) -> None:
        self.request = request
        self.rid = rid
        self.path = path
        self.t0 = t0
        self.model = model
        self.body = body
        self.hashes = hashes
        self.streams = streams
        self.head = head
        self.api = api
        self.charge = charge
        self.tenant = tenant
        self.max_tokens = max_tokens
        self.engine_priority = engine_priority
        self.completion_most = completion_most
        self.eid = ""
        self.status = 503
        self.result = UNAVAILABLE
        self.ttft: float | None = None
        self.usage: Usage | None = None
        self.span: Any = None
        # Flow control was asked (once, before the first attempt: proxy.py).
        self.queued = False
        # The request id as a header line: in the engine's request and our answer's.
        self.rid_line = b"".join(
            (b"x-request-id: ", rid.encode("utf-8", "surrogateescape"), b"\r\n")
        )
        # The engine's header lines: `head`, tracing's, the request id (`Proxy.route`).
        self.fwd = _UNSET_LINES
