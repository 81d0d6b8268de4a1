"""How one limit is split among routers: max-min fair by demand, with a floor (pure).

Each router gets a floor (`floor_frac` of the limit, split evenly) so that one
that saw no demand lately can still serve the first requests that reach it; the
rest goes max-min fair by what each router was asked for: a router that wants
less than an even split gets what it wants, and what it leaves is split among
the others the same way. What nobody wants is split evenly, so a burst on any
router finds room. The shares sum to the limit, never more (docs/tenants.md).
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Mapping

from llmgw.wire.keys import BudgetPeriod

# Part of each limit split evenly whatever the demand: the floor of all routers together.
FLOOR_FRACTION = 0.1


def fair_shares(
    limit: float, wants: Mapping[str, float], *, floor_frac: float = FLOOR_FRACTION
) -> dict[str, float]:
    """Router → share of `limit`, by each router's demand (per minute); sorted by router.

    Shares sum to `limit` (to rounding, and never above it); no routers, no shares.
    A negative or zero limit leaves every share at zero.
    """
    n = len(wants)
    if n == 0:
        return {}
    if limit <= 0.0:
        return dict.fromkeys(sorted(wants), 0.0)
    floor = limit * floor_frac / n
    out = dict.fromkeys(sorted(wants), floor)
    left = limit - floor * n
    # Demand above the floor, smallest first: each either is met in full or, from
    # the first that cannot be, all the rest get an equal part of what is left.
    above = sorted((max(0.0, w - floor), r) for r, w in wants.items())
    for i, (want, r) in enumerate(above):
        fair = left / (len(above) - i)
        if want <= fair:
            out[r] += want
            left -= want
            continue
        for _, rest in above[i:]:
            out[rest] += fair
        left = 0.0
        break
    if left > 0.0:
        for r in out:
            out[r] += left / n
    # Float rounding only: shave the shares until their sum is not above the limit
    # (a sum of rounded parts may land a unit in the last place over it).
    total = sum(out.values())
    while total > limit:
        scale = limit / total * (1.0 - 1e-12)
        out = {r: s * scale for r, s in out.items()}
        total = sum(out.values())
    return out


def period_start(per: BudgetPeriod, wall: float) -> int:
    """Unix seconds at the start of the calendar period (UTC) `wall` falls in: the
    day, the week (from Monday) or the month, as routers count budgets."""
    t = time.gmtime(wall)
    day = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
    if per == "day":
        return day
    if per == "week":
        return day - t.tm_wday * 86_400
    return calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))


def period_end(per: BudgetPeriod, start: int) -> int:
    """Unix seconds at the start of the period after the one that starts at `start`."""
    if per == "day":
        return start + 86_400
    if per == "week":
        return start + 7 * 86_400
    # Any moment 32 days into a month is in the next one.
    return period_start(per, start + 32 * 86_400)
