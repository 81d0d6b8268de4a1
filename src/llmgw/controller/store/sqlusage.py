"""Token usage in SQL: the upsert that keeps the largest figures, the grouped sums,
and the bounded delete of hours past the retention (the rules: usage.py)."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from llmgw.controller.store import tables
from llmgw.controller.store.usage import FIELDS, GROUPS, Figures, RowKey, merge, usage_row
from llmgw.wire.usage import TokenUsage, UsageBy, UsageRow


def record(conn: sa.Connection, router_id: str, rows: Sequence[TokenUsage]) -> None:
    """Upsert `rows` of `router_id`, keeping the largest of each figure (one statement)."""
    merged: dict[RowKey, Figures] = {}
    # One report may name a row twice; a multi-row upsert may not touch a row twice.
    merge(merged, router_id, rows)
    if not merged:
        return
    t = tables.token_usage
    postgres = conn.dialect.name == "postgresql"
    stmt = (postgresql.insert if postgres else sqlite.insert)(t)
    # SQLite's max() of two arguments is the larger one; PostgreSQL spells it greatest().
    larger = sa.func.greatest if postgres else sa.func.max
    stmt = stmt.on_conflict_do_update(
        index_elements=[c.name for c in t.primary_key],
        set_={f: larger(t.c[f], stmt.excluded[f]) for f in FIELDS},
    )
    # Sorted: two controllers upserting overlapping rows lock them in one order.
    values = [
        {
            "hour": k[0],
            "key": k[1],
            "team": k[2],
            "model": k[3],
            "router_id": k[4],
            "requests": f[0],
            "prompt_tokens": f[1],
            "completion_tokens": f[2],
        }
        for k, f in sorted(merged.items())
    ]
    conn.execute(stmt, values)


def query(
    conn: sa.Connection, *, since: int, by: UsageBy, limit: int | None = None
) -> list[UsageRow]:
    """Rows of hours from `since` on, summed over routers per hour and group; with
    `limit`, the newest that many (store.base.Store.usage)."""
    t = tables.token_usage
    group = [t.c[n] for n in GROUPS[by]]
    # SQLite's sum() of integers fails the whole read past 2**63 ("integer overflow");
    # its total() is a float, exact while a sum stays within 2**53 (where usage_row
    # caps it). PostgreSQL sums BIGINT into NUMERIC, which never overflows.
    add = sa.func.sum if conn.dialect.name == "postgresql" else sa.func.total
    q = (
        sa.select(t.c.hour, *group, *(add(t.c[f]).label(f) for f in FIELDS))
        .where(t.c.hour >= since)
        .group_by(t.c.hour, *group)
        .order_by(t.c.hour, *group)
    )
    if limit is not None:
        # The newest groups are picked in SQL, so only `limit` rows are built in Python
        # and sent, however many hours `since` reaches; then put back in answer order.
        newest = q.order_by(None).order_by(t.c.hour.desc(), *group).limit(limit).subquery()
        q = sa.select(newest).order_by(newest.c.hour, *(newest.c[c.name] for c in group))
    out: list[UsageRow] = []
    for row in conn.execute(q):
        n = len(group)
        # A Decimal (PostgreSQL) or a float (SQLite's total()): back to int.
        req, prompt, completion = (int(v) for v in row[1 + n :])
        out.append(usage_row(by, int(row[0]), tuple(row[1 : 1 + n]), req, prompt, completion))
    return out


# Keys per `key IN (…)`: well under SQLite's bound-parameter limit.
_KEYS_CHUNK = 500


def spent(conn: sa.Connection, *, keys: Sequence[str], since: int, until: int) -> dict[str, int]:
    """Each key's prompt plus completion tokens in [since, until): summed in SQL over a
    range of the primary key (hour first), so a usage report reads one number per
    budgeted key rather than every key's row of every hour of the period."""
    t = tables.token_usage
    # total(): a float that cannot overflow, as in `query`; PostgreSQL sums into NUMERIC.
    add = sa.func.sum if conn.dialect.name == "postgresql" else sa.func.total
    out: dict[str, int] = {}
    unique = sorted(set(keys))
    for i in range(0, len(unique), _KEYS_CHUNK):
        q = (
            sa.select(t.c.key, add(t.c.prompt_tokens), add(t.c.completion_tokens))
            .where(t.c.hour >= since, t.c.hour < until, t.c.key.in_(unique[i : i + _KEYS_CHUNK]))
            .group_by(t.c.key)
        )
        for key, prompt, completion in conn.execute(q):
            out[str(key)] = int(prompt) + int(completion)
    return out


def prune(conn: sa.Connection, *, before: int, limit: int) -> int:
    """Delete at most `limit` rows of hours before `before`, oldest first: one statement,
    whatever the dialect, picking its rows through the primary key (hour first, so
    the oldest rows are a range of it) rather than taking every old hour at once."""
    t = tables.token_usage
    pk = [t.c[c.name] for c in t.primary_key]
    oldest = sa.select(*pk).where(t.c.hour < before).order_by(*pk).limit(limit)
    deleted = conn.execute(sa.delete(t).where(sa.tuple_(*pk).in_(oldest)))
    return int(deleted.rowcount)
