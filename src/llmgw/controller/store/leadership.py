"""Which controller writes: a lock the operating system or the database
holds for us, released when its holder dies. No home-made consensus, no lease
timestamps to tune: a SIGKILLed leader's lock goes with its process or session.

  FileLockLeadership      SQLite: flock on "<db>.lock"; one controller per file
  AdvisoryLockLeadership  PostgreSQL: pg_try_advisory_lock on a connection held open
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from pathlib import Path

import psycopg
import sqlalchemy as sa

from llmgw.controller.store.base import NotLeader, StoreError
from llmgw.controller.store.postgres import (
    APPLICATION_NAME,
    bound_silence,
    libpq_url,
    lock_key,
    schema_name,
)


class FileLockLeadership:
    """SQLite leadership: an exclusive flock on `<db>.lock`, dropped with its process.

    flock locks belong to an open file, so two instances in one process exclude
    each other as two processes do. The file is never deleted: unlinking a
    lock file someone may be about to lock lets two holders lock two files.
    """

    def __init__(self, db_path: Path) -> None:
        self.path = Path(f"{db_path}.lock")
        self._mu = threading.Lock()
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        with self._mu:
            if self._fd is not None:
                return self._held()
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise StoreError(f"cannot open lock file {self.path}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except OSError as exc:
                os.close(fd)
                raise StoreError(f"cannot lock {self.path}: {exc}") from exc
            # Who holds it, for the refusal message a second controller prints.
            os.ftruncate(fd, 0)
            os.write(
                fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.ctime()}\n".encode()
            )
            self._fd = fd
            return True

    def still_leader(self) -> bool:
        with self._mu:
            return self._fd is not None and self._held()

    def release(self) -> None:
        with self._mu:
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
            os.ftruncate(fd, 0)
            os.close(fd)  # closing drops the flock

    def holder(self) -> str | None:
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return f"{text} (lock {self.path}; SQLite allows one controller)" if text else None

    def _held(self) -> bool:
        # Someone removed or replaced the lock file: a newcomer can lock the new
        # file, so ours no longer excludes anybody.
        assert self._fd is not None
        try:
            return os.fstat(self._fd).st_ino == os.stat(self.path).st_ino
        except OSError:
            return False


class AdvisoryLockLeadership:
    """PostgreSQL leadership: a session advisory lock keyed by the schema.

    The lock lives as long as the dedicated connection that took it; if the
    leader dies or its connection drops, the server releases it and a standby's
    next `try_acquire` wins. TCP keepalives and a user timeout make a silently
    dead network count as a dropped connection within seconds, not hours: on our
    side (libpq's settings) and on the server's (`bound_silence`), for only the
    server's ending the session frees the lock for a standby.
    """

    def __init__(self, url: str, *, schema: str | None = None, timeout_s: float = 5.0) -> None:
        self._url = libpq_url(url)
        self._schema = schema_name(url, schema)
        self._timeout_s = timeout_s
        self._mu = threading.Lock()
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._key: int | None = None
        self._fence: int | None = None
        # Backend pid of the connection holding the lock while we lead.
        self._pid: int | None = None

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        kwargs: dict[str, object] = {
            "autocommit": True,
            "application_name": f"{APPLICATION_NAME} leader",
            "connect_timeout": max(1, round(self._timeout_s)),
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 3,
            "tcp_user_timeout": round(self._timeout_s * 1000),
        }
        if self._schema is not None:
            kwargs["options"] = f"-csearch_path={self._schema}"
        try:
            conn = psycopg.connect(self._url, **kwargs)  # type: ignore[arg-type]
        except psycopg.Error as exc:
            raise StoreError(f"cannot reach PostgreSQL for leadership: {exc}") from exc
        try:
            bound_silence(conn)
        except psycopg.Error as exc:
            conn.close()
            raise StoreError(f"cannot set the leadership session's keepalives: {exc}") from exc
        return conn

    def _lock_key(self, conn: psycopg.Connection[tuple[object, ...]]) -> int:
        if self._key is None:
            schema = self._schema
            if schema is None:
                row = conn.execute("SELECT current_schema()").fetchone()
                schema = str(row[0]) if row and row[0] else "public"
            self._key = lock_key("leader", schema)
            self._fence = lock_key("fence", schema)
        return self._key

    def try_acquire(self) -> bool:
        """Raises StoreError when the database cannot be reached."""
        with self._mu:
            if self._conn is not None and self._alive():
                return True
            conn = self._connect()
            try:
                row = conn.execute(
                    "SELECT pg_try_advisory_lock(%s)", (self._lock_key(conn),)
                ).fetchone()
            except psycopg.Error as exc:
                conn.close()
                raise StoreError(f"leadership query failed: {exc}") from exc
            if row is not None and row[0] is True:
                try:
                    # Wait out the old leader's writes already past their guard
                    # (each holds the fence shared until it commits): whatever
                    # it managed to write is then in the store we load next.
                    fence = self._fence
                    conn.execute("SELECT pg_advisory_lock(%s)", (fence,))
                    conn.execute("SELECT pg_advisory_unlock(%s)", (fence,))
                except psycopg.Error as exc:
                    conn.close()
                    raise StoreError(f"leadership fence failed: {exc}") from exc
                self._conn = conn
                self._pid = conn.info.backend_pid
                return True
            conn.close()
            return False

    def still_leader(self) -> bool:
        with self._mu:
            return self._conn is not None and self._alive()

    def write_guard(self, conn: sa.Connection) -> None:
        """First statement of every write transaction (SqlStore.write_guard).

        Refuses (NotLeader, rolling the write back) unless the lock is still held
        by our session, and holds the fence shared until the transaction ends, so
        a successor that took the lock in between waits for this write before
        loading the store. FencedStore's check alone leaves a gap between the
        check and the commit.
        """
        pid, key, fence = self._pid, self._key, self._fence
        if pid is None or key is None or fence is None:
            raise NotLeader("this controller does not hold leadership; the write was refused")
        conn.execute(sa.text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": fence})
        unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
        held = conn.execute(
            sa.text(
                "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND objsubid = 1 AND classid::bigint = :hi AND objid::bigint = :lo"
                " AND pid = :pid"
            ),
            {"hi": unsigned >> 32, "lo": unsigned & 0xFFFF_FFFF, "pid": pid},
        ).first()
        if held is None:
            raise NotLeader("leadership passed to another controller; the write was refused")

    def release(self) -> None:
        with self._mu:
            self._pid = None
            conn, self._conn = self._conn, None
            if conn is not None:
                # Closing the session releases the lock; no unlock round trip to fail.
                conn.close()

    def holder(self) -> str | None:
        """The leader's backend as pg_stat_activity shows it (address, pid, since)."""
        try:
            with self._connect() as conn:
                key = self._lock_key(conn) & 0xFFFF_FFFF_FFFF_FFFF
                row = conn.execute(
                    "SELECT a.pid, a.client_addr, a.application_name, a.backend_start"
                    " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
                    " AND l.classid::bigint = %s AND l.objid::bigint = %s",
                    (key >> 32, key & 0xFFFF_FFFF),
                ).fetchone()
        except (StoreError, psycopg.Error):
            return None
        if row is None:
            return None
        pid, addr, app, since = row
        return f"{app} at {addr or 'local socket'} (backend pid {pid}, since {since})"

    def _alive(self) -> bool:
        # The session lock lives exactly as long as this connection: if a query
        # still runs on it, we still hold the lock.
        assert self._conn is not None
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error:
            conn, self._conn = self._conn, None
            self._pid = None
            conn.close()
            return False
        return True
