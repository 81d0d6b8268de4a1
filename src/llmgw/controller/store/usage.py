"""Token usage in the store: what routers counted, kept per hour (docs/tenants.md#usage).

Each row holds one router process's running totals for one hour, key, team and
model, exactly as its reports carry them (wire.usage.TokenUsage). Recording keeps
the largest of each figure, so recording is idempotent and order-free: a report
retried after its answer was lost, or one that arrives after a newer one, changes
nothing. Totals over routers are derived when read (summed per hour and group),
never stored: a row written twice cannot be counted twice.

Pure (no SQLAlchemy: the memory store imports it): sqlusage.py is the SQL side,
two statements (an upsert, a grouped select); the memory store does the same with
dicts through `merge` and `totals`, so both answer alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from llmgw.wire.usage import MAX_COUNT, TokenUsage, UsageBy, UsageRow

# (hour, key, team, model, router_id): one row of the table.
RowKey = tuple[int, str, str, str, str]
# (requests, prompt_tokens, completion_tokens).
Figures = tuple[int, int, int]

# The names a group is made of, in the order rows are sorted by.
GROUPS: Mapping[UsageBy, tuple[str, ...]] = {
    "key": ("key", "team"),
    "team": ("team",),
    "model": ("model",),
}
FIELDS = ("requests", "prompt_tokens", "completion_tokens")


def merge(into: dict[RowKey, Figures], router_id: str, rows: Iterable[TokenUsage]) -> None:
    """Fold `rows` of `router_id` into `into`, each figure the largest seen."""
    for r in rows:
        k = (r.hour, r.key, r.team, r.model, router_id)
        new = (r.requests, r.prompt_tokens, r.completion_tokens)
        have = into.get(k)
        if have is not None:
            new = (max(have[0], new[0]), max(have[1], new[1]), max(have[2], new[2]))
        into[k] = new


def totals(rows: Mapping[RowKey, Figures], *, since: int, by: UsageBy) -> list[UsageRow]:
    """Rows of hours from `since` on, summed over routers per hour and group."""
    at = {"key": 1, "team": 2, "model": 3}
    index = [at[n] for n in GROUPS[by]]
    sums: dict[tuple[int, tuple[str, ...]], list[int]] = {}
    for k, figures in rows.items():
        if k[0] < since:
            continue
        group = (k[0], tuple(str(k[i]) for i in index))
        acc = sums.setdefault(group, [0, 0, 0])
        for j, n in enumerate(figures):
            acc[j] += n
    return [
        usage_row(by, hour, group, acc[0], acc[1], acc[2])
        for (hour, group), acc in sorted(sums.items())
    ]


def spent(
    rows: Mapping[RowKey, Figures], *, keys: Sequence[str], since: int, until: int
) -> dict[str, int]:
    """Tokens each of `keys` used in the hours from `since` up to `until` (Store.spent)."""
    wanted = set(keys)
    out: dict[str, int] = {}
    for k, figures in rows.items():
        if k[1] in wanted and since <= k[0] < until:
            out[k[1]] = out.get(k[1], 0) + figures[1] + figures[2]
    return out


def newest(rows: Sequence[UsageRow], limit: int | None) -> list[UsageRow]:
    """The newest `limit` of `rows` (sorted by hour, then name), sorted the same: whole
    hours from the newest back, the oldest of them cut after its first names, as the SQL
    store's `ORDER BY hour DESC, names LIMIT` picks them."""
    if limit is None or len(rows) <= limit:
        return list(rows)
    hours: dict[int, list[UsageRow]] = {}
    for r in rows:
        hours.setdefault(r.hour, []).append(r)
    kept: list[list[UsageRow]] = []
    left = limit
    for hour in sorted(hours, reverse=True):
        kept.append(hours[hour][:left])
        left -= len(kept[-1])
        if left <= 0:
            break
    return [r for block in reversed(kept) for r in block]


def usage_row(
    by: UsageBy, hour: int, group: Sequence[str], requests: int, prompt: int, completion: int
) -> UsageRow:
    """One row of a sum; each figure capped at MAX_COUNT, the bound of a reported one.

    Rows are bounded, their number is not: a router that reports many rows near the
    bound makes a sum that a 64-bit column, a client's integer or a float can no
    longer hold exactly. Capped, every store answers alike and the sum still reads
    as more than any budget (wire.keys.Limit).
    """
    named = dict(zip(GROUPS[by], group, strict=True))
    return UsageRow(
        hour=hour,
        key=named.get("key"),
        team=named.get("team"),
        model=named.get("model"),
        requests=min(requests, MAX_COUNT),
        prompt_tokens=min(prompt, MAX_COUNT),
        completion_tokens=min(completion, MAX_COUNT),
    )
