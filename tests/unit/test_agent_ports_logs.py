"""Port allocation from the range, and engine log rotation and tails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw.agent.engineprocs import PopenSpawner, SpawnError
from llmgw.agent.logfiles import needs_rotation, rotate, tail
from llmgw.agent.ports import NoFreePort, PortAllocator, parse_range


class TestPorts:
    """Engine port allocation from the configured range."""

    def test_skips_taken_and_busy(self) -> None:
        """Ports held by our shards or bound by anyone else are skipped."""
        busy = {21001}
        alloc = PortAllocator(21000, 21003, is_free=lambda p: p not in busy)
        assert alloc.allocate(taken={21000}) == 21002

    def test_does_not_reuse_at_once(self) -> None:
        """A port just freed is not handed out again before the others."""
        alloc = PortAllocator(21000, 21002, is_free=lambda p: True)
        assert alloc.allocate(taken=set()) == 21000
        assert alloc.allocate(taken=set()) == 21001
        assert alloc.allocate(taken=set()) == 21002
        assert alloc.allocate(taken=set()) == 21000

    def test_exhausted(self) -> None:
        """A full range is an error naming the range."""
        alloc = PortAllocator(21000, 21001, is_free=lambda p: True)
        with pytest.raises(NoFreePort, match="21000-21001"):
            alloc.allocate(taken={21000, 21001})

    @pytest.mark.parametrize(
        ("expected", "text"), [((21000, 21099), "21000-21099"), ((8000, 8000), "8000")]
    )
    def test_parse_range(self, expected: tuple[int, int], text: str) -> None:
        """LOW-HIGH is inclusive; a single port is a range of one."""
        assert expected == parse_range(text)

    @pytest.mark.parametrize("text", ["a-b", "2-1", "0-5", "1-70000"])
    def test_bad_range(self, text: str) -> None:
        """A malformed or inverted range is refused with the reason."""
        with pytest.raises(ValueError, match="port range"):
            parse_range(text)


class TestLogFiles:
    """Engine log rotation, file modes and tails."""

    def test_rotate_keeps_n(self, tmp_path: Path) -> None:
        """Rotation copies to .1, shifts older copies, drops beyond `keep`, and empties the log."""
        log = tmp_path / "e.log"
        for i in range(4):
            log.write_text(f"gen{i}\n")
            rotate(log, keep=2)
        assert log.read_text() == ""
        assert (tmp_path / "e.log.1").read_text() == "gen3\n"
        assert (tmp_path / "e.log.2").read_text() == "gen2\n"
        assert not (tmp_path / "e.log.3").exists()

    def test_a_rotated_copy_is_never_readable_by_others(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The copy is made 0600, not made under the umask and narrowed afterwards (in
        between, another local user could open it and keep reading)."""
        import stat

        import llmgw.agent.logfiles as logfiles

        log = tmp_path / "e.log"
        log.write_text("secret-ish engine output\n")
        log.chmod(0o600)
        monkeypatch.setattr(logfiles.os, "chmod", lambda *a, **k: None)
        old = os.umask(0o022)
        try:
            rotate(log, keep=1)
        finally:
            os.umask(old)
        assert stat.S_IMODE((tmp_path / "e.log.1").stat().st_mode) == 0o600
        assert (tmp_path / "e.log.1").read_text() == "secret-ish engine output\n"

    def test_a_symlink_at_the_log_is_not_followed(self, tmp_path: Path) -> None:
        """A link planted at an engine log's name fails the spawn by name; its target keeps
        its content and mode."""
        victim = tmp_path / "victim"
        victim.write_text("precious\n")
        victim.chmod(0o644)
        (tmp_path / "e.log").symlink_to(victim)
        with pytest.raises(SpawnError, match="is a symbolic link; refusing to follow it"):
            PopenSpawner().spawn(["true"], {}, tmp_path / "e.log")
        assert (victim.read_text(), victim.stat().st_mode & 0o777) == ("precious\n", 0o644)

    def test_needs_rotation(self, tmp_path: Path) -> None:
        """Only a file over the limit needs rotating; a missing one does not."""
        log = tmp_path / "e.log"
        assert not needs_rotation(log, max_bytes=10)
        log.write_text("x" * 11)
        assert needs_rotation(log, max_bytes=10)

    def test_tail(self, tmp_path: Path) -> None:
        """The tail is the last non-blank lines, each cut to a bound."""
        log = tmp_path / "e.log"
        log.write_text("a\n\nb\n" + "c" * 500 + "\n")
        assert tail(log, lines=2, max_line_chars=5) == ("b", "ccccc")
        assert tail(tmp_path / "missing") == ()

    def test_a_secret_cut_by_the_window_does_not_leak_its_end(self, tmp_path: Path) -> None:
        """The tail reads the last 64 KiB; a secret straddling the window's start is cut
        there, so its end no longer matches the mask: that partial line is dropped."""
        secret = "s3cret-value-0123456789abcdef"
        log = tmp_path / "e.log"
        window = 64 * 1024
        # The secret's first 10 characters fall before the window, the rest inside it.
        head = "x" * 100 + secret
        body = "y" * (window - (len(secret) - 10) - len("\nlast line\n"))
        log.write_text(head + body + "\nlast line\n")
        assert log.stat().st_size - window == 100 + 10
        got = tail(log, secrets=(secret,))
        assert got == ("last line",)
        assert not any(secret[10:20] in line for line in got)


class TestRotationBound:
    """A rotated copy holds at most `max_bytes`, however fast the engine wrote."""

    def test_a_copy_keeps_at_most_max_bytes_from_a_line_start(self, tmp_path: Path) -> None:
        """A log rotated far past its limit keeps only its newest `max_bytes`, from a line's
        start, and says how much was left out; an engine at 50 MB/s used to leave copies of
        a whole check interval (100 MB at the default 2 s for a 10 MiB limit)."""
        log = tmp_path / "e.log"
        log.write_bytes(b"".join(b"line %06d\n" % i for i in range(100_000)))  # 1.2 MB
        rotate(log, keep=1, max_bytes=1000)
        copy = (tmp_path / "e.log.1").read_bytes()
        marker, _, kept = copy.partition(b"\n")
        assert marker.startswith(b"--- llmgw agent: ")
        assert b"bytes left out" in marker
        assert len(kept) <= 1000
        assert kept.startswith(b"line ")
        assert kept.endswith(b"line 099999\n")
        assert log.read_bytes() == b""

    def test_a_copy_under_the_limit_is_whole(self, tmp_path: Path) -> None:
        """Under its limit a log is copied whole, with no marker."""
        log = tmp_path / "e.log"
        log.write_bytes(b"a\nb\n")
        rotate(log, keep=1, max_bytes=1000)
        assert (tmp_path / "e.log.1").read_bytes() == b"a\nb\n"

    def test_a_copy_of_one_endless_line_is_bounded(self, tmp_path: Path) -> None:
        """A line longer than the limit is cut to it, not kept whole."""
        log = tmp_path / "e.log"
        log.write_bytes(b"x" * 50_000)
        rotate(log, keep=1, max_bytes=1000)
        marker, _, kept = (tmp_path / "e.log.1").read_bytes().partition(b"\n")
        assert b"49000 bytes left out" in marker
        assert kept == b"x" * 1000


class TestTailOfLongLines:
    """A tail says something about an engine whose last output has no line break."""

    def test_the_tail_of_an_endless_line_is_its_end(self, tmp_path: Path) -> None:
        """An engine that died inside a line longer than the tail's window reports that
        line's end, not an empty tail."""
        log = tmp_path / "e.log"
        log.write_bytes(b"starting\n" + b"x" * 200_000 + b"RuntimeError: boom")
        got = tail(log, max_line_chars=40)
        assert len(got) == 1
        assert got[0].endswith("RuntimeError: boom")
        assert len(got[0]) <= 40

    def test_the_tail_after_a_progress_bar_is_its_last_state(self, tmp_path: Path) -> None:
        """A progress bar redrawn with carriage returns past the window still yields its
        last lines (the error after it), not an empty tail."""
        log = tmp_path / "e.log"
        log.write_bytes(b"loading\n" + b"\r 10%|#  |" * 10_000 + b"\rRuntimeError: boom\n")
        assert tail(log)[-1] == "RuntimeError: boom"

    def test_the_tail_of_an_endless_line_hides_a_cut_secret(self, tmp_path: Path) -> None:
        """A secret straddling the start of the window, in a line with no end, leaks no
        part of itself."""
        secret = "s3cret-value-0123456789abcdef"
        window = 64 * 1024
        log = tmp_path / "e.log"
        tail_part = secret[10:] + "y" * (window - len(secret) + 10)
        log.write_text("x" * 100 + secret[:10] + tail_part)
        assert log.stat().st_size - window == 110
        got = tail(log, secrets=(secret,), max_line_chars=window)
        assert got
        assert not any(secret[10:20] in line for line in got)

    def test_the_tail_of_garbage_is_text(self, tmp_path: Path) -> None:
        """Binary output and invalid UTF-8 come back as text, with replacement characters."""
        log = tmp_path / "e.log"
        log.write_bytes(b"\xff\xfe\x00\x1b[2J\xc3\n")
        (line,) = tail(log)
        assert line == "\ufffd\ufffd\x00\x1b[2J\ufffd"

    def test_the_tail_just_after_a_rotation_reads_the_copy(self, tmp_path: Path) -> None:
        """An engine that died just after its log was rotated has its last lines in `.1`:
        the tail reads them there, before the live file's few."""
        log = tmp_path / "e.log"
        (tmp_path / "e.log.1").write_text("older\nTraceback (most recent call last):\n")
        log.write_text("RuntimeError: boom\n")
        assert tail(log, lines=2) == ("Traceback (most recent call last):", "RuntimeError: boom")
