"""`llmgw up` with the built-in fleet: every model answers; Ctrl-C leaves nothing behind."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.up.fleet import load_fleet
from tests.e2e.conftest import engine_pids, kill_leftovers, pid_alive, start_up, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """Where `up` runs; whatever still runs there when the test ends is killed."""
    try:
        yield tmp_path
    finally:
        kill_leftovers(tmp_path)


class TestDefaultFleet:
    """Every default model answers and Ctrl-C stops everything."""

    def test_every_default_model_answers_then_ctrl_c_stops_everything(self, workdir: Path) -> None:
        """Each default model answers streaming and not; SIGINT then leaves no process behind."""
        system = start_up(workdir, None)
        try:
            client = system.client()
            fleet = load_fleet(None)
            # The one model that fits only after an eviction (nothing is known idle
            # in a fresh system, so it would wait for its hold timeout) is left out.
            models = [m.name for m in fleet.models if m.name != "deepseek-coder-33b"]
            for name in models:
                r = client.chat.completions.create(
                    model=name,
                    messages=[{"role": "user", "content": "hello"}],
                    max_tokens=8,
                    timeout=180,
                )
                assert r.choices[0].message.content, name
                assert r.model == name
                chunks = client.chat.completions.create(
                    model=name,
                    messages=[{"role": "user", "content": "hello again"}],
                    max_tokens=8,
                    stream=True,
                    timeout=180,
                )
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert text, name
            status = system.ctl("status", "--json")
            assert status["nodes"]["total"] == 5
            assert status["replicas"]["ready"] >= len(models)
            pids = engine_pids(system) | {
                c["pid"] for c in system.manifest()["children"].values() if c["pid"]
            }
            assert len(pids) > 10
        finally:
            system.close_clients()
            system.prog.signal(signal.SIGINT)
            code = system.prog.proc.wait(timeout=90)
        assert code == 0, system.prog.log_tail()
        wait_for(
            lambda: not [p for p in pids if pid_alive(p)],
            timeout_s=30,
            what="every llmgw process to be gone after Ctrl-C",
        )
