"""The tail an operator reads (agent/logtail.py) and how the agent answers an ask."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmgw.agent import logasks, logtail
from llmgw.agent.logasks import answer
from llmgw.agent.logfiles import LogKeeper, rotate
from llmgw.agent.logtail import read_tail
from llmgw.wire.logs import LogAsk


def _log(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "r1-rank0.log"
    path.write_bytes(data)
    return path


class TestReadTail:
    """The last lines of a log and its rotated copies, read from the end."""

    def test_the_last_lines_oldest_first(self, tmp_path: Path) -> None:
        """The newest `lines` lines come back, oldest first, without their breaks."""
        path = _log(tmp_path, b"".join(b"line %d\n" % i for i in range(1000)))
        got = read_tail(path, lines=3)
        assert got.lines == ("line 997", "line 998", "line 999")
        assert (got.cut, got.last_open) == (False, False)

    def test_an_empty_file_has_no_lines(self, tmp_path: Path) -> None:
        """An engine that wrote nothing yet: no lines, nothing cut."""
        got = read_tail(_log(tmp_path, b""), lines=10)
        assert (got.lines, got.cut, got.last_open) == ((), False, False)

    def test_fewer_lines_than_asked_are_all_there(self, tmp_path: Path) -> None:
        """A short log comes back whole, its first line included."""
        assert read_tail(_log(tmp_path, b"a\nb\n"), lines=100).lines == ("a", "b")

    def test_a_partial_last_line_is_served_and_said_open(self, tmp_path: Path) -> None:
        """The line the engine is still writing is the last one, marked open."""
        got = read_tail(_log(tmp_path, b"a\nb\nhalf a li"), lines=2)
        assert got.lines == ("b", "half a li")
        assert got.last_open

    def test_blank_lines_are_kept(self, tmp_path: Path) -> None:
        """A raw log keeps its blank lines (unlike a failed shard's tail)."""
        assert read_tail(_log(tmp_path, b"a\n\nb\n"), lines=3).lines == ("a", "", "b")

    def test_reads_across_chunks(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Lines that straddle the read chunks come back whole."""
        monkeypatch.setattr(logtail, "CHUNK_BYTES", 7)
        path = _log(tmp_path, b"".join(b"line %d\n" % i for i in range(50)))
        assert read_tail(path, lines=4).lines == tuple(f"line {i}" for i in range(46, 50))

    def test_the_byte_cap_bounds_the_read(self, tmp_path: Path) -> None:
        """Past `max_bytes` the read stops: fewer lines, the cut one dropped, `cut` set."""
        path = _log(tmp_path, b"".join(b"%04d\n" % i for i in range(100)))
        got = read_tail(path, lines=50, max_bytes=23)
        assert got.lines == ("0096", "0097", "0098", "0099")
        assert got.cut

    def test_a_line_longer_than_the_cap_is_shown_by_its_end(self, tmp_path: Path) -> None:
        """One huge line: its last bytes after `…`, never an empty answer."""
        path = _log(tmp_path, b"start\n" + b"x" * 100_000 + b"END\n")
        got = read_tail(path, lines=5, max_bytes=1000)
        assert len(got.lines) == 1
        assert got.lines[0].startswith("…")
        assert got.lines[0].endswith("xEND")
        assert got.cut

    def test_non_utf8_bytes_are_replaced(self, tmp_path: Path) -> None:
        """Invalid UTF-8 becomes U+FFFD, the rest of the line stays."""
        got = read_tail(_log(tmp_path, b"ok \xff\xfe bytes\n\xe9t\xe9\n"), lines=2)
        assert got.lines == ("ok \ufffd\ufffd bytes", "\ufffdt\ufffd")

    def test_a_utf8_character_cut_by_a_chunk_is_whole(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Chunks are joined before decoding: a character across two is not replaced."""
        monkeypatch.setattr(logtail, "CHUNK_BYTES", 3)
        assert read_tail(_log(tmp_path, "héllo wörld\n".encode()), lines=1).lines == (
            "héllo wörld",
        )

    def test_a_rotation_has_no_seam(self, tmp_path: Path) -> None:
        """Just after a copy-truncate, the tail goes on into `.1` as if nothing happened."""
        path = _log(tmp_path, b"".join(b"old %d\n" % i for i in range(10)))
        rotate(path, keep=3)
        with path.open("ab") as f:
            f.write(b"new 0\nnew 1\n")
        got = read_tail(path, lines=4)
        assert got.lines == ("old 8", "old 9", "new 0", "new 1")

    def test_reads_through_several_copies(self, tmp_path: Path) -> None:
        """Older copies are read newest first until enough lines are in hand."""
        path = _log(tmp_path, b"a\n")
        rotate(path, keep=3)
        path.write_bytes(b"b\n")
        rotate(path, keep=3)
        path.write_bytes(b"c\n")
        assert read_tail(path, lines=10).lines == ("a", "b", "c")

    def test_a_copy_without_a_final_break_does_not_join_lines(self, tmp_path: Path) -> None:
        """A copy that ends inside a line ends it: the live file starts a new one."""
        path = _log(tmp_path, b"a\nunfinished")
        rotate(path, keep=1)
        path.write_bytes(b"next\n")
        assert read_tail(path, lines=3).lines == ("a", "unfinished", "next")

    def test_a_log_gone_with_its_copies_is_not_found(self, tmp_path: Path) -> None:
        """No file at all: FileNotFoundError (the agent answers `missing`)."""
        with pytest.raises(FileNotFoundError):
            read_tail(tmp_path / "gone-rank0.log")

    def test_secrets_are_masked(self, tmp_path: Path) -> None:
        """The engine's key and secret values become `***`."""
        got = read_tail(_log(tmp_path, b"key=sk-abc hf=hf_123\n"), secrets=("sk-abc", "hf_123"))
        assert got.lines == ("key=*** hf=***",)

    def test_a_secret_cut_by_the_cap_does_not_leak_its_end(self, tmp_path: Path) -> None:
        """The first, partial line is dropped: a secret's end alone matches no mask."""
        path = _log(tmp_path, b"token SECRETVALUE\nok\n")
        got = read_tail(path, lines=5, max_bytes=14, secrets=("SECRETVALUE",))
        assert got.lines == ("ok",)

    @pytest.mark.parametrize(("lines", "max_bytes"), [(0, 10), (1, 0)])
    def test_bad_bounds_are_refused(self, tmp_path: Path, lines: int, max_bytes: int) -> None:
        """Zero lines or bytes is a caller's bug: ValueError."""
        with pytest.raises(ValueError, match="at least 1"):
            read_tail(_log(tmp_path, b"a\n"), lines=lines, max_bytes=max_bytes)


class TestAnswer:
    """The agent's answer to one log ask."""

    def test_a_shard_it_never_ran_is_missing(self) -> None:
        """No log source: outcome missing, no lines."""
        ask = LogAsk(id="a1", replica_id="r9", rank=0, tail=5)
        got = asyncio.run(answer(ask, lambda rid, rank: None))
        assert (got.id, got.outcome, got.lines) == ("a1", "missing", ())

    def test_a_found_log_is_masked(self, tmp_path: Path) -> None:
        """The source's secrets are masked in the answer."""
        path = _log(tmp_path, b"hello\nkey=k123\n")
        ask = LogAsk(id="a2", replica_id="r1", rank=0, tail=5)
        got = asyncio.run(answer(ask, lambda rid, rank: (path, ("k123",))))
        assert (got.outcome, got.lines) == ("found", ("hello", "key=***"))

    def test_a_removed_file_is_missing(self, tmp_path: Path) -> None:
        """A source whose file was removed meanwhile answers missing, not an error."""
        ask = LogAsk(id="a3", replica_id="r1", rank=0, tail=5)
        got = asyncio.run(answer(ask, lambda rid, rank: (tmp_path / "x-rank0.log", ())))
        assert got.outcome == "missing"

    def test_an_unreadable_file_says_why(self, tmp_path: Path) -> None:
        """A folder where the log should be: unreadable, with the reason."""
        (tmp_path / "d-rank0.log").mkdir()
        ask = LogAsk(id="a4", replica_id="d", rank=0, tail=5)
        got = asyncio.run(answer(ask, lambda rid, rank: (tmp_path / "d-rank0.log", ())))
        assert got.outcome == "unreadable"
        assert "d-rank0.log" in got.error

    def test_an_unexpected_failure_is_an_answer(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A reader that fails some other way answers unreadable and logs the failure,
        instead of raising into the heartbeat that asked."""

        def broken(*_a: object, **_k: object) -> None:
            raise ValueError("a bug")

        monkeypatch.setattr(logasks, "read_tail", broken)
        path = _log(tmp_path, b"hello\n")
        ask = LogAsk(id="a5", replica_id="r1", rank=0, tail=5)
        got = asyncio.run(answer(ask, lambda rid, rank: (path, ())))
        assert (got.outcome, got.error) == ("unreadable", f"{path.name}: ValueError")
        assert "log ask failed" in caplog.text


class TestEndedLogsKept:
    """An ended shard's log stays readable, with its secrets, until it expires."""

    def test_kept_with_its_secrets_then_forgotten(self, tmp_path: Path) -> None:
        """`kept` names an ended log and its masks until newer ones push it out."""
        keeper = LogKeeper(max_bytes=1000, keep=1, ended_keep=1)
        first, second = tmp_path / "a-rank0.log", tmp_path / "b-rank0.log"
        keeper.ended(first, ("k1",))
        assert keeper.kept(first, also=("agent",)) == (first, ("k1", "agent"))
        keeper.ended(second, ("k2",))
        asyncio.run(keeper.tidy(()))
        assert keeper.kept(first, also=()) is None
        assert keeper.kept(second, also=()) == (second, ("k2",))
