"""The router's one way in for a request body: bounded, timed, decoded once (docs/hardening.md).

`read_json` turns whatever a client sends into either the body and its JSON
object, or an OpenAI-shaped refusal, logged in one line:

- larger than `max_body_bytes` (declared or as read) → 413;
- no room under `max_inflight_body_bytes` (every client's bodies being read or
  held by their requests) → 503 with Retry-After, before a byte of it is read;
- not complete within `body_timeout_s` (a client trickling it) → 408;
- broken framing (a bad chunked encoding, a short body) → 400;
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
from aiohttp import web

from llmgw.router.config import RouterConfig
from llmgw.router.errors import bad_request, error_response, too_large
from llmgw.runtime.fastserver import FastRequest
from llmgw.runtime.logs import kv

log: Final = logging.getLogger(__name__)

_decode: Final = msgspec.json.Decoder().decode


class ByteBudget:
    """Request-body bytes in flight, all clients together; `take` refuses past `limit`."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


class Intake:
    """A read and decoded body; `release()` (once, in a finally) returns its bytes to the budget."""

    __slots__ = ("_budget", "_held", "body", "doc")

    def __init__(self, body: bytes, doc: dict[str, Any], budget: ByteBudget, held: int) -> None:
        self.body = body
        self.doc = doc
        self._budget = budget
        self._held = held

    def release(self) -> None:
        self._budget.give(self._held)
        self._held = 0


def refused(
    resp: web.Response, rid: str, why: str, request: web.Request | FastRequest
) -> web.Response:
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
    resp.headers["x-request-id"] = rid
    return resp


def _closing(resp: web.Response) -> web.Response:
    # The body was not read: reading it off to reuse the connection would be
    # exactly the work (and memory) being refused.
    resp.force_close()
    return resp


async def read_json(
    request: web.Request | FastRequest,
    cfg: RouterConfig,
    budget: ByteBudget,
    rid: str,
    decode: bool = True,
) -> Intake | web.Response:
    """The body and its JSON object, or the refusal to send (already logged).

    `decode` False: the body only (a multipart upload, forms.py), with an empty `doc`.
    """
    limit = cfg.max_body_bytes
    declared = request.content_length
    if declared is not None and declared > limit:
        return refused(_closing(too_large(limit)), rid, f"declared {declared} bytes", request)
    # Unknown length (chunked): the most it may be, until it is read.
    held = limit if declared is None else declared
    if not budget.take(held):
        resp = error_response(
            503,
            "The router is reading too many request bodies at once; retry shortly.",
            type="service_unavailable",
            code="server_busy",
            headers={"Retry-After": "1"},
        )
        return refused(_closing(resp), rid, f"{budget.used} body bytes in flight", request)
    kept = False
    try:
        try:
            if type(request) is FastRequest and request.complete:
                # Already in with its head (most bodies): nothing to wait for, no timer.
                body = await request.read()
            else:
                async with asyncio.timeout(cfg.body_timeout_s):
                    body = await request.read()
        except TimeoutError:
            resp = error_response(
                408,
                f"The request body did not arrive within {cfg.body_timeout_s:g}s.",
                type="invalid_request_error",
                code="request_timeout",
            )
            return refused(_closing(resp), rid, "body too slow", request)
        except web.HTTPRequestEntityTooLarge:
            return refused(_closing(too_large(limit)), rid, "body too large", request)
        except web.RequestPayloadError as exc:
            resp = bad_request(f"The request body is malformed: {exc}.")
            return refused(_closing(resp), rid, "bad body framing", request)
        if declared is None:
            budget.give(held - len(body))
            held = len(body)
        if not decode:
            kept = True
            return Intake(body, {}, budget, held)
        try:
            doc = _decode(body)
        except msgspec.DecodeError as exc:
            return refused(
                bad_request("We could not parse the JSON body of your request."),
                rid,
                f"not json: {exc}",
                request,
            )
        except RecursionError:
            return refused(
                bad_request("The JSON body of your request is nested too deeply."),
                rid,
                "json nested too deeply",
                request,
            )
        if type(doc) is not dict:
            return refused(
                bad_request("The request body must be a JSON object."),
                rid,
                "json not an object",
                request,
            )
        kept = True
        return Intake(body, doc, budget, held)
    finally:
        if not kept:
            budget.give(held)
