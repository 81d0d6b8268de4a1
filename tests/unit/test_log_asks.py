"""Log asks: the controller's book, the reply's reading, ctl's follow overlap."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from llmgw.agent.replyread import read_reply
from llmgw.controller.logasks import LogAsks, NoAnswer, TooManyAsks
from llmgw.ctl.commands.logs import new_lines
from llmgw.wire.logs import LogAnswer


class TestLogAsksBook:
    """Asks wait per node until their node's heartbeat answers them."""

    def test_an_answer_from_its_node_wakes_the_request(self) -> None:
        """The pending ask goes out; the node's answer comes back to the asker."""

        async def scenario() -> LogAnswer:
            book = LogAsks()
            task = asyncio.create_task(book.ask("n1", replica_id="r1", rank=0, tail=5, timeout_s=5))
            await asyncio.sleep(0)
            (ask,) = book.pending("n1")
            assert book.pending("n2") == ()
            book.answered("n2", (LogAnswer(id=ask.id, outcome="found", lines=("x",)),))
            book.answered("n1", (LogAnswer(id=ask.id, outcome="found", lines=("ok",)),))
            assert book.pending("n1") == ()  # answered: not sent again
            got = await task
            assert book.pending("n1") == ()
            return got

        assert asyncio.run(scenario()).lines == ("ok",)

    def test_an_unanswered_ask_times_out_and_is_forgotten(self) -> None:
        """No answer in time: NoAnswer, and nothing left pending."""

        async def scenario() -> LogAsks:
            book = LogAsks()
            with pytest.raises(NoAnswer, match="no answer from the agent on node n1"):
                await book.ask("n1", replica_id="r1", rank=0, tail=5, timeout_s=0.01)
            return book

        assert asyncio.run(scenario()).pending("n1") == ()

    def test_too_many_asks_for_one_node_are_refused(self) -> None:
        """Past the per-node limit an ask is refused at once."""

        async def scenario() -> None:
            book = LogAsks(max_per_node=1)
            first = asyncio.create_task(
                book.ask("n1", replica_id="r1", rank=0, tail=5, timeout_s=5)
            )
            await asyncio.sleep(0)
            with pytest.raises(TooManyAsks):
                await book.ask("n1", replica_id="r1", rank=0, tail=5, timeout_s=5)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert book.pending("n1") == ()

        asyncio.run(scenario())


class TestReplyRead:
    """The agent reads the asks a reply carries."""

    def test_asks_are_read_and_a_bad_one_skipped(self) -> None:
        """A readable ask is kept; one it cannot read is dropped, the shards still read."""
        body = msgspec.json.encode(
            {
                "shards": [],
                "log_asks": [
                    {"id": "a", "replica_id": "r1", "rank": 0, "tail": 3},
                    {"id": "b", "replica_id": "r1", "rank": 0, "tail": 0},
                ],
            }
        )
        reply = read_reply(body)
        assert [a.id for a in reply.log_asks] == ["a"]

    def test_a_reply_without_asks_has_none(self) -> None:
        """An older controller's reply: no asks."""
        assert read_reply(b'{"shards": []}').log_asks == ()


class TestFollowOverlap:
    """`ctl logs --follow` prints what follows what it printed."""

    @pytest.mark.parametrize(
        ("printed", "tail", "expected"),
        [
            ([], ["a", "b"], (["a", "b"], False)),
            (["a", "b"], ["a", "b"], ([], False)),
            (["a", "b"], ["a", "b", "c"], (["c"], False)),
            # A larger tail than the one printed: older lines before, new after.
            (["b", "c"], ["z", "a", "b", "c", "d"], (["d"], False)),
            # More came than a tail holds, but it starts inside what was printed.
            (["a", "b", "c"], ["c", "d", "e"], (["d", "e"], False)),
            # Rotated: the tail starts with a copy's marker, inside what was printed.
            (["a", "b", "c", "d"], ["--- 9 bytes left out", "c", "d", "e"], (["e"], False)),
            # No overlap at all: everything is new, some may be missing.
            (["a", "b"], ["x", "y"], (["x", "y"], True)),
            (["a"], [], ([], False)),
        ],
    )
    def test_new_lines(
        self, printed: list[str], tail: list[str], expected: tuple[list[str], bool]
    ) -> None:
        """The lines after the overlap, and whether a gap is possible."""
        assert expected == new_lines(printed, tail)


class TestCtlLogsFlags:
    """`ctl logs` refuses a bad --tail as a bad command line."""

    @pytest.mark.parametrize("tail", ["0", "10001", "ten", "1.5"])
    def test_bad_tail_is_exit_2(self, tail: str, capsys: pytest.CaptureFixture[str]) -> None:
        """Out of 1..10000 or not a whole number: argparse's exit 2, the flag named."""
        from llmgw.ctl.main import build_parser

        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(["logs", "r1", "--tail", tail])
        assert exc.value.code == 2
        assert "--tail" in capsys.readouterr().err

    def test_defaults(self) -> None:
        """100 lines of rank 0, no follow."""
        from llmgw.ctl.main import build_parser

        args = build_parser().parse_args(["logs", "r1"])
        assert (args.replica, args.tail, args.rank, args.follow) == ("r1", 100, 0, False)
