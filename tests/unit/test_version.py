"""`--version` on `llmgw` and on every program prints one line and exits 0."""

from __future__ import annotations

import importlib

import pytest

from llmgw import __version__
from llmgw.cli import COMMANDS
from llmgw.cli import main as llmgw_main


class TestVersion:
    """Each program answers `--version` before it reads a config or binds a port."""

    def test_top_level(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`llmgw --version` prints the package's version."""
        assert llmgw_main(["--version"]) == 0
        assert capsys.readouterr().out == f"llmgw {__version__}\n"

    @pytest.mark.parametrize("command", sorted(COMMANDS))
    def test_every_program(self, command: str, capsys: pytest.CaptureFixture[str]) -> None:
        """`llmgw <program> --version` names the program and the version, exit 0."""
        module = importlib.import_module(COMMANDS[command][0])
        with pytest.raises(SystemExit) as exited:
            module.main(["--version"])
        assert exited.value.code == 0
        assert capsys.readouterr().out == f"llmgw {command} {__version__}\n"

    @pytest.mark.parametrize("command", ["router", "controller", "agent"])
    def test_short_flag(self, command: str, capsys: pytest.CaptureFixture[str]) -> None:
        """`-V` is the same flag; the router answers it without its required --config."""
        module = importlib.import_module(COMMANDS[command][0])
        with pytest.raises(SystemExit) as exited:
            module.main(["-V"])
        assert exited.value.code == 0
        assert capsys.readouterr().out.endswith(f" {__version__}\n")
