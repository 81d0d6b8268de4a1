"""The controller's SQLite files on a bad day (issue 34, items 9 and 10): created 0600 (they
hold the engine keys), nothing memory-mapped (a truncated -shm file used to kill it with
SIGBUS), and a database that goes bad under it answered with 503 while it keeps running.
Real controller processes on 127.0.0.1."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from llmgw.testing.procs import llmgw_argv
from tests.integration.controller_harness import Db, controller, spec
from tests.integration.hostile import no_traceback

pytestmark = pytest.mark.timeout(60)

TOKEN = "store-token"


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


class TestFiles:
    """The SQLite files are private and never followed through a symlink."""

    def test_private_and_unmapped(self, tmp_path: Path) -> None:
        """A new database is one 0600 file; no -wal or -shm file exists to be truncated."""
        db = tmp_path / "data" / "c.db"
        with controller(Db(f"sqlite:///{db}"), token=TOKEN, log_dir=tmp_path) as c:
            c.post("/admin/models", spec("m"))
            assert mode(db) == 0o600
            assert sorted(p.name for p in db.parent.iterdir()) == ["c.db", "c.db.lock"]

    def test_an_old_readable_wal_database_is_narrowed(self, tmp_path: Path) -> None:
        """A database an older controller left 0644 in WAL mode is 0600 and out of WAL once
        opened; what it held is still there."""
        db = tmp_path / "c.db"
        url = f"sqlite:///{db}"
        with controller(Db(url), token=TOKEN, log_dir=tmp_path) as c:
            c.post("/admin/models", spec("kept"))
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.close()
        os.chmod(db, 0o644)
        with controller(Db(url), token=TOKEN, log_dir=tmp_path) as c:
            assert [m["name"] for m in c.get("/admin/models")] == ["kept"]
            assert mode(db) == 0o600
            assert not (tmp_path / "c.db-shm").exists()
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        conn.close()

    def test_a_symlink_at_the_database_is_refused(self, tmp_path: Path) -> None:
        """A symlink planted at the database path: one line, exit 1, its target untouched."""
        victim = tmp_path / "victim.txt"
        victim.write_text("precious\n")
        (tmp_path / "c.db").symlink_to(victim)
        args = ["controller", "--port", "0", "--database", f"sqlite:///{tmp_path / 'c.db'}"]
        out = subprocess.run(
            llmgw_argv(*args), capture_output=True, text=True, timeout=30, check=False
        )
        assert out.returncode == 1
        assert out.stderr.count("\n") == 1, out.stderr
        assert "is a symbolic link; refusing to follow it" in out.stderr
        assert victim.read_text() == "precious\n"


def spoil(db: Path, damage: str) -> None:
    """Damage the database so that it stays damaged. A transaction the controller's tick
    had open when the damage landed writes its pages back on commit, and that write can
    mend the file header (4 tries of 16 on a loaded machine; the test's POST then
    succeeded); so the damage is checked after any such transaction has had time to end,
    and done again if it was undone."""
    for _ in range(10):
        if damage == "truncated":
            os.truncate(db, 0)
        else:
            with db.open("r+b") as f:
                f.write(b"\xff" * 4096)
        time.sleep(0.5)
        head = db.read_bytes()[:16]
        if head == (b"" if damage == "truncated" else b"\xff" * 16):
            return
    raise AssertionError(f"the {damage} database was mended ten times over")


class TestDatabaseGoesBad:
    """A bad database makes writes 503 while the controller stays up."""

    @pytest.mark.parametrize("damage", ["truncated", "overwritten"])
    def test_writes_are_503_and_the_controller_stays(self, tmp_path: Path, damage: str) -> None:
        """The database truncated or overwritten under a running controller: every write is
        a 503 in the API's shape, reads and health still answer, and the process keeps
        running; the failed write and the failed reads that follow it are each logged
        once (the reads were logged at every request and tick), with no traceback."""
        db = tmp_path / "c.db"
        with controller(Db(f"sqlite:///{db}"), token=TOKEN, log_dir=tmp_path) as c:
            c.post("/admin/models", spec("before"))
            spoil(db, damage)
            for i in range(3):
                err = c.error("POST", "/admin/models", spec(f"after-{i}"))
                assert err.status == 503
                assert err.body["error"]["type"] == "server_error"
                # The first failed write (a tick's, or this one) makes the next ones read
                # the store again first, which fails as well.
                message = err.body["error"]["message"]
                assert "the store refused the change" in message or (
                    "the store must be read again first" in message
                )
            assert c.get("/healthz")["status"] == "ok"
            assert [m["name"] for m in c.get("/admin/models")] == ["before"]
            assert c.program.alive()
            log = c.program.log_text()
        assert log.count("store write failed") == 1
        assert log.count("store reload failed") == 1
        no_traceback(log)
