"""The README's walkthroughs, run from the README text itself on the default `up` fleet.

A fenced block right after `<!-- walkthrough: NAME ... -->` is a walkthrough: its
shell commands run one by one against a fresh `llmgw up`, with `localhost:8080`
replaced by the test's router and each `sleep N` by the fleet override's idle
timeout plus a margin (the README's idle timeouts are minutes long).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from tests.e2e.conftest import kill_leftovers, start_up, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

README = Path(__file__).resolve().parents[2] / "README.md"
DEFAULT_FLEET = Path(__file__).resolve().parents[2] / "src/llmgw/up/default_fleet.yaml"
MARK = re.compile(r"<!-- walkthrough: (\w+)[^>]*-->\s*```\w*\n(.*?)```", re.DOTALL)
IDLE_S = 4


def walkthroughs(text: str) -> dict[str, list[str]]:
    """Name → its commands (continuation lines joined; a trailing `# ...` is kept)."""
    out = {}
    for name, body in MARK.findall(text):
        joined = body.replace("\\\n", " ")
        lines = [ln.strip() for ln in joined.splitlines()]
        out[name] = [ln for ln in lines if ln]
    return out


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    try:
        yield tmp_path
    finally:
        kill_leftovers(tmp_path)


TRY = re.compile(r"<!-- try:[^>]*-->\s*```console\n(.*?)```", re.DOTALL)
PYTHON = re.compile(r"```python\n(import openai\n.*?)```", re.DOTALL)
STATUS = re.compile(r"The fleet at a glance[^\n]*\n\n```text\n(.*?)```", re.DOTALL)


def try_it(text: str) -> tuple[str, str, str, str]:
    """The "Try it" section: its curl command, the answer it shows, the openai snippet
    and the `ctl status` picture."""
    block = TRY.search(text)
    python = PYTHON.search(text)
    status = STATUS.search(text)
    assert block, "README's Try it block lost its <!-- try: --> marker"
    assert python, "README's openai snippet is gone"
    assert status, "README's ctl status picture is gone"
    command: list[str] = []
    shown: list[str] = []
    lines = block.group(1).splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            command.append(lines[i][2:])
            while command[-1].endswith("\\"):
                i += 1
                command.append(lines[i])
        else:
            shown.append(lines[i].strip())
        i += 1
    return "\n".join(command), "".join(shown), python.group(1), status.group(1)


class TestReadmeWalkthroughs:
    """The README's walkthroughs run as written."""

    def test_walkthroughs_are_marked(self) -> None:
        """The README has its walkthrough blocks (a renamed marker must not skip the test)."""
        found = walkthroughs(README.read_text())
        assert "eviction" in found
        assert any(c.startswith("sleep ") for c in found["eviction"])

    def test_eviction_walkthrough_as_written(self, workdir: Path) -> None:
        """Use gemma, wait past its idle timeout, ask for deepseek: it is served, gemma evicted."""
        fleet = msgspec.yaml.decode(DEFAULT_FLEET.read_bytes())
        for m in fleet["models"]:
            m["idle_timeout_s"] = IDLE_S
        fleet["router"] = {"report_interval_s": 0.5}
        path = workdir / "fleet.yaml"
        path.write_bytes(msgspec.yaml.encode(fleet))
        system = start_up(workdir, path)
        try:
            outputs = []
            for cmd in walkthroughs(README.read_text())["eviction"]:
                cmd = re.sub(r"\s+#.*$", "", cmd)
                if cmd.startswith("sleep "):
                    # Past gemma's idle timeout: here, until the controller knows it idle
                    # that long (gone from the list: it has acted on it already).
                    wait_for(
                        lambda: all(
                            r["idle_seconds"] >= IDLE_S for r in system.replicas("gemma-2-27b-it")
                        ),
                        timeout_s=60,
                        what=f"gemma known idle for {IDLE_S} s",
                    )
                    continue
                cmd = cmd.replace("localhost:8080", system.router_url.removeprefix("http://"))
                done = subprocess.run(
                    ["bash", "-c", cmd], capture_output=True, text=True, timeout=150, check=False
                )
                assert done.returncode == 0, (cmd, done.stderr)
                outputs.append(done.stdout)
            answers = [json.loads(o) for o in outputs]
            assert [a.get("model") for a in answers] == ["gemma-2-27b-it", "deepseek-coder-33b"], (
                outputs
            )
            events = system.ctl("events", "--json")
            told = [f"{e['kind']} {e['subject_id']}: {e['message']}" for e in events]
            assert any("evicted for deepseek-coder-33b" in e["message"] for e in events), told
        finally:
            system.stop()

    def test_drain_walkthrough_as_written(self, workdir: Path) -> None:
        """Each drain line exits as the README says (0 unless it says `# exits N`)."""
        system = start_up(workdir, None)
        env = {
            **os.environ,
            "LLMGW_CONTROLLER": system.controller_url,
            "LLMGW_TOKEN_FILE": str(system.token_file()),
        }
        try:
            for cmd in walkthroughs(README.read_text())["drain"]:
                expect = re.search(r"#\s*exits (\d+)", cmd)
                argv = shlex.split(re.sub(r"\s+#.*$", "", cmd))
                assert argv[0] == "llmgw", cmd
                done = subprocess.run(
                    [sys.executable, "-m", "llmgw", *argv[1:]],
                    capture_output=True,
                    text=True,
                    timeout=150,
                    check=False,
                    env=env,
                )
                assert done.returncode == (int(expect.group(1)) if expect else 0), (cmd, done)
                if argv[1:3] == ["ctl", "drain"] and not expect:
                    assert f"node {argv[3]} drained" in done.stdout, done.stdout
        finally:
            system.stop()

    def test_try_it_as_written(self, workdir: Path) -> None:
        """The curl answer has the shape the README shows, the openai snippet streams an
        answer (mistral scales from zero), and `ctl status` shows the README's fleet."""
        command, shown, snippet, picture = try_it(README.read_text())
        system = start_up(workdir, None)
        try:
            hostport = system.router_url.removeprefix("http://")
            done = subprocess.run(
                ["bash", "-c", command.replace("localhost:8080", hostport)],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            got, want = json.loads(done.stdout), json.loads(shown)
            assert set(got) == set(want), (got, want)
            assert (got["model"], got["object"]) == (want["model"], want["object"])
            assert set(got["usage"]) == set(want["usage"])
            # The choice and its message as printed, not only the top level.
            choice, shown_choice = got["choices"][0], want["choices"][0]
            assert set(choice) == set(shown_choice), (choice, shown_choice)
            assert set(choice["message"]) == set(shown_choice["message"]), choice
            assert 0 < got["usage"]["completion_tokens"] <= want["usage"]["completion_tokens"]
            code = snippet.replace("http://127.0.0.1:8080", system.router_url)
            assert code != snippet, "the snippet no longer names the router's address"
            ran = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                timeout=150,
                check=False,
            )
            assert ran.returncode == 0, ran.stderr
            assert ran.stdout.strip(), "the streamed answer was empty"
            status = subprocess.run(
                [sys.executable, "-m", "llmgw", "ctl", "--controller", system.controller_url,
                 "--token-file", str(system.token_file()), "status"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert status.returncode == 0, status.stderr
            out = [" ".join(ln.split()) for ln in status.stdout.splitlines()]
            # What the default fleet fixes: the nodes, the cards per class, the fabrics and
            # the number of models (how many replicas run depends on what was asked for).
            for line in picture.splitlines():
                words = " ".join(line.split())
                if words.startswith(("Nodes ", "ib0 ", "ib1 ")):
                    assert words in out, (words, status.stdout)
                if words.startswith(("H100-80G", "L40S-48G")):
                    name, total = words.split()[0], words.split()[-1]
                    assert any(o.startswith(name) and o.endswith(f" {total}") for o in out), (
                        words,
                        status.stdout,
                    )
                if words.startswith("Models "):
                    assert any(o.startswith(" ".join(words.split()[:3])) for o in out), (
                        words,
                        status.stdout,
                    )
        finally:
            system.stop()
