"""HTTP routes of usage: routers' reports in (`POST /v1/usage`), token usage out
(`GET /admin/usage`; docs/tenants.md#usage).

A report's load and idle times go to the IdleTracker (a reading of now, kept in
memory); its token rows go to the store before the answer, so a 200 means they
are kept, and a 503 (the database refused) tells the router to send them again,
which it does: it keeps every row until a report holding it was answered 2xx.
The 200 carries the router's shares of every limited key (leasebook.py), from
the demand the report brought.

A standby relays the report to the leader and answers with the leader's answer,
so the leader's leases and idle times count every router (leaderlink.py says
when it does not, and why a failed relay is answered 503 with its rows kept).
Errors leave through routes._errors like every other route's.
"""

from __future__ import annotations

import asyncio
import math
from typing import get_args

from aiohttp import web

from llmgw.controller.api.decode import decode, query, query_int
from llmgw.controller.api.routes import SERVICES, json_response
from llmgw.controller.api.services import Services
from llmgw.controller.api.validate import check_usage
from llmgw.controller.errors import InvalidRequest, NotLeading, StoreUnavailable
from llmgw.controller.leaderlink import RELAYED_HEADER, Relayed
from llmgw.controller.leases import period_end, period_start
from llmgw.controller.store import Store, StoreError
from llmgw.wire.keys import ClientKey
from llmgw.wire.usage import (
    DEFAULT_SINCE_S,
    DEFAULT_USAGE_LIMIT,
    HOUR_S,
    MAX_SINCE_S,
    MAX_USAGE_LIMIT,
    UsageAnswer,
    UsageBy,
    UsageReport,
    UsageRow,
)

BY: tuple[UsageBy, ...] = get_args(UsageBy)


async def report(request: web.Request) -> web.Response:
    # Accepted by a standby too: nothing of the fleet is written, and a standby that
    # takes over then already knows who is idle instead of starting from unknown.
    # Its token rows are written by whichever controller receives them
    # (Store.record_usage is not fenced: idempotent rows, not fleet state).
    s = request.app[SERVICES]
    relayed = RELAYED_HEADER in request.headers
    if relayed and not s.fleet.leading:
        # A stale leader URL led here: the relaying standby keeps the report itself.
        raise NotLeading("a relayed usage report reached a standby; not relayed again")
    body = await request.read()
    got = decode(body, UsageReport, what="usage report")
    check_usage(got)
    s.usage.ingest(got)
    if not s.fleet.leading and not relayed:
        answer = await s.link.relay(body, request.headers.get("Authorization"))
        if isinstance(answer, Relayed):
            return web.Response(
                body=answer.body, status=answer.status, content_type=_json(answer.content_type)
            )
        if answer == "failed":
            await _keep_tokens(s, got)
            raise NotLeading(
                "the leader did not take this relayed report: its token usage is kept "
                "here; shares come when the leader answers"
            )
    await _keep_tokens(s, got)
    keys = [k.key for k in s.fleet.state.keys.values() if k.live]
    spent: dict[str, int] = {}
    if any(k.budget is not None for k in keys):
        try:
            spent = await asyncio.to_thread(budget_spent, s.fleet.store, keys, s.clock.wall())
        except StoreError as exc:
            raise StoreUnavailable(f"cannot read the keys' budget spend: {exc}") from exc
    return json_response(s.leases.report(got.router_id, got.key_demand, keys, spent))


async def _keep_tokens(s: Services, got: UsageReport) -> None:
    if not got.tokens:
        return
    try:
        # Kept per counter (a router process's totals start at zero with it).
        counter = got.counter_id or got.router_id
        await asyncio.to_thread(s.fleet.store.record_usage, counter, got.tokens)
    except StoreError as exc:
        raise StoreUnavailable(f"cannot keep the report's token usage: {exc}") from exc


def _json(content_type: str | None) -> str:
    """The relayed answer's media type without parameters (aiohttp adds the charset)."""
    return (content_type or "application/json").split(";", 1)[0].strip()


def budget_spent(store: Store, keys: list[ClientKey], wall: float) -> dict[str, int]:
    """Key name → tokens used in its budget's current period, over every router.

    Only the period's hours: a router whose clock runs ahead reports hours of a later
    period, which count in that period when it comes, not in this one as well.
    """
    by_span: dict[tuple[int, int], list[str]] = {}
    for k in keys:
        if k.budget is not None:
            start = period_start(k.budget.per, wall)
            by_span.setdefault((start, period_end(k.budget.per, start)), []).append(k.name)
    out: dict[str, int] = {}
    # One sum per period in force (a day, a week, a month): a handful of reads per report.
    for (since, until), names in by_span.items():
        out.update(store.spent(keys=names, since=since, until=until))
    return out


def _since_s(request: web.Request) -> float:
    text = query(request, "since_s")
    if text is None:
        return DEFAULT_SINCE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_SINCE_S):
        raise InvalidRequest(
            f"since_s must be a number of seconds above 0 and at most {MAX_SINCE_S}, got {text!r}",
            param="since_s",
        )
    return value


async def usage(request: web.Request) -> web.Response:
    s = request.app[SERVICES]
    given = query(request, "by")
    by = "key" if given is None else next((b for b in BY if b == given), None)
    if by is None:
        raise InvalidRequest(f"by must be one of {', '.join(BY)}, got {given!r}", param="by")
    # The hour that holds the moment `since_s` ago: hours are counted whole.
    since = max(0, int((s.clock.wall() - _since_s(request)) // HOUR_S) * HOUR_S)
    limit = query_int(request, "limit", None, 1, MAX_USAGE_LIMIT) or DEFAULT_USAGE_LIMIT
    store = s.fleet.store
    try:
        # One row more than answered: it tells a full answer from a cut one.
        rows = await asyncio.to_thread(store.usage, since=since, by=by, limit=limit + 1)
    except StoreError as exc:
        raise StoreUnavailable(f"cannot read usage: {exc}") from exc
    return json_response(whole_hours(by, since, rows, limit))


def whole_hours(by: UsageBy, since: int, rows: list[UsageRow], limit: int) -> UsageAnswer:
    """The answer of the newest `limit + 1` rows: all of them when they fit; else the
    whole hours that fit, the oldest dropped (it may miss names), `since` moved to the
    first kept. An answer never holds part of an hour unless one hour alone is over."""
    if len(rows) <= limit:
        return UsageAnswer(by=by, since=since, rows=rows)
    whole = [r for r in rows if r.hour > rows[0].hour]
    kept = whole or rows[:limit]
    return UsageAnswer(by=by, since=kept[0].hour, rows=kept, truncated=True)


def routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/usage", report),
        web.get("/admin/usage", usage),
    ]
