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
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from tests.e2e.conftest import kill_leftovers, start_up

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


def test_walkthroughs_are_marked() -> None:
    """The README has its walkthrough blocks (a renamed marker must not skip the test)."""
    found = walkthroughs(README.read_text())
    assert "eviction" in found
    assert any(c.startswith("sleep ") for c in found["eviction"])


def test_eviction_walkthrough_as_written(workdir: Path) -> None:
    """Use gemma once, wait past its idle timeout, ask for deepseek: it is served, gemma evicted."""
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
                time.sleep(IDLE_S + 3)
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
        assert any("evicted for deepseek-coder-33b" in e["message"] for e in events), events
    finally:
        system.prog.stop()


def test_drain_walkthrough_as_written(workdir: Path) -> None:
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
        system.prog.stop()
