"""Where the controller's state lives: `open_store(url)` and `open_leadership(url)`.

URLs:
  sqlite:///path/to/controller.db   one file, WAL; one controller (a file lock says so)
  postgresql://user@host:port/db    several controllers, one leads (an advisory lock);
                                    `schema=` puts every table in that schema
  memory://                         nothing survives the process (tests, demos)

Everything here blocks: the async controller calls it via `asyncio.to_thread`.
See base.py for the protocols and the exception tree; readrows.py for a stored row
this code cannot read; sqlevents.py and sqlusage.py for the bounded deletes of the
retention (tick/retention.py). Typical leader setup:

    store = open_store(url, schema=schema)          # migrates; SchemaTooNew if too new
    lead = open_leadership(url, schema=schema)
    writes = FencedStore(store, lead)               # apply() raises NotLeader when not leading
    if await asyncio.to_thread(lead.try_acquire): ...  # else serve reads, retry each tick
"""

from __future__ import annotations

import uuid

from llmgw.controller.store.base import (
    Leadership,
    NotLeader,
    SchemaTooNew,
    Store,
    StoreError,
    UnreadableRow,
)
from llmgw.controller.store.fence import FencedStore
from llmgw.controller.store.memory import MemoryLeadership, MemoryStore

__all__ = [
    "FencedStore",
    "Leadership",
    "MemoryLeadership",
    "MemoryStore",
    "NotLeader",
    "SchemaTooNew",
    "Store",
    "StoreError",
    "UnreadableRow",
    "open_leadership",
    "open_store",
]


def open_store(url: str, *, schema: str | None = None) -> Store:
    """Open (creating and migrating as needed) the store at `url`.

    Raises SchemaTooNew when the database was written by a newer llmgw, and
    StoreError when it cannot be reached or the URL is not understood.
    """
    if url.startswith("memory:"):
        return MemoryStore()
    if url.startswith("sqlite:"):
        # Imported here: SQLAlchemy costs ~100 ms to import and the memory store needs none of it.
        from llmgw.controller.store.sqlite import open_sqlite_store

        return open_sqlite_store(url)
    if url.startswith(("postgresql:", "postgresql+", "postgres:")):
        from llmgw.controller.store.postgres import open_postgres_store

        return open_postgres_store(url, schema=schema)
    raise StoreError(
        f"unsupported database URL {url!r}: use sqlite:///…, postgresql://… or memory://"
    )


def open_leadership(url: str, *, schema: str | None = None) -> Leadership:
    """The leadership lock that goes with the store at `url` (acquire it before writing)."""
    if url.startswith("memory:"):
        # "memory://" leads alone; "memory://NAME" shares a lock with others of that NAME.
        name = url.removeprefix("memory:").strip("/")
        return MemoryLeadership(name) if name else MemoryLeadership(f"solo-{uuid.uuid4()}")
    if url.startswith("sqlite:"):
        from llmgw.controller.store.leadership import FileLockLeadership
        from llmgw.controller.store.sqlite import sqlite_path

        return FileLockLeadership(sqlite_path(url))
    if url.startswith(("postgresql:", "postgresql+", "postgres:")):
        from llmgw.controller.store.leadership import AdvisoryLockLeadership

        return AdvisoryLockLeadership(url, schema=schema)
    raise StoreError(
        f"unsupported database URL {url!r}: use sqlite:///…, postgresql://… or memory://"
    )
