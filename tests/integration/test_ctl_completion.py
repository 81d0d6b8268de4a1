"""`llmgw ctl completion bash|zsh` in a real shell: the script parses and completes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def script(shell: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", "completion", shell],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout


def complete(tmp_path: Path, words: list[str]) -> list[str]:
    path = tmp_path / "c.bash"
    path.write_text(script("bash"))
    array = " ".join(f"'{w}'" for w in words)
    probe = (
        f"source {path}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; _llmgw_ctl; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.split("\n") if w]


def zsh_complete(tmp_path: Path, words: list[str]) -> list[str]:
    """Run the completion function as zsh's bashcompinit does (sh emulation: arrays
    from 0) and return its candidates; zsh itself then keeps those that match."""
    path = tmp_path / "c.zsh"
    path.write_text(script("zsh"))
    array = " ".join(f"'{w}'" for w in words)
    probe = (
        f"autoload -U compinit && compinit -u; source {path}; "
        f"t() {{ emulate -L sh; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; "
        '_llmgw_ctl; printf "%s\\n" "${COMPREPLY[@]}"; }; t'
    )
    done = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.split("\n") if w]


class TestCompletionScripts:
    """ctl's completion scripts load and complete in real shells."""

    def test_bash_script_parses_and_completes_commands_and_flags(self, tmp_path: Path) -> None:
        """The bash script parses and completes commands and flags."""
        path = tmp_path / "c.bash"
        path.write_text(script("bash"))
        check = subprocess.run(["bash", "-n", str(path)], capture_output=True, timeout=30)
        assert check.returncode == 0, check.stderr
        assert complete(tmp_path, ["llmgw", "ctl", "dr"]) == ["drain"]
        assert "--timeout" in complete(tmp_path, ["llmgw", "ctl", "drain", "--t"])
        assert complete(tmp_path, ["llmgw", "ctl", "-o", "json", "rep"]) == ["replicas"]

    @pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
    def test_zsh_script_loads_and_completes(self, tmp_path: Path) -> None:
        """The zsh script loads and completes."""
        path = tmp_path / "c.zsh"
        path.write_text(script("zsh"))
        done = subprocess.run(
            ["zsh", "-f", "-c", f"autoload -U compinit && compinit -u; source {path}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "drain" in zsh_complete(tmp_path, ["llmgw", "ctl", "dr"])
        assert "--timeout" in zsh_complete(tmp_path, ["llmgw", "ctl", "drain", "--t"])
        assert "replicas" in zsh_complete(tmp_path, ["llmgw", "ctl", "-o", "json", "rep"])
