"""The router's one way in for a request body: bounded, timed, decoded once (docs/hardening.md).

`read_json` turns whatever a client sends into either the body and its JSON
object, or an OpenAI-shaped refusal, logged in one line:

- larger than `max_body_bytes` (declared or as read; `max_upload_bytes` on the
  multipart upload routes) → 413;
- no room under `max_inflight_body_bytes` (every client's body bytes in, or held
  by their requests), or under its client address's share of it (`client_share`)
  → 503 with Retry-After: before a byte of it is read when its declared length
  cannot fit, else as the bytes that do not fit arrive. Bytes count as they
  arrive, never as declared: a slow upload declaring megabytes holds none;
- not complete within `body_timeout_s`, or slower than `min_body_bytes_per_s`
  once it has been arriving for `header_timeout_s` (a client trickling it) → 408;
- broken framing (a bad chunked encoding, a short body) → 400;
- a Content-Type given that is not JSON's (text/plain, a form) → 415, unread;
- not JSON, not UTF-8, nested deeper than the decoder goes (msgspec raises
  RecursionError), or not an object → 400.

The bytes a body holds stay counted until its request ends (`Intake.release`):
they are forwarded, and kept for a retry on another replica.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

import msgspec

from llmgw.router.config import RouterConfig
from llmgw.router.http.answers import Whole
from llmgw.router.http.connection import BodyBroken, BodyTooLarge, Request
from llmgw.router.request.refusals import bad_request, error_response, retry_after, too_large
from llmgw.runtime.logs import kv
from llmgw.runtime.peers import Peer

log: Final = logging.getLogger(__name__)

_decode: Final = msgspec.json.Decoder().decode


class ByteBudget:
    """Request-body bytes in flight, all clients together and per client address.

    Counted as they arrive, never as a client declares them: a declared length
    costs nothing until its bytes come, so slow uploads that declare megabytes and
    send a byte hold no budget. `take` refuses past `limit`, or past `each` for one
    address (its `Peer`; None: a request with no known address, held to `limit` only).
    """

    __slots__ = ("each", "limit", "used")

    def __init__(self, limit: int, *, each: int | None = None) -> None:
        self.limit = limit
        self.each = limit if each is None else each
        self.used = 0

    def fits(self, n: int, peer: Peer | None) -> bool:
        """Whether `n` more bytes would be taken now (nothing is taken)."""
        if self.used + n > self.limit:
            return False
        return peer is None or peer.body_bytes + n <= self.each

    def take(self, n: int, peer: Peer | None) -> bool:
        if self.used + n > self.limit:
            return False
        if peer is not None:
            if peer.body_bytes + n > self.each:
                return False
            peer.body_bytes += n
        self.used += n
        return True

    def give(self, n: int, peer: Peer | None) -> None:
        self.used -= n
        if peer is not None:
            peer.body_bytes -= n


class Intake:
    """A read and decoded body; `release()` (once, in a finally) returns its bytes to the budget."""

    __slots__ = ("_budget", "_held", "_peer", "body", "doc")

    def __init__(
        self,
        body: bytes,
        doc: dict[str, Any],
        budget: ByteBudget,
        held: int,
        peer: Peer | None,
    ) -> None:
        self.body = body
        self.doc = doc
        self._budget = budget
        self._held = held
        self._peer = peer

    def release(self) -> None:
        self._budget.give(self._held, self._peer)
        self._held = 0


def peer_of(request: Request) -> Peer | None:
    """The client address's tally the request is charged to (runtime/peers.py)."""
    return request.peer


def refused(resp: Whole, rid: str, why: str, request: Request) -> Whole:
    """The one log line of a refused request, and its answer tagged with the request id."""
    log.warning(
        kv(
            "refused request",
            status=resp.status,
            rid=rid,
            peer=request.remote,
            path=request.path,
            why=why,
        )
    )
    return resp.with_header("x-request-id", rid)


def _closing(resp: Whole) -> Whole:
    # The body was not read: reading it off to reuse the connection would be
    # exactly the work (and memory) being refused.
    resp.close = True
    return resp


def _busy(budget: ByteBudget, peer: Peer | None) -> Whole:
    if budget.used < budget.limit and peer is not None and peer.body_bytes >= budget.each // 2:
        msg = "This client address has too many request bodies in flight; retry shortly."
    else:
        msg = "The router is reading too many request bodies at once; retry shortly."
    return error_response(
        503, msg, type="service_unavailable", code="server_busy", headers=retry_after(1)
    )


def _slow(cfg: RouterConfig, why: str) -> Whole:
    return error_response(408, why, type="invalid_request_error", code="request_timeout")


async def read_json(
    request: Request, cfg: RouterConfig, budget: ByteBudget, rid: str, *, decode: bool = True
) -> Intake | Whole:
    """The body and its JSON object, or the refusal to send (already logged).

    `decode` False: the body only (a multipart upload, forms.py), with an empty `doc`.
    """
    if decode and not _json_type(request.headers.get("Content-Type")):
        resp = error_response(
            415,
            "The request body must be JSON: send Content-Type: application/json.",
            type="invalid_request_error",
            code="unsupported_media_type",
        )
        return refused(_closing(resp), rid, "content type not json", request)
    body = await _charged_body(request, cfg, budget, rid)
    if isinstance(body, Whole):
        return body
    peer = request.peer
    # From here the body's bytes are charged to the budget: the Intake gives them
    # back, or, refused or failing, this does.
    kept = False
    try:
        doc: dict[str, Any] | Whole = {}
        if decode:
            doc = _object_of(body, rid, request)
        if isinstance(doc, Whole):
            return doc
        kept = True
        return Intake(body, doc, budget, len(body), peer)
    finally:
        if not kept:
            budget.give(len(body), peer)


async def _charged_body(
    request: Request, cfg: RouterConfig, budget: ByteBudget, rid: str
) -> bytes | Whole:
    """The whole body, its bytes charged to the budget, or the refusal (logged)."""
    # The server's, not the file's: a reload may have changed the file's, which
    # takes effect only on a restart.
    limit = request.max_body_bytes
    declared = request.content_length
    if declared is not None and declared > limit and declared > request.body_limit():
        resp = too_large(request.body_limit())
        return refused(_closing(resp), rid, f"declared {declared} bytes", request)
    peer = request.peer
    try:
        if request.complete:
            # Already in with its head (most bodies): nothing to wait for, no timer.
            body = await request.read()
            if not budget.take(len(body), peer):
                return refused(_busy(budget, peer), rid, "body bytes in flight", request)
            return body
        if declared is not None and not budget.fits(declared, peer):
            # Refused before a byte is read: it could not be taken whole.
            why = f"{budget.used} body bytes in flight"
            return refused(_closing(_busy(budget, peer)), rid, why, request)
        # Charged as it arrives (_read_counted): what it returns stays charged.
        got = await _read_counted(request, cfg, budget, peer)
    except TimeoutError:
        resp = _slow(cfg, f"The request body did not arrive within {cfg.body_timeout_s:g}s.")
        return refused(_closing(resp), rid, "body too slow", request)
    except BodyTooLarge:
        resp = too_large(request.body_limit())
        return refused(_closing(resp), rid, "body too large", request)
    except BodyBroken as exc:
        resp = bad_request(f"The request body is malformed: {exc}.")
        return refused(_closing(resp), rid, "bad body framing", request)
    if isinstance(got, Whole):
        why = "body bytes in flight" if got.status == 503 else "body too slow"
        return refused(_closing(got), rid, why, request)
    return got


def _json_type(content_type: str | None) -> bool:
    """Whether a body sent with `content_type` may be read as JSON: none given (as
    FastAPI, which vLLM uses, reads it), or a JSON media type (`application/json`,
    `*/*+json`). Not `text/plain`, a form or multipart: a web page can have any
    browser POST those to a router without a key, no preflight asked (a JSON type
    needs one), and burn its engines on requests it never sees answered."""
    if content_type is None or content_type == "application/json":
        return True  # what nearly every client sends: no parsing
    media = content_type.partition(";")[0].strip().lower()
    sub = media.partition("/")[2]
    return sub == "json" or sub.endswith("+json")


def _object_of(body: bytes, rid: str, request: Request) -> dict[str, Any] | Whole:
    """The body's JSON object, or the refusal (logged): not JSON, too deep, not an object."""
    try:
        doc = _decode(body)
    except msgspec.DecodeError as exc:
        resp = bad_request("We could not parse the JSON body of your request.")
        return refused(resp, rid, f"not json: {exc}", request)
    except RecursionError:
        resp = bad_request("The JSON body of your request is nested too deeply.")
        return refused(resp, rid, "json nested too deeply", request)
    if type(doc) is not dict:
        resp = bad_request("The request body must be a JSON object.")
        return refused(resp, rid, "json not an object", request)
    return doc


async def _read_counted(
    request: Request, cfg: RouterConfig, budget: ByteBudget, peer: Peer | None
) -> bytes | Whole:
    """A body still arriving, charged to the budget as its bytes come, bounded by
    `body_timeout_s` and, once it has been arriving for `header_timeout_s`, by
    `min_body_bytes_per_s`. What it returns stays charged (`len` of it: the caller
    gives it back); on any other exit the charge is given back here.

    TimeoutError past `body_timeout_s`; `BodyTooLarge` and `BodyBroken` as `read()`
    raises them; a refusal (503, 408) as its answer.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + cfg.body_timeout_s
    rate = cfg.min_body_bytes_per_s
    grace = request.header_timeout_s
    taken = 0
    done = False
    try:
        while not request.ended():
            size = request.size
            if size > taken:
                if not budget.take(size - taken, peer):
                    return _busy(budget, peer)
                taken = size
            now = loop.time()
            if now >= deadline:
                raise TimeoutError
            spent = now - start
            if rate and spent >= grace and size < rate * spent:
                return _slow(cfg, _too_slow(size, spent, rate))
            await request.wait_more(timeout_s=min(deadline - now, 1.0))
        body = await request.read()
        if len(body) > taken:
            # What came with its last bytes, after the last look.
            if not budget.take(len(body) - taken, peer):
                return _busy(budget, peer)
            taken = len(body)
        done = True
        return body
    finally:
        if not done:
            budget.give(taken, peer)


def _too_slow(size: int, spent: float, rate: int) -> str:
    return (
        f"The request body is arriving too slowly ({size} bytes in {spent:.0f}s; "
        f"at least {rate} bytes a second are needed)."
    )
