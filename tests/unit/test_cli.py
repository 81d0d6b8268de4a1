"""The thin dispatcher."""

from __future__ import annotations

import pytest

from llmgw import cli


class TestDispatch:
    """The llmgw dispatcher's help and its exit code for an unknown command."""

    def test_unknown_command_exits_2(self, capsys: pytest.CaptureFixture[str]) -> None:
        """An unknown subcommand prints usage and exits 2."""
        assert cli.main(["nope"]) == 2
        assert "unknown command" in capsys.readouterr().err

    def test_help_lists_every_command(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--help names every subcommand."""
        assert cli.main(["--help"]) == 0
        out = capsys.readouterr().out
        for name in cli.COMMANDS:
            assert name in out
