"""SQLite: the embedded default (`sqlite:///./.llmgw/controller.db`), one file.

SQLite means one controller: leadership is a file lock beside the database
(leadership.FileLockLeadership), so a second controller on the same file is
refused instead of interleaving writes with the first.

Nothing of the database is memory-mapped: a rollback journal (journal_mode=DELETE),
not WAL, and mmap_size=0. WAL keeps its index in a `-shm` file that every
connection maps; when that file is truncated or its disk fills, the next access
to a mapped page is a SIGBUS and the controller dies with no word. Read and
written through system calls, the same faults are errors: the store raises
StoreError, the API answers 503 and the controller keeps running. The cost is that
a write waits for readers to finish (busy_timeout); within one controller
transactions are short, and writes are one per command or tick.

The files are the controller's alone (they hold the engine keys): the database and
its journal are created mode 0600, and an older database found readable by others is
narrowed to 0600 at open.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from llmgw.controller.store.base import StoreError
from llmgw.controller.store.sql import SqlStore

# How long a writer waits for another connection's write lock before failing.
# Within one controller writes are short; this only matters when a reader and
# the tick's write collide.
BUSY_TIMEOUT_MS = 5_000


def sqlite_path(url: str) -> Path:
    """The database file a `sqlite:///…` URL names (relative paths are from the cwd)."""
    try:
        database = sa.make_url(url).database
    except sa.exc.ArgumentError as exc:
        raise StoreError(f"bad SQLite URL {url!r}: {exc}") from exc
    if not database or database == ":memory:":
        # An in-memory SQLite is one per connection: the pool would hand out
        # empty databases. memory:// is the store for "keep nothing".
        raise StoreError(f"SQLite URL {url!r} must name a file (use memory:// for no file)")
    return Path(database)


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    # Take transaction control from the sqlite3 module, which otherwise issues
    # BEGIN lazily and not before DDL; _on_begin issues our own.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    # busy_timeout first: switching the journal mode takes an exclusive lock, and a
    # second controller opening the same file at that moment would otherwise get
    # "database is locked" at once instead of waiting its turn.
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    # No -shm file and no mapped database pages (module docstring): a file that goes
    # bad under the controller is an error it answers, not a signal that kills it.
    # DELETE also turns a database an older controller left in WAL back.
    cur.execute("PRAGMA mmap_size=0")
    cur.execute("PRAGMA journal_mode=DELETE")
    cur.execute("PRAGMA foreign_keys=ON")
    # FULL: a committed tick survives power loss, not only a process crash; it
    # costs one fsync per transaction, which is one per tick.
    cur.execute("PRAGMA synchronous=FULL")
    cur.close()


def _private(path: Path) -> None:
    """The database file exists and is 0600 before SQLite opens it.

    SQLite creates its files with the process's umask (0644 as a rule) and its journal
    with the database's mode; made here first, the database is never readable by others,
    not even for a moment, and so neither is its journal.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older controller's 0644 file too
    finally:
        os.close(fd)


def _on_begin(conn: sa.Connection) -> None:
    # Writers take the write lock up front. A deferred transaction that reads and
    # then writes can fail with SQLITE_BUSY at once, busy_timeout or not, when
    # another connection wrote in between; IMMEDIATE waits its turn instead.
    if conn.get_execution_options().get("llmgw_write"):
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        conn.exec_driver_sql("BEGIN")


def open_sqlite_store(url: str) -> SqlStore:
    """Open the file a `sqlite:///…` URL names, creating its directory and tables as needed."""
    path = sqlite_path(url)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create directory for {path}: {exc}") from exc
    try:
        _private(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            # The keys are never written where a planted link points.
            raise StoreError(f"{path} is a symbolic link; refusing to follow it") from None
        raise StoreError(f"cannot open {path}: {exc.strerror or exc}") from exc
    engine = sa.create_engine(
        sa.URL.create("sqlite", database=str(path)),
        # The pool hands a connection to one thread at a time; asyncio.to_thread
        # calls come from different worker threads.
        connect_args={"check_same_thread": False},
    )
    sa.event.listen(engine, "connect", _on_connect)
    sa.event.listen(engine, "begin", _on_begin)
    store = SqlStore(engine, describe=f"sqlite {path}", write_options={"llmgw_write": True})
    try:
        _migrate_waiting_for_locks(store)
    except BaseException:
        engine.dispose()
        raise
    return store


def _migrate_waiting_for_locks(store: SqlStore, *, give_up_after_s: float = 10.0) -> None:
    """Migrate at open, waiting out another process that is creating the same file.

    A brand-new file's first opener switches it to WAL and creates the tables;
    SQLite answers a second opener "database is locked" at once during that
    switch (its busy handler is not consulted there), so the wait is ours.
    """
    deadline = time.monotonic() + give_up_after_s
    delay_s = 0.02
    while True:
        try:
            store.migrate()
            return
        except StoreError as exc:
            locked = "database is locked" in str(exc)
            if not locked or time.monotonic() + delay_s > deadline:
                raise
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, 0.5)
