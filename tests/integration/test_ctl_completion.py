"""`llmgw ctl completion bash|zsh` in a real shell: the script parses and completes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


def script(shell: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", "completion", shell],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout


def complete(tmp_path: Path, words: list[str], env: dict[str, str] | None = None) -> list[str]:
    path = tmp_path / "c.bash"
    path.write_text(script("bash"))
    array = " ".join(f"'{w}'" for w in words)
    probe = (
        f"source {path}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; _llmgw_ctl; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, timeout=30, env=env
    )
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.split("\n") if w]


def zsh_complete(tmp_path: Path, words: list[str], env: dict[str, str] | None = None) -> list[str]:
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
    done = subprocess.run(
        ["zsh", "-f", "-c", probe], capture_output=True, text=True, timeout=30, env=env
    )
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


def _node(name: str) -> dict[str, object]:
    return {
        "name": name, "address": "10.0.0.1", "state": "ready", "fabrics": [], "labels": {},
        "gpus": [], "gpus_used": [], "last_heartbeat": None, "classes": [], "gpu_total": 0,
        "gpu_free": 0, "unhealthy": [],
    }  # fmt: skip


@pytest.fixture
def hostile_env(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """A controller (or a squatter on its port) whose node names are shell code, and the
    environment in which completion asks it: `llmgw` on PATH, LLMGW_CONTROLLER set."""
    planted = tmp_path / "planted"
    names = [
        f"a$(touch${{IFS}}{planted})",
        f"b`touch${{IFS}}{planted}`",
        "c${IFS}",
        "*",
        "node-1",
    ]
    body = json.dumps([_node(n) for n in names]).encode()

    class Nodes(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Nodes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llmgw").write_text(f'#!/bin/sh\nexec {sys.executable} -m llmgw "$@"\n')
    (bin_dir / "llmgw").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "LLMGW_CONTROLLER": f"http://127.0.0.1:{server.server_address[1]}",
        "HOME": str(tmp_path),
    }
    try:
        yield env, planted
    finally:
        server.shutdown()
        server.server_close()


class TestCompletionOfFleetNames:
    """Names the controller sends are candidates, never shell code that completion runs."""

    def test_bash_runs_nothing_a_name_holds(
        self, tmp_path: Path, hostile_env: tuple[dict[str, str], Path]
    ) -> None:
        """A node name holding `$(…)` or backticks is offered as it is, and runs nothing."""
        env, planted = hostile_env
        got = complete(tmp_path, ["llmgw", "ctl", "drain", ""], env)
        assert not planted.exists()
        assert sorted(got) == sorted(
            ["*", "c${IFS}", "node-1", f"a$(touch${{IFS}}{planted})", f"b`touch${{IFS}}{planted}`"]
        )
        assert complete(tmp_path, ["llmgw", "ctl", "drain", "no"], env) == ["node-1"]

    @pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
    def test_zsh_runs_nothing_a_name_holds(
        self, tmp_path: Path, hostile_env: tuple[dict[str, str], Path]
    ) -> None:
        """zsh, through bashcompinit, runs nothing a node name holds either."""
        env, planted = hostile_env
        got = zsh_complete(tmp_path, ["llmgw", "ctl", "drain", "no"], env)
        assert not planted.exists()
        assert got == ["node-1"]
