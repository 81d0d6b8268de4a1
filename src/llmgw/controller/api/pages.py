"""Lists answered in pages (`GET /admin/keys`, `GET /admin/models`; docs/controller.md,
"Pages"): the query in, the page's names, and the header that says another follows.

A page is the first `limit` names after the cursor `after`, in name order. The
cursor is a position, not a row: it need not name anything (a key revoked since the
page before still starts the next page after it), so a walk that changes nothing
sees every row once; a row created behind the cursor comes in the next walk, one
created ahead of it in this one, and none twice. Nothing is held between pages: the
controller keeps no state per walk, so an abandoned walk costs nothing.

The body stays the plain list it was before pages: a client from before them reads
the first page as it read the whole list, and a `Link` rel="next" header says there
is more (RFC 8288; the only place a list can say it, and what such a client ignores).
"""

from __future__ import annotations

import re
import urllib.parse
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import NamedTuple

from aiohttp import web

from llmgw.controller.api.decode import query, query_int
from llmgw.controller.errors import InvalidRequest
from llmgw.wire.admin import DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT
from llmgw.wire.names import END, LABEL_PATTERN, LABEL_RULE, STORED_MODEL_NAME_PATTERN


class Cursor(NamedTuple):
    """What a request asks of a paged list: the names after `after` (None: from the
    first), at most `limit` of them."""

    after: str | None
    limit: int


class NameSet(NamedTuple):
    """The names a paged list holds: a cursor outside the set is no page's last name."""

    what: str
    pattern: re.Pattern[str]
    rule: str


# A name stored before the name patterns refused a final line end (POST took "alice\n")
# may be the last of a page, and its name the cursor: refused, the walk ended at it.
_STORED_LINE_END = r"\n?" + END
KEY_NAMES = NameSet(
    "key name",
    re.compile(LABEL_PATTERN.removesuffix(END) + _STORED_LINE_END),
    LABEL_RULE,
)
# The set stored models are read with (wire.names), wider than what apply takes now: a
# model stored under an older rule may be the last of a page, and its name the cursor.
MODEL_NAMES = NameSet(
    "model name",
    re.compile(STORED_MODEL_NAME_PATTERN.removesuffix("$") + _STORED_LINE_END),
    "1 to 128 characters, starting with a letter or digit, then letters, digits and . _ : / -",
)


def cursor(request: web.Request, names: NameSet) -> Cursor:
    """The request's `after` and `limit`; 400 naming the parameter when either is bad."""
    limit = query_int(request, "limit", DEFAULT_PAGE_LIMIT, 1, MAX_PAGE_LIMIT)
    after = query(request, "after")
    if after is not None and not names.pattern.search(after):
        raise InvalidRequest(
            f"query parameter after must be a {names.what}, the last of the page before "
            f"({names.rule}); got {after[:64]!r}",
            param="after",
        )
    return Cursor(after, DEFAULT_PAGE_LIMIT if limit is None else limit)


def page(
    ordered: Sequence[str], at: Cursor, keep: Callable[[str], bool] | None = None
) -> tuple[list[str], bool]:
    """The names of the page `at` asks for, of `ordered` (sorted) that `keep` keeps; and
    whether a kept name follows it (another page)."""
    out: list[str] = []
    start = 0 if at.after is None else bisect_right(ordered, at.after)
    for i in range(start, len(ordered)):
        name = ordered[i]
        if keep is not None and not keep(name):
            continue
        if len(out) == at.limit:
            return out, True
        out.append(name)
    return out, False


def next_link(
    request: web.Request, shown: Sequence[str], at: Cursor, *, more: bool
) -> dict[str, str]:
    """The answer's headers: when `more`, a Link to the page after the last name shown."""
    if not (more and shown):
        return {}
    target = urllib.parse.urlencode({"after": shown[-1], "limit": at.limit})
    return {"Link": f'<{request.path}?{target}>; rel="next"'}
