"""The event log's bounded delete in SQL (Store.prune_events; the schedule: tick/retention.py).

Events are appended with ascending ids and stamped with the leader's clock, so the
log is oldest-first in id order: each batch is the oldest `limit` ids, a range of the
primary key, and of those it deletes the ones either rule dooms (at before the
cutoff, or id at or below the newest id minus the cap). Every statement is a walk of
at most `limit` index entries, or one lookup: a batch costs the same on a log of a
thousand events or of millions, and needs no index beyond the key (neither a scan
nor a sort by `at`, which would grow with the log).

The highest id deleted is kept in `meta` (no schema change), so a lookup of an event
that aged out can say so even once the log is empty (Store.events_pruned_through).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from llmgw.controller.store import tables

# The meta row holding the highest event id the retention deleted.
PRUNED_THROUGH = "events_pruned_through"


def batch_statements(
    conn: sa.Connection, *, before: float | None, keep: int | None, limit: int
) -> list[sa.Executable]:
    """The two statements of one batch, bounded by the ids read here (two key lookups):
    the highest id it deletes, then the delete. Empty when nothing can be deleted."""
    e = tables.events
    newest = conn.execute(sa.select(sa.func.max(e.c.id))).scalar()
    if newest is None or limit <= 0:
        return []
    doomed = []
    if keep is not None:
        doomed.append(e.c.id <= int(newest) - keep)
    if before is not None:
        doomed.append(e.c.at < before)
    if not doomed:
        return []
    # The id of the batch's last row: the `limit`-th oldest (the newest when fewer).
    top = conn.execute(sa.select(e.c.id).order_by(e.c.id).offset(limit - 1).limit(1)).scalar()
    where = sa.and_(e.c.id <= (newest if top is None else top), sa.or_(*doomed))
    return [sa.select(sa.func.max(e.c.id)).where(where), sa.delete(e).where(where)]


def prune(conn: sa.Connection, *, before: float | None, keep: int | None, limit: int) -> int:
    """Delete one batch (module docstring) in the caller's transaction; the rows deleted."""
    statements = batch_statements(conn, before=before, keep=keep, limit=limit)
    if not statements:
        return 0
    highest, delete = statements
    last = conn.execute(highest).scalar()
    if last is None:
        return 0
    deleted = int(conn.execute(delete).rowcount)
    _set_pruned_through(conn, int(last))
    return deleted


def pruned_through(conn: sa.Connection) -> int:
    """The highest event id a prune deleted; 0 when none has."""
    m = tables.meta
    value = conn.execute(sa.select(m.c.value).where(m.c.key == PRUNED_THROUGH)).scalar()
    return 0 if value is None else int(value)


def _set_pruned_through(conn: sa.Connection, last: int) -> None:
    m = tables.meta
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    stmt = insert(m).values(key=PRUNED_THROUGH, value=str(last))
    # A batch judged by age may leave an id below `last` (a leader's clock ahead);
    # the mark only ever rises.
    old = pruned_through(conn)
    if last > old:
        conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": str(last)}))
