"""ctl's own standard streams as a shell hands them over: a reader gone (`| head`), no
stdout at all (`>&-`), a full disk, an ASCII terminal. Never a traceback (ctl.streams)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing import Program, start_program
from llmgw.testing.procs import llmgw_argv

TOKEN = "streams-token"


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Program]:
    tmp = tmp_path_factory.mktemp("streams")
    args = ["controller", "--port", "0", "--database", f"sqlite:///{tmp}/c.db", "--token", TOKEN]
    prog = start_program(args, log_dir=tmp)
    try:
        yield prog
    finally:
        prog.stop()


def run_ctl(
    url: str, *argv: str, shell: str = "", stdout: Any = subprocess.PIPE, **env: str
) -> subprocess.CompletedProcess[bytes]:
    """`llmgw ctl ARGV` as a shell starts it, `shell` its redirections (`>&-`)."""
    command = [*llmgw_argv("ctl"), *argv]
    if shell:
        command = ["bash", "-c", f'exec "$@" {shell}', "bash", *command]
    child_env = {**os.environ, "LLMGW_CONTROLLER": url, "LLMGW_TOKEN": TOKEN, **env}
    child_env["XDG_CONFIG_HOME"] = "/nonexistent"
    return subprocess.run(
        command, stdout=stdout, stderr=subprocess.PIPE, timeout=30, env=child_env, check=False
    )


def key_names(url: str) -> list[str]:
    req = urllib.request.Request(url + "/admin/keys", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return [k["name"] for k in json.loads(resp.read())]


class TestStandardStreams:
    """Standard output that cannot be written is one line or a quiet 141, never a traceback."""

    def test_a_reader_gone_is_exit_141_and_silent(self, controller: Program) -> None:
        """`ctl events | head -1` once head has exited: exit 141 and nothing on stderr."""
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            r = run_ctl(controller.url, "events", "-o", "wide", stdout=write_end)
        finally:
            os.close(write_end)
        assert (r.returncode, r.stderr) == (141, b"")

    def test_no_stdout_does_nothing(self, controller: Program) -> None:
        """`ctl keys create … >&-` is refused in one line before the key is created: it
        would be shown once, to no one."""
        r = run_ctl(controller.url, "keys", "create", "k", "--team", "t", shell=">&-")
        said = b"llmgw ctl: standard output is closed; nothing was done\n"
        assert (r.returncode, r.stderr) == (1, said)
        assert key_names(controller.url) == []

    @pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
    def test_a_full_disk_is_one_line(self, controller: Program) -> None:
        """`ctl events >/dev/full` says the write failed, in one line, exit 1."""
        r = run_ctl(controller.url, "events", "-o", "json", shell=">/dev/full")
        said = b"llmgw ctl: cannot write to stdout: No space left on device\n"
        assert (r.returncode, r.stderr) == (1, said)

    def test_an_ascii_terminal_gets_escapes(self, controller: Program) -> None:
        """A stdout that cannot encode `·` gets `\\xb7`, exit 0."""
        r = run_ctl(controller.url, "status", PYTHONIOENCODING="ascii")
        assert (r.returncode, r.stderr) == (0, b"")
        assert b"\\xb7" in r.stdout
